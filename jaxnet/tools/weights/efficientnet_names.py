"""jaxnet EfficientNet (B0-B7 and V2) variable paths -> torchvision `efficientnet_*` state-dict
names and layouts.

torchvision numbers one `features` sequence: the stem, one entry per stage, the last 1x1
convolution; each convolution-BN pair is a sequence of (conv, BN[, SiLU]); a block's
layers are `block.0`, `block.1`, ... in order. jaxnet names a block's layers by role and
that same place (jaxnet/core/models/efficientnet.py), so the map needs no model config:

  jaxnet                                torchvision
  stem/conv, stem/bn                    features.0.0, features.0.1
  stageS_blockB/<role>I/conv, bn        features.S.(B-1).block.I.0, .1
  stageS_blockB/seI/fc1, fc2            features.S.(B-1).block.I.fc1, .fc2
  stageN_head/conv, bn                  features.N.0, features.N.1
  head                                  classifier.1

timm's `efficientnet_b0` ... `efficientnet_b7` name the same tensors by module and role.
A block is timm's depthwise-separable one where it has no expansion (jaxnet's depthwise0,
se1, project2; B0-B7's first stage), else an inverted residual (expand0, depthwise1, se2,
project3):

  jaxnet                                timm
  stem/conv, stem/bn                    conv_stem, bn1
  stageS_blockB/depthwise0, project2    blocks.(S-1).(B-1).conv_dw, bn1; conv_pw, bn2
  stageS_blockB/expand0, depthwise1,    blocks.(S-1).(B-1).conv_pw, bn1; conv_dw, bn2;
                project3                                   conv_pwl, bn3
  stageS_blockB/seI/fc1, fc2            blocks.(S-1).(B-1).se.conv_reduce, se.conv_expand
  stageN_head/conv, bn                  conv_head, bn2
  head                                  classifier

The names and shapes are timm's for B0-B7, but timm's B5-B7 normalise with BN eps 1e-5
where torchvision's, and jaxnet's, use 1e-3 (set model.bn_epsilon=1e-5 for timm's), and
timm's `tf_efficientnet_*` (the same names) pad as TensorFlow does: other networks. The V2s'
fused blocks have no timm names here (timm's name a fused block by whether it expands,
which its path does not say); exporting a V2 under timm's names is an error that lists them.

Leaves: `kernel` is `weight` ((H, W, in, out) -> (out, in, H, W); a depthwise kernel's
(k, k, 1, C) is (C, 1, k, k); the classifier's (in, out) is (out, in)); BN `scale`,
`bias`, `mean`, `var` are `weight`, `bias`, `running_mean`, `running_var`. BN's
`num_batches_tracked` counter is dropped on the way in and written as 0 on the way out.
"""

import re
from typing import Callable

from jaxnet.tools.weights import torch_names
from jaxnet.tools.weights.resnet_names import _bn_counter

Path = tuple[str, ...]

_BN_LEAVES = {("params", "scale"): "weight", ("params", "bias"): "bias",
              ("batch_stats", "mean"): "running_mean", ("batch_stats", "var"): "running_var"}
_PARAM_LEAVES = {("params", "kernel"): "weight", ("params", "bias"): "bias"}
_IN_PAIR = {"conv": "0", "bn": "1", "fc1": "fc1", "fc2": "fc2"}
_BLOCK_LAYER = re.compile(r"stage(\d+)_block(\d+)/[a-z]+(\d+)")
_HEAD_CONV = re.compile(r"stage(\d+)_head")


def _module_to_torch(module: str) -> str | None:
  if module == "head":
    return "classifier.1"
  outer, _, inner = module.rpartition("/")
  if inner not in _IN_PAIR:
    return None
  if outer == "stem":
    prefix = "features.0"
  elif (m := _HEAD_CONV.fullmatch(outer)):
    prefix = f"features.{m[1]}"
  elif (m := _BLOCK_LAYER.fullmatch(outer)):
    prefix = f"features.{m[1]}.{int(m[2]) - 1}.block.{m[3]}"
  else:
    return None
  return f"{prefix}.{_IN_PAIR[inner]}"


# A block's layer (role and place) -> timm's names of its (convolution, BN).
_TIMM_IN_BLOCK = {"depthwise0": ("conv_dw", "bn1"), "project2": ("conv_pw", "bn2"),  # no expansion
                  "expand0": ("conv_pw", "bn1"), "depthwise1": ("conv_dw", "bn2"), "project3": ("conv_pwl", "bn3")}
_TIMM_SE = {"fc1": "se.conv_reduce", "fc2": "se.conv_expand"}
_TIMM_FIXED = {"head": "classifier", "stem/conv": "conv_stem", "stem/bn": "bn1"}
_BLOCK_ROLE = re.compile(r"stage(\d+)_block(\d+)/([a-z]+\d+)")


def _module_to_timm(module: str) -> str | None:
  if module in _TIMM_FIXED:
    return _TIMM_FIXED[module]
  outer, _, inner = module.rpartition("/")
  if _HEAD_CONV.fullmatch(outer):
    return {"conv": "conv_head", "bn": "bn2"}.get(inner)
  m = _BLOCK_ROLE.fullmatch(outer)
  if not m:
    return None
  block = f"blocks.{int(m[1]) - 1}.{int(m[2]) - 1}"
  if m[3].startswith("se"):
    return f"{block}.{_TIMM_SE[inner]}" if inner in _TIMM_SE else None
  conv_bn = _TIMM_IN_BLOCK.get(m[3])
  return f"{block}.{conv_bn[inner == 'bn']}" if conv_bn and inner in ("conv", "bn") else None


def _name(path: Path, module_name: Callable[[str], str | None]) -> str | None:
  """`module_name(module)` and the leaf's name: the name of a jaxnet EfficientNet variable."""
  collection, *module, leaf = path
  module = "/".join(module)
  torch_module = module_name(module)
  leaves = _BN_LEAVES if module.endswith("/bn") else _PARAM_LEAVES
  torch_leaf = leaves.get((collection, leaf))
  return f"{torch_module}.{torch_leaf}" if torch_module and torch_leaf else None


def torch_name(path: Path) -> str | None:
  """The torchvision name of a jaxnet EfficientNet variable path, or None if it has none."""
  return _name(path, _module_to_torch)


def timm_name(path: Path) -> str | None:
  """The timm name of a jaxnet EfficientNet (B0-B7) variable path, or None if it has none."""
  return _name(path, _module_to_timm)


# Only kernels change layout.
FAMILY = torch_names.Family("torchvision", "torchvision EfficientNet", torch_name, extras=_bn_counter)
TIMM = torch_names.Family("timm", "timm EfficientNet", timm_name, extras=_bn_counter)
# The namings a file may use, the first the one exports write unless asked for another.
NAMINGS = (FAMILY, TIMM)
