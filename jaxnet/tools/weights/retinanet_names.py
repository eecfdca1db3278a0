"""jaxnet RetinaNet variable paths -> torchvision `retinanet_resnet50_fpn` (v1) state-dict names.

  jaxnet module      torchvision module
  backbone/...       backbone.body.... (the ResNet's own names, resnet_names)
  fpn_innerI         backbone.fpn.inner_blocks.I.0      I = 0, 1, 2 for C3, C4, C5
  fpn_layerI         backbone.fpn.layer_blocks.I.0
  p6, p7             backbone.fpn.extra_blocks.p6, .p7
  cls_convK          head.classification_head.conv.K.0
  cls_logits         head.classification_head.cls_logits
  box_convK          head.regression_head.conv.K.0
  box_reg            head.regression_head.bbox_reg

The heads' output channels are ordered (anchor, class) and (anchor, coordinate) on both
sides, so only kernels change layout, as for the ResNets.
"""

import re

from jaxnet.tools.weights import resnet_names, torch_names

Path = tuple[str, ...]

_FIXED = {"p6": "backbone.fpn.extra_blocks.p6", "p7": "backbone.fpn.extra_blocks.p7",
          "cls_logits": "head.classification_head.cls_logits", "box_reg": "head.regression_head.bbox_reg"}
_NUMBERED = ((re.compile(r"fpn_inner(\d+)"), "backbone.fpn.inner_blocks.{}.0"),
             (re.compile(r"fpn_layer(\d+)"), "backbone.fpn.layer_blocks.{}.0"),
             (re.compile(r"cls_conv(\d+)"), "head.classification_head.conv.{}.0"),
             (re.compile(r"box_conv(\d+)"), "head.regression_head.conv.{}.0"))


def _module_to_torch(module: str) -> str | None:
  if module in _FIXED:
    return _FIXED[module]
  for pattern, name in _NUMBERED:
    m = pattern.fullmatch(module)
    if m:
      return name.format(int(m.group(1)))
  return None


def torch_name(path: Path) -> str | None:
  """The torchvision name of a jaxnet RetinaNet variable path, or None if it has none."""
  if len(path) > 2 and path[1] == "backbone":
    name = resnet_names.torch_name(path[:1] + path[2:])
    return f"backbone.body.{name}" if name else None
  return torch_names.params_name(path, _module_to_torch, lambda module: torch_names.LINEAR_LEAVES)


FAMILY = torch_names.Family("torchvision", "torchvision RetinaNet", torch_name,
                            extras=resnet_names.FAMILY.extras, class_layer=("cls_logits", 9),
                            backbone=("backbone", "resnet"))
