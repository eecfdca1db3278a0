"""jaxnet ResNet variables <-> torchvision ResNet state-dict tensors.

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

from jaxnet.weights import torch_names

Path = tuple[str, ...]

_FIXED = {"stem_conv": "conv1", "stem_bn": "bn1", "head": "fc"}
_BLOCK = re.compile(r"stage(\d+)_block(\d+)/(Conv_\d+|BatchNorm_\d+|proj_conv|proj_bn)")
_TORCH_BLOCK = re.compile(r"layer(\d+)\.(\d+)\.(conv\d+|bn\d+|downsample\.[01])")
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


def _module_from_torch(module: str) -> str | None:
  inverse = {v: k for k, v in _FIXED.items()}
  if module in inverse:
    return inverse[module]
  m = _TORCH_BLOCK.fullmatch(module)
  if not m:
    return None
  stage, block, layer = m.groups()
  if layer.startswith("downsample"):
    name = "proj_conv" if layer.endswith("0") else "proj_bn"
  else:
    kind, index = ("Conv", layer[4:]) if layer.startswith("conv") else ("BatchNorm", layer[2:])
    if int(index) < 1:
      return None
    name = f"{kind}_{int(index) - 1}"
  return f"stage{stage}_block{int(block) + 1}/{name}"


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


def jaxnet_path(name: str) -> Path | None:
  """The jaxnet variable path of a torchvision tensor name, or None if it has none."""
  torch_module, _, torch_leaf = name.rpartition(".")
  module = _module_from_torch(torch_module)
  if module is None:
    return None
  leaves = _BN_LEAVES if _is_bn(module) else _PARAM_LEAVES
  for (collection, leaf), candidate in leaves.items():
    if candidate == torch_leaf:
      return (collection, *module.split("/"), leaf)
  return None


# Only kernels change layout.
to_torch_layout, from_torch_layout = torch_names.to_torch_layout, torch_names.from_torch_layout


NAMES = "torchvision"


def to_torch(variables: dict[Path, np.ndarray]) -> dict[str, np.ndarray]:
  """Flat jaxnet ResNet variables -> a torchvision state dict (C-contiguous numpy arrays)."""
  out = torch_names.to_torch(variables, torch_name, to_torch_layout, "torchvision ResNet")
  for name in [n for n in out if n.endswith(".running_var")]:  # BN's counter, which torch expects
    out[name[:-len("running_var")] + "num_batches_tracked"] = np.zeros((), np.int64)
  return out


def from_torch(tensors: dict[str, np.ndarray]) -> tuple[dict[Path, np.ndarray], list[str]]:
  """A torchvision state dict -> (flat jaxnet variables, names that map to no jaxnet variable).

  Floating tensors come back as float32 (half-precision files included).
  """
  # BN's counter has no jaxnet counterpart.
  dropped = lambda name: (name.endswith(".num_batches_tracked")
                          and jaxnet_path(name[:-19] + "running_var") is not None)
  return torch_names.from_torch(tensors, jaxnet_path, from_torch_layout, dropped)
