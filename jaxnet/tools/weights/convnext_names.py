"""jaxnet ConvNeXt variable paths -> torchvision `convnext_*` state-dict names and layouts.

torchvision numbers the modules of one `features` sequence: the stem, then each stage
after its downsampling layer (features.1 is stage 1, features.2 the downsampling into
stage 2, features.3 stage 2, ...), and a `classifier` of LayerNorm, Flatten, Linear.

  jaxnet                        torchvision
  stem_conv, stem_norm          features.0.0, features.0.1
  downsampleS_norm, _conv       features.(2S-2).0, features.(2S-2).1
  stageS_blockB/dwconv          features.(2S-1).(B-1).block.0
  stageS_blockB/norm            features.(2S-1).(B-1).block.2
  stageS_blockB/fc1, fc2        features.(2S-1).(B-1).block.3, block.5
  stageS_blockB/layer_scale     features.(2S-1).(B-1).layer_scale
  head_norm, head               classifier.0, classifier.2

Leaves: `kernel` is `weight` ((H, W, in, out) -> (out, in, H, W) for the convolutions,
the depthwise one's (7, 7, 1, C) -> (C, 1, 7, 7); (in, out) -> (out, in) for the dense
layers); LayerNorm `scale` is `weight`; the layer scale, (C,) here, is (C, 1, 1) there.
"""

import re

from jaxnet.tools.weights import torch_names

Path = tuple[str, ...]

_FIXED = {"stem_conv": "features.0.0", "stem_norm": "features.0.1", "head_norm": "classifier.0",
          "head": "classifier.2"}
_IN_BLOCK = {"dwconv": "block.0", "norm": "block.2", "fc1": "block.3", "fc2": "block.5"}
_DOWNSAMPLE = re.compile(r"downsample(\d+)_(norm|conv)")
_BLOCK = re.compile(r"stage(\d+)_block(\d+)")


def _module_to_torch(module: str) -> str | None:
  if module in _FIXED:
    return _FIXED[module]
  m = _DOWNSAMPLE.fullmatch(module)
  if m:
    return f"features.{2 * int(m[1]) - 2}.{0 if m[2] == 'norm' else 1}"
  block, _, layer = module.partition("/")
  m = _BLOCK.fullmatch(block)
  if m and layer in _IN_BLOCK:
    return f"features.{2 * int(m[1]) - 1}.{int(m[2]) - 1}.{_IN_BLOCK[layer]}"
  return None


def _is_norm(module: str) -> bool:
  return module.endswith("norm")


def torch_name(path: Path) -> str | None:
  """The torchvision name of a jaxnet ConvNeXt variable path, or None if it has none."""
  if len(path) == 3 and path[0] == "params" and path[2] == "layer_scale":
    m = _BLOCK.fullmatch(path[1])
    return f"features.{2 * int(m[1]) - 1}.{int(m[2]) - 1}.layer_scale" if m else None
  return torch_names.params_name(
      path, _module_to_torch,
      lambda module: torch_names.NORM_LEAVES if _is_norm(module) else torch_names.LINEAR_LEAVES)


def layout(path: Path, shape: tuple[int, ...]) -> torch_names.Layout | None:
  if path[-1] == "layer_scale":  # torchvision broadcasts it over NCHW as (C, 1, 1)
    return torch_names.Layout(tuple(shape), tuple(shape), (0,), tuple(shape) + (1, 1))
  return torch_names.kernel_layout(path, shape)


FAMILY = torch_names.Family("torchvision", "torchvision ConvNeXt", torch_name, layout)
