"""A trained workdir -> a PyTorch-named .safetensors file.

  python -m jaxnet.cli.export --workdir=DIR --format=torch --out=model.safetensors

The file holds the eval-mode variables (EMA params when the run kept an EMA,
BN running statistics) under the names and layouts of the model family's
PyTorch implementation: torchvision's for the ResNets and AlexNet, timm's for
the ViTs (`flavour=timm`), torchvision's or, asked for (`names="timm"`, `--names=timm`),
timm's for the ConvNeXts and EfficientNet B0-B7. So, for a resnet50 run,

  model = torchvision.models.resnet50(num_classes=N)
  model.load_state_dict(safetensors.torch.load_file("model.safetensors"))

loads it; likewise `torchvision.models.alexnet(num_classes=N)` and
`timm.create_model("vit_tiny_patch16_224", num_classes=N, img_size=S)` for a ViT
trained at image_size S, and `timm.create_model("convnext_tiny", num_classes=N)` for a
convnext_tiny exported with timm's names. Its metadata records whose names it uses, the
model name, the class names and the preprocessing (mean/std, eval crop fraction,
interpolation), which `init.weights` reads back.
"""

import json

import numpy as np
from flax.traverse_util import flatten_dict

from jaxnet.tools.weights import preprocessing, pretrained, tensor_files
from jaxnet.core.errors import InvalidValueError


def torch_tensors(variables: dict, model: str, names: str | None = None) -> dict[str, np.ndarray]:
  """{"params": ..., "batch_stats": ...} of model `model` -> its family's PyTorch state-dict
  tensors (float32; BN counters int64), under `names`' names ("torchvision", "timm"; by
  default the family's first naming)."""
  flat = {p: np.asarray(x, np.float32) for p, x in flatten_dict(variables).items()}
  return pretrained.names_of(model, names).to_torch(flat)


def save(predictor, path: str, names: str | None = None) -> dict[str, np.ndarray]:
  """Writes a Predictor's (jaxnet.api.restore) variables to `path` under `names`' names (by
  default the family's first: torch_tensors); returns the tensors."""
  model = predictor.config.model.name
  family = pretrained.names_of(model, names)  # an unknown naming fails before any conversion
  if family.refuses(predictor.config.model):
    raise InvalidValueError(f"{family.refuses(predictor.config.model)}; export it with --format=jax")
  tensors = torch_tensors(predictor.variables, model, family.NAMES)
  metadata = {
      "format": "torch", "names": family.NAMES, "model": model,
      "num_classes": str(predictor.num_classes), "class_names": json.dumps(predictor.class_names),
      "preprocessing": preprocessing.of_config(predictor.config).to_json(),
      "source": f"{predictor.workdir} step {predictor.step}"}
  tensor_files.write(path, tensors, metadata)
  return tensors
