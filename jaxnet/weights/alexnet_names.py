"""jaxnet AlexNet variables <-> torchvision `alexnet` state-dict tensors.

  jaxnet              conv1 conv2      conv3      conv4      conv5       fc1          fc2          head
  torchvision         features.0 .3    features.6 features.8 features.10 classifier.1 classifier.4 classifier.6

Leaves: `kernel` is `weight`, (H, W, in, out) -> (out, in, H, W) for the
convolutions and (in, out) -> (out, in) for the dense layers. fc1 reads the 6x6
pooled map flattened: torchvision flattens NCHW as (c, h, w), jaxnet NHWC as
(h, w, c), so fc1's input rows are permuted too.
"""

import numpy as np

from jaxnet.weights import torch_names

Path = tuple[str, ...]

_MODULES = {"conv1": "features.0", "conv2": "features.3", "conv3": "features.6",
            "conv4": "features.8", "conv5": "features.10",
            "fc1": "classifier.1", "fc2": "classifier.4", "head": "classifier.6"}
_FROM_TORCH = {v: k for k, v in _MODULES.items()}
_POOL = 6  # the adaptive pool's output side, before fc1
_FC1 = ("params", "fc1", "kernel")


def _leaves(module: str) -> dict[str, str]:
  return torch_names.LINEAR_LEAVES


def torch_name(path: Path) -> str | None:
  """The torchvision name of a jaxnet AlexNet variable path, or None if it has none."""
  return torch_names.params_name(path, _MODULES.get, _leaves)


def jaxnet_path(name: str) -> Path | None:
  """The jaxnet variable path of a torchvision AlexNet tensor name, or None if it has none."""
  return torch_names.params_path(name, _FROM_TORCH.get, _leaves)


def to_torch_layout(path: Path, array: np.ndarray) -> np.ndarray:
  if path == _FC1 and array.ndim == 2 and array.shape[0] % _POOL**2 == 0:
    fin, fout = array.shape
    hwc = array.reshape(_POOL, _POOL, fin // _POOL**2, fout)
    return hwc.transpose(3, 2, 0, 1).reshape(fout, fin)
  return torch_names.to_torch_layout(path, array)


def from_torch_layout(path: Path, array: np.ndarray) -> np.ndarray:
  # A fc1 weight whose width is no multiple of 36 keeps its shape, which the shape check reports.
  if path == _FC1 and array.ndim == 2 and array.shape[1] % _POOL**2 == 0:
    fout, fin = array.shape
    chw = array.reshape(fout, fin // _POOL**2, _POOL, _POOL)
    return chw.transpose(2, 3, 1, 0).reshape(fin, fout)
  return torch_names.from_torch_layout(path, array)


NAMES = "torchvision"


def to_torch(variables: dict[Path, np.ndarray]) -> dict[str, np.ndarray]:
  """Flat jaxnet AlexNet variables -> a torchvision state dict (C-contiguous numpy arrays)."""
  return torch_names.to_torch(variables, torch_name, to_torch_layout, "torchvision AlexNet")


def from_torch(tensors: dict[str, np.ndarray]) -> tuple[dict[Path, np.ndarray], list[str]]:
  """A torchvision AlexNet state dict -> (flat jaxnet variables, names that map to none)."""
  return torch_names.from_torch(tensors, jaxnet_path, from_torch_layout)
