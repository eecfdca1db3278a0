"""ResNet-50 on ImageNet: jaxnet/configs/resnet.py at depth 50 (its docstring has both recipes).

  jaxnet train --config=resnet50 --workdir=$WORKDIR --config.data.dir=$TFDS_DATA_DIR
  jaxnet train --config=resnet50:fast ...   # LARS, batch 2048, progressive resizing

Meant for: one server with 8 GPUs (A100/H100 class), as jaxnet/configs/resnet.py.
Expect: ~76.5-77% top-1 after 90 epochs (standard), 75.9% in ~40 epochs (fast); published
results, not yet measured by jaxnet.
"""

import os

from jaxnet.core.config import from_file


def get_config(arg: str = ""):
  recipe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resnet.py")
  return from_file(f"{recipe}:{arg or 'standard'}")
