"""ResNet-50 on ImageNet: jaxnet/configs/resnet.py at depth 50 (its docstring has both recipes).

  jaxnet train --config=resnet50 --workdir=$WORKDIR --config.data.dir=$TFDS_DATA_DIR
  jaxnet train --config=resnet50:fast ...   # LARS, batch 2048, progressive resizing,
      # per-GPU batch norm, reading `jaxnet prepare`'s shards in data.dir

Meant for: one server with 8 GPUs (A100/H100 class), as jaxnet/configs/resnet.py.
Expect: ~76.5-77% top-1 after 90 epochs (standard), 75.9% in ~40 epochs (fast); published
results, not yet measured by jaxnet.

The step's levers (issue 52), each exact (the same function, and here the same gradient bit
for bit), on by default in jaxnet/configs/resnet.py. What they are predicted to do, from the
step compiled for one H200 at 256 images on a CPU (`python -m jaxnet.cli.gpu_plan
--config=resnet50 --target=h200 --gpus=1 --config.batch_size=256`, 2026-11-29, jax 0.10.2; not
measured on a GPU):
- model.scatter_free_pool: the max pool's gradient without select-and-scatter: its scatter
  and reduce-window kernels go (1,070 -> 1,068 kernels per step), 2.8 GiB less HBM traffic per
  step (96.2 -> 93.4 GiB), roofline bound 10,847 -> 11,147 img/s.
"""

import os

from jaxnet.core.config import from_file


def get_config(arg: str = ""):
  recipe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resnet.py")
  return from_file(f"{recipe}:{arg or 'standard'}")
