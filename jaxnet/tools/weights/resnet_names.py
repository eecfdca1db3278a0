"""jaxnet ResNet variable paths -> torchvision ResNet state-dict names (torch_names derives
the way back).

timm's plain ResNets (resnet18 ... resnet152 and their `tv_in1k`, `a1_in1k`, ...
weights) use torchvision's names too. A jaxnet path is a tuple such as
("params", "stage2_block1", "Conv_1", "kernel"); its torchvision name is
"layer2.0.conv2.weight".

  jaxnet module               torchvision module
  stem_conv, stem_bn          conv1, bn1
  stageS_blockB/Conv_i        layerS.(B-1).conv(i+1)
  stageS_blockB/BatchNorm_i   layerS.(B-1).bn(i+1)
  stageS_blockB/proj_conv     layerS.(B-1).downsample.0
  stageS_blockB/proj_bn       layerS.(B-1).downsample.1
  head                        fc

Leaves: a conv `kernel` (H, W, in, out) is `weight` (out, in, H, W); the head's
`kernel` (in, out) is `fc.weight` (out, in); BN `scale`, `bias`, `mean`, `var`
are `weight`, `bias`, `running_mean`, `running_var`. BN's `num_batches_tracked`
counter has no jaxnet counterpart: it is dropped on the way in and written as 0
on the way out (torch reads it only when a BN's momentum is None).
"""

import re

import numpy as np

from jaxnet.tools.weights import torch_names

Path = tuple[str, ...]

_FIXED = {"stem_conv": "conv1", "stem_bn": "bn1", "head": "fc"}
_BLOCK = re.compile(r"stage(\d+)_block(\d+)/(Conv_\d+|BatchNorm_\d+|proj_conv|proj_bn)")
_BN_LEAVES = {("params", "scale"): "weight", ("params", "bias"): "bias",
              ("batch_stats", "mean"): "running_mean", ("batch_stats", "var"): "running_var"}
_PARAM_LEAVES = {("params", "kernel"): "weight", ("params", "bias"): "bias"}


def _module_to_torch(module: str) -> str | None:
  if module in _FIXED:
    return _FIXED[module]
  m = _BLOCK.fullmatch(module)
  if not m:
    return None
  stage, block, layer = m.groups()
  if layer.startswith("proj"):
    layer = "downsample.0" if layer == "proj_conv" else "downsample.1"
  else:
    kind, index = layer.split("_")
    layer = f"{'conv' if kind == 'Conv' else 'bn'}{int(index) + 1}"
  return f"layer{stage}.{int(block) - 1}.{layer}"


def _is_bn(module: str) -> bool:
  return module == "stem_bn" or module.endswith("proj_bn") or "/BatchNorm_" in module


def torch_name(path: Path) -> str | None:
  """The torchvision name of a jaxnet variable path, or None if it has none."""
  collection, *module, leaf = path
  module = "/".join(module)
  torch_module = _module_to_torch(module)
  leaves = _BN_LEAVES if _is_bn(module) else _PARAM_LEAVES
  torch_leaf = leaves.get((collection, leaf))
  return f"{torch_module}.{torch_leaf}" if torch_module and torch_leaf else None


def _bn_counter(name: str) -> dict[str, np.ndarray]:
  """BN's counter, which torch expects beside each running_var."""
  if not name.endswith(".running_var"):
    return {}
  return {name[:-len("running_var")] + "num_batches_tracked": np.zeros((), np.int64)}


# Only kernels change layout.
FAMILY = torch_names.Family("torchvision", "torchvision ResNet", torch_name, extras=_bn_counter)
