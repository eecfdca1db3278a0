"""What the per-family name maps share: one map from jaxnet to PyTorch, used both ways.

A family (resnet_names, vit_names, alexnet_names) writes one direction only:
`torch_name(path)`, the PyTorch name of a jaxnet variable path, and `layout(path,
shape)`, how that variable's axes sit in PyTorch. Reading a state dict needs the
inverse, which is derived here from the model being filled: its variable paths,
each mapped forward, give {torch name: path}. A file's name that no variable of
the model produces is unknown to that model, whatever the family would call it.
"""

import dataclasses
from typing import Any, Callable

import numpy as np

Path = tuple[str, ...]
Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Layout:
  """A jaxnet array of `shape` in PyTorch's layout: reshaped to `split`, its axes
  transposed by `axes`, reshaped to `torch_shape`. The way back is derived."""
  shape: Shape
  split: Shape
  axes: tuple[int, ...]
  torch_shape: Shape

  def to_torch(self, array: np.ndarray) -> np.ndarray:
    return array.reshape(self.split).transpose(self.axes).reshape(self.torch_shape)

  def from_torch(self, array: np.ndarray) -> np.ndarray:
    transposed = tuple(self.split[a] for a in self.axes)
    return array.reshape(transposed).transpose(np.argsort(self.axes)).reshape(self.shape)


def transposed(shape: Shape, axes: tuple[int, ...]) -> Layout:
  return Layout(tuple(shape), tuple(shape), axes, tuple(shape[a] for a in axes))


def kernel_layout(path: Path, shape: Shape) -> Layout | None:
  """Conv/Dense kernels: (in, out) is (out, in), HWIO is OIHW; other variables keep theirs."""
  if path[-1] != "kernel" or len(shape) not in (2, 4):
    return None
  return transposed(shape, (1, 0) if len(shape) == 2 else (3, 2, 0, 1))


def _kernel_axes_back(array: np.ndarray) -> np.ndarray:
  return array.T if array.ndim == 2 else array.transpose(2, 3, 1, 0) if array.ndim == 4 else array


@dataclasses.dataclass(frozen=True)
class Family:
  """The PyTorch names and layouts of one model family, and conversion of whole state dicts."""
  NAMES: str                                   # whose names: "torchvision", "timm" (export metadata)
  what: str                                    # for errors: "torchvision ResNet"
  torch_name: Callable[[Path], str | None]     # the one map: jaxnet path -> PyTorch name
  layout: Callable[[Path, Shape], Layout | None] = kernel_layout
  # Tensors PyTorch keeps beside a named one that jaxnet has no counterpart of
  # (BN's counter): written on the way out, skipped on the way in.
  extras: Callable[[str], dict[str, np.ndarray]] = lambda name: {}
  # The module whose outputs are per class (a fresh one where the class counts differ), and its
  # outputs per class: a classifier's head, a detector's class logits (9 anchors x classes).
  class_layer: tuple[str, int] = ("head", 1)
  # (the module holding a backbone, the model family whose plain network's weights it takes):
  # RetinaNet's ("backbone", "resnet"). None: the whole model is one network.
  backbone: tuple[str, str] | None = None
  # Why a model of these options (config.model) has no counterpart under these names (None: it has).
  refuses: Callable[[Any], str | None] = lambda model: None
  # What to do about a file's tensors the model has no variable for ([their names] -> a line, or
  # None): a segmenter's file with the auxiliary head, loaded with model.aux_loss off.
  unused_hint: Callable[[list[str]], str | None] = lambda names: None

  def to_torch_layout(self, path: Path, array: np.ndarray) -> np.ndarray:
    layout = self.layout(path, array.shape)
    return array if layout is None else layout.to_torch(array)

  def from_torch_layout(self, path: Path, array: np.ndarray, shape: Shape) -> np.ndarray:
    """A PyTorch array of the variable at `path`, of jaxnet shape `shape`, in jaxnet's layout."""
    layout = self.layout(path, tuple(shape))
    if layout is None:
      return array
    if array.shape != layout.torch_shape:  # put in jaxnet's axis order, so a shape error names it so
      return _kernel_axes_back(array) if path[-1] == "kernel" else array
    return layout.from_torch(array)

  def inverse(self, paths) -> dict[str, Path]:
    """{PyTorch name: jaxnet path} of the variables at `paths` (those that have a name)."""
    out = {}
    for path in paths:
      name = self.torch_name(path)
      if name is not None:
        if name in out:  # a bug in the family's map, not in anyone's weights
          raise AssertionError(f"{self.what}: {out[name]} and {path} are both {name}")
        out[name] = path
    return out

  def to_torch(self, variables: dict[Path, np.ndarray]) -> dict[str, np.ndarray]:
    """Flat jaxnet variables -> a state dict (C-contiguous numpy arrays); a variable without
    a PyTorch name is an error listing it."""
    out, unmapped = {}, []
    for path, array in variables.items():
      name = self.torch_name(path)
      if name is None:
        unmapped.append("/".join(path))
        continue
      out[name] = np.array(self.to_torch_layout(path, np.asarray(array)), order="C")
    if unmapped:
      raise ValueError(f"{len(unmapped)} variables have no {self.what} name: {', '.join(unmapped[:5])}")
    for name in list(out):
      out.update(self.extras(name))
    return out

  def from_torch(self, tensors: dict[str, np.ndarray], target: dict[Path, Shape]
                 ) -> tuple[dict[Path, np.ndarray], list[str]]:
    """A state dict -> (flat jaxnet variables, names that map to no variable of `target`).

    `target` maps the model's variable paths to their shapes. Floating tensors come
    back as float32 (half-precision files included).
    """
    inverse = self.inverse(target)
    skipped = {extra for name in tensors for extra in self.extras(name)}
    out, unknown = {}, []
    for name, array in tensors.items():
      if name in skipped:
        continue
      path = inverse.get(name)
      if path is None:
        unknown.append(name)
        continue
      out[path] = np.asarray(self.from_torch_layout(path, np.asarray(array, np.float32), target[path]))
    return out, unknown


def params_name(path: Path, module_to_torch: Callable[[str], str | None],
                leaves: Callable[[str], dict[str, str]]) -> str | None:
  """The torch name of a `params` variable whose modules map one to one (ViT, AlexNet)."""
  collection, *module, leaf = path
  if collection != "params" or not module:
    return None
  module = "/".join(module)
  torch_module, torch_leaf = module_to_torch(module), leaves(module).get(leaf)
  return f"{torch_module}.{torch_leaf}" if torch_module and torch_leaf else None


# flax leaf -> torch leaf, for Conv/Dense and for LayerNorm parameters.
LINEAR_LEAVES = {"kernel": "weight", "bias": "bias"}
NORM_LEAVES = {"scale": "weight", "bias": "bias"}
