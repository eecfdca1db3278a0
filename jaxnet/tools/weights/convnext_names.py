"""jaxnet ConvNeXt variable paths -> torchvision's and timm's `convnext_*` state-dict names and
layouts: two namings of one network (timm's `convnext_tiny/small/base/large` compute what
torchvision's do: the same layers, LayerNorm eps 1e-6, exact GELU, the head's norm after the
pooling).

torchvision numbers the modules of one `features` sequence: the stem, then each stage
after its downsampling layer (features.1 is stage 1, features.2 the downsampling into
stage 2, features.3 stage 2, ...), and a `classifier` of LayerNorm, Flatten, Linear.
timm names the stem, the stages (each with its downsampling layer) and the head.

  jaxnet                        torchvision                      timm
  stem_conv, stem_norm          features.0.0, features.0.1       stem.0, stem.1
  downsampleS_norm, _conv       features.(2S-2).0, .1            stages.(S-1).downsample.0, .1
  stageS_blockB/dwconv          features.(2S-1).(B-1).block.0    stages.(S-1).blocks.(B-1).conv_dw
  stageS_blockB/norm            features.(2S-1).(B-1).block.2    ... .norm
  stageS_blockB/fc1, fc2        ... .block.3, .block.5           ... .mlp.fc1, .mlp.fc2
  stageS_blockB/layer_scale     features.(2S-1).(B-1).layer_scale  ... .gamma
  head_norm, head               classifier.0, classifier.2       head.norm, head.fc

Leaves: `kernel` is `weight` ((H, W, in, out) -> (out, in, H, W) for the convolutions,
the depthwise one's (7, 7, 1, C) -> (C, 1, 7, 7); (in, out) -> (out, in) for the dense
layers); LayerNorm `scale` is `weight`; the layer scale, (C,) here and in timm, is
(C, 1, 1) in torchvision.
"""

import dataclasses
import re
from typing import Callable

from jaxnet.tools.weights import torch_names

Path = tuple[str, ...]

_DOWNSAMPLE = re.compile(r"downsample(\d+)_(norm|conv)")
_BLOCK = re.compile(r"stage(\d+)_block(\d+)")


@dataclasses.dataclass(frozen=True)
class _Naming:
  """Where one naming puts jaxnet's ConvNeXt modules (stages and blocks counted from 1)."""
  fixed: dict[str, str]                   # stem_conv, stem_norm, head_norm, head
  downsample: Callable[[int], str]        # stage -> its downsampling sequence (norm .0, conv .1)
  block: Callable[[int, int], str]        # (stage, block) -> the block's prefix
  in_block: dict[str, str]                # a block's layer -> its name in the block
  layer_scale: str                        # the block's layer scale's name in the block


_TORCHVISION = _Naming(
    {"stem_conv": "features.0.0", "stem_norm": "features.0.1", "head_norm": "classifier.0",
     "head": "classifier.2"},
    lambda stage: f"features.{2 * stage - 2}",
    lambda stage, block: f"features.{2 * stage - 1}.{block - 1}",
    {"dwconv": "block.0", "norm": "block.2", "fc1": "block.3", "fc2": "block.5"}, "layer_scale")

_TIMM = _Naming(
    {"stem_conv": "stem.0", "stem_norm": "stem.1", "head_norm": "head.norm", "head": "head.fc"},
    lambda stage: f"stages.{stage - 1}.downsample",
    lambda stage, block: f"stages.{stage - 1}.blocks.{block - 1}",
    {"dwconv": "conv_dw", "norm": "norm", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}, "gamma")


def _module_name(naming: _Naming, module: str) -> str | None:
  if module in naming.fixed:
    return naming.fixed[module]
  if (m := _DOWNSAMPLE.fullmatch(module)):
    return f"{naming.downsample(int(m[1]))}.{0 if m[2] == 'norm' else 1}"
  block, _, layer = module.partition("/")
  m = _BLOCK.fullmatch(block)
  if m and layer in naming.in_block:
    return f"{naming.block(int(m[1]), int(m[2]))}.{naming.in_block[layer]}"
  return None


def _is_norm(module: str) -> bool:
  return module.endswith("norm")


def _name_in(naming: _Naming, path: Path) -> str | None:
  """The name `naming` gives a jaxnet ConvNeXt variable path, or None if it has none."""
  if len(path) == 3 and path[0] == "params" and path[2] == "layer_scale":
    m = _BLOCK.fullmatch(path[1])
    return f"{naming.block(int(m[1]), int(m[2]))}.{naming.layer_scale}" if m else None
  return torch_names.params_name(
      path, lambda module: _module_name(naming, module),
      lambda module: torch_names.NORM_LEAVES if _is_norm(module) else torch_names.LINEAR_LEAVES)


def torch_name(path: Path) -> str | None:
  """The torchvision name of a jaxnet ConvNeXt variable path, or None if it has none."""
  return _name_in(_TORCHVISION, path)


def timm_name(path: Path) -> str | None:
  """The timm name of a jaxnet ConvNeXt variable path, or None if it has none."""
  return _name_in(_TIMM, path)


def layout(path: Path, shape: tuple[int, ...]) -> torch_names.Layout | None:
  if path[-1] == "layer_scale":  # torchvision broadcasts it over NCHW as (C, 1, 1)
    return torch_names.Layout(tuple(shape), tuple(shape), (0,), tuple(shape) + (1, 1))
  return torch_names.kernel_layout(path, shape)


FAMILY = torch_names.Family("torchvision", "torchvision ConvNeXt", torch_name, layout)
TIMM = torch_names.Family("timm", "timm ConvNeXt", timm_name)  # timm's gamma is (C,): kernels only
# The namings a file may use, the first the one exports write unless asked for another.
NAMINGS = (FAMILY, TIMM)
