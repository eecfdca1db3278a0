"""jaxnet FCN and DeepLabV3 variable paths -> torchvision `fcn_resnetN` / `deeplabv3_resnetN`
state-dict names (models/segmentation.py).

  jaxnet module                  torchvision module
  backbone/...                   backbone.... (the ResNet's own names, resnet_names)
  fcn_head/conv, fcn_head/bn     classifier.0, classifier.1            (FCNHead)
  aux_head/conv, aux_head/bn     aux_classifier.0, aux_classifier.1    (FCNHead)
  deeplab_head/asppI_conv, _bn   classifier.0.convs.I.0, .1            I = 0..3
  deeplab_head/pool_conv, _bn    classifier.0.convs.4.1, .2            (ASPPPooling)
  deeplab_head/project_conv, _bn classifier.0.project.0, .1
  deeplab_head/conv, bn          classifier.1, classifier.2
  class_logits/out               classifier.4
  class_logits/aux               aux_classifier.4

Only kernels change layout, as for the ResNets. `class_logits` is the class layer (both
heads' per-class convolutions), `backbone` takes an ImageNet ResNet's weights.
"""

import re

from jaxnet.tools.weights import resnet_names, torch_names

Path = tuple[str, ...]

MODELS = ("fcn", "deeplabv3")  # the model-name prefixes whose names these are (pretrained.families)

_FIXED = {"fcn_head/conv": "classifier.0", "fcn_head/bn": "classifier.1",
          "aux_head/conv": "aux_classifier.0", "aux_head/bn": "aux_classifier.1",
          "deeplab_head/pool_conv": "classifier.0.convs.4.1", "deeplab_head/pool_bn": "classifier.0.convs.4.2",
          "deeplab_head/project_conv": "classifier.0.project.0",
          "deeplab_head/project_bn": "classifier.0.project.1",
          "deeplab_head/conv": "classifier.1", "deeplab_head/bn": "classifier.2",
          "class_logits/out": "classifier.4", "class_logits/aux": "aux_classifier.4"}
_ASPP = re.compile(r"deeplab_head/aspp(\d+)_(conv|bn)")
_BN_LEAVES = {("params", "scale"): "weight", ("params", "bias"): "bias",
              ("batch_stats", "mean"): "running_mean", ("batch_stats", "var"): "running_var"}
_CONV_LEAVES = {("params", "kernel"): "weight", ("params", "bias"): "bias"}


def _module_to_torch(module: str) -> str | None:
  if module in _FIXED:
    return _FIXED[module]
  m = _ASPP.fullmatch(module)
  if m:
    return f"classifier.0.convs.{int(m.group(1))}.{0 if m.group(2) == 'conv' else 1}"
  return None


def torch_name(path: Path) -> str | None:
  """The torchvision name of a jaxnet FCN/DeepLabV3 variable path, or None if it has none."""
  if len(path) > 2 and path[1] == "backbone":
    name = resnet_names.torch_name(path[:1] + path[2:])
    return f"backbone.{name}" if name else None
  collection, *module, leaf = path
  module = "/".join(module)
  torch_module = _module_to_torch(module)
  leaves = _BN_LEAVES if module.endswith("bn") else _CONV_LEAVES
  torch_leaf = leaves.get((collection, leaf))
  return f"{torch_module}.{torch_leaf}" if torch_module and torch_leaf else None


def unused_hint(names: list[str]) -> str | None:
  """torchvision's files of these models hold the auxiliary head (its recipe trains with it):
  loaded into a model without it, say how to load it rather than drop it unasked."""
  if any(n.startswith("aux_classifier.") for n in names):
    return ("the weights hold the auxiliary head (aux_classifier.*): set --config.model.aux_loss=True "
            "to load it with the rest")
  return None


FAMILY = torch_names.Family("torchvision", "torchvision FCN/DeepLabV3", torch_name,
                            extras=resnet_names.FAMILY.extras, class_layer=("class_logits", 1),
                            backbone=("backbone", "resnet"), unused_hint=unused_hint)
