"""What the per-family name maps share: PyTorch layouts and the name-by-name conversion.

A family's map (resnet_names, vit_names, alexnet_names) gives `torch_name(path)`,
`jaxnet_path(name)`, `from_torch_layout(path, array)` and `to_torch_layout(path, array)`;
`from_torch` and `to_torch` here turn a whole state dict into jaxnet variables and back
with them.
"""

from typing import Callable

import numpy as np

Path = tuple[str, ...]

# flax leaf -> torch leaf, for Conv/Dense and for BatchNorm/LayerNorm parameters.
LINEAR_LEAVES = {"kernel": "weight", "bias": "bias"}
NORM_LEAVES = {"scale": "weight", "bias": "bias"}


def kernel_to_torch(array: np.ndarray) -> np.ndarray:
  return array.T if array.ndim == 2 else array.transpose(3, 2, 0, 1)  # (in, out) / HWIO -> OIHW


def kernel_from_torch(array: np.ndarray) -> np.ndarray:
  return array.T if array.ndim == 2 else array.transpose(2, 3, 1, 0)  # (out, in) / OIHW -> HWIO


def to_torch_layout(path: Path, array: np.ndarray) -> np.ndarray:
  """A variable's array in PyTorch's layout, for families where only kernels differ."""
  return kernel_to_torch(array) if path[-1] == "kernel" else array


def from_torch_layout(path: Path, array: np.ndarray) -> np.ndarray:
  return kernel_from_torch(array) if path[-1] == "kernel" else array


def from_torch(tensors: dict[str, np.ndarray], jaxnet_path: Callable[[str], Path | None],
               from_torch_layout: Callable[[Path, np.ndarray], np.ndarray],
               dropped: Callable[[str], bool] = lambda name: False
               ) -> tuple[dict[Path, np.ndarray], list[str]]:
  """A state dict -> (flat jaxnet variables, names that map to no jaxnet variable).

  Floating tensors come back as float32 (half-precision files included);
  `dropped` names tensors with no jaxnet counterpart that are skipped silently.
  """
  out, unknown = {}, []
  for name, array in tensors.items():
    if dropped(name):
      continue
    path = jaxnet_path(name)
    if path is None:
      unknown.append(name)
      continue
    out[path] = np.asarray(from_torch_layout(path, np.asarray(array, np.float32)))
  return out, unknown


def to_torch(variables: dict[Path, np.ndarray], torch_name: Callable[[Path], str | None],
             to_torch_layout: Callable[[Path, np.ndarray], np.ndarray], names: str
             ) -> dict[str, np.ndarray]:
  """Flat jaxnet variables -> a state dict (C-contiguous numpy arrays) under `names`
  (e.g. "torchvision ResNet"); a variable without such a name is an error listing it."""
  out, unmapped = {}, []
  for path, array in variables.items():
    name = torch_name(path)
    if name is None:
      unmapped.append("/".join(path))
      continue
    out[name] = np.array(to_torch_layout(path, np.asarray(array)), order="C")
  if unmapped:
    raise ValueError(f"{len(unmapped)} variables have no {names} name: {', '.join(unmapped[:5])}")
  return out


def params_name(path: Path, module_to_torch: Callable[[str], str | None],
                leaves: Callable[[str], dict[str, str]]) -> str | None:
  """The torch name of a `params` variable whose modules map one to one (ViT, AlexNet)."""
  collection, *module, leaf = path
  if collection != "params" or not module:
    return None
  module = "/".join(module)
  torch_module, torch_leaf = module_to_torch(module), leaves(module).get(leaf)
  return f"{torch_module}.{torch_leaf}" if torch_module and torch_leaf else None


def params_path(name: str, module_from_torch: Callable[[str], str | None],
                leaves: Callable[[str], dict[str, str]]) -> Path | None:
  """The inverse of `params_name`."""
  torch_module, _, torch_leaf = name.rpartition(".")
  module = module_from_torch(torch_module)
  if module is None:
    return None
  for leaf, candidate in leaves(module).items():
    if candidate == torch_leaf:
      return ("params", *module.split("/"), leaf)
  return None
