"""A trained workdir -> a torchvision-named .safetensors file.

  python -m jaxnet.export --workdir=DIR --format=torchvision --out=resnet50.safetensors

The file holds the eval-mode variables (EMA params when the run kept an EMA,
BN running statistics) under torchvision's names and layouts, so

  model = torchvision.models.resnet50(num_classes=N)
  model.load_state_dict(safetensors.torch.load_file("resnet50.safetensors"))

loads it (for jaxnet's `resnetN` models with the ImageNet stem). Its metadata
records the model name, the class names and the preprocessing (mean/std, eval
crop fraction, interpolation), which `init.weights` reads back.
"""

import json

import numpy as np
from flax.traverse_util import flatten_dict

from jaxnet.weights import preprocessing, resnet_names, tensor_files


def torchvision_tensors(variables: dict) -> dict[str, np.ndarray]:
  """{"params": ..., "batch_stats": ...} -> torchvision state-dict tensors (float32)."""
  flat = {p: np.asarray(x, np.float32) for p, x in flatten_dict(variables).items()}
  return resnet_names.to_torchvision(flat)


def save(predictor, path: str) -> dict[str, np.ndarray]:
  """Writes a Predictor's (jaxnet.api.restore) variables to `path`; returns the tensors."""
  tensors = torchvision_tensors(predictor.variables)
  metadata = {
      "format": "torchvision", "model": predictor.config.model.name,
      "num_classes": str(predictor.num_classes), "class_names": json.dumps(predictor.class_names),
      "preprocessing": preprocessing.of_config(predictor.config).to_json(),
      "source": f"{predictor.workdir} step {predictor.step}"}
  tensor_files.write(path, tensors, metadata)
  return tensors
