"""ResNet-101 on ImageNet: the ResNet-50 recipes (configs/resnet50.py) with another depth.

  python -m jaxnet.main --config=configs/resnet101.py --workdir=$WORKDIR --config.data.dir=$TFDS_DATA_DIR
  (append :fast to the config path for the LARS / progressive-resizing recipe)

Meant for: one server with 8 GPUs, as configs/resnet50.py.
Expect: published 90-epoch top-1 for this depth (ResNet-18 ~71%, ResNet-101 ~78.5%,
ResNet-152 ~79%); not yet measured by jaxnet.
"""

import os

from jaxnet.config_io import from_file


def get_config(variant: str = "standard"):
  c = from_file(os.path.join(os.path.dirname(__file__), "resnet50.py") + ":" + variant)
  c.model.name = "resnet101"
  return c
