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

Leaves: `kernel` is `weight` ((H, W, in, out) -> (out, in, H, W); a depthwise kernel's
(k, k, 1, C) is (C, 1, k, k); the classifier's (in, out) is (out, in)); BN `scale`,
`bias`, `mean`, `var` are `weight`, `bias`, `running_mean`, `running_var`. BN's
`num_batches_tracked` counter is dropped on the way in and written as 0 on the way out.
"""

import re

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


def torch_name(path: Path) -> str | None:
  """The torchvision name of a jaxnet EfficientNet variable path, or None if it has none."""
  collection, *module, leaf = path
  module = "/".join(module)
  torch_module = _module_to_torch(module)
  leaves = _BN_LEAVES if module.endswith("/bn") else _PARAM_LEAVES
  torch_leaf = leaves.get((collection, leaf))
  return f"{torch_module}.{torch_leaf}" if torch_module and torch_leaf else None


# Only kernels change layout.
FAMILY = torch_names.Family("torchvision", "torchvision EfficientNet", torch_name, extras=_bn_counter)
