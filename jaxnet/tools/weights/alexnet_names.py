"""jaxnet AlexNet variable paths -> torchvision `alexnet` state-dict names and layouts.

  jaxnet              conv1 conv2      conv3      conv4      conv5       fc1          fc2          head
  torchvision         features.0 .3    features.6 features.8 features.10 classifier.1 classifier.4 classifier.6

Leaves: `kernel` is `weight`, (H, W, in, out) -> (out, in, H, W) for the
convolutions and (in, out) -> (out, in) for the dense layers. fc1 reads the 6x6
pooled map flattened: torchvision flattens NCHW as (c, h, w), jaxnet NHWC as
(h, w, c), so fc1's input rows are permuted too.
"""

from jaxnet.tools.weights import torch_names

Path = tuple[str, ...]

_MODULES = {"conv1": "features.0", "conv2": "features.3", "conv3": "features.6",
            "conv4": "features.8", "conv5": "features.10",
            "fc1": "classifier.1", "fc2": "classifier.4", "head": "classifier.6"}
_POOL = 6  # the adaptive pool's output side, before fc1
_FC1 = ("params", "fc1", "kernel")


def torch_name(path: Path) -> str | None:
  """The torchvision name of a jaxnet AlexNet variable path, or None if it has none."""
  return torch_names.params_name(path, _MODULES.get, lambda module: torch_names.LINEAR_LEAVES)


def layout(path: Path, shape: tuple[int, ...]) -> torch_names.Layout | None:
  if path == _FC1 and len(shape) == 2 and shape[0] % _POOL**2 == 0:
    # fc1's input rows, (h, w, c) in jaxnet, are (c, h, w) in torchvision.
    fin, fout = shape
    return torch_names.Layout(shape, (_POOL, _POOL, fin // _POOL**2, fout), (3, 2, 0, 1), (fout, fin))
  return torch_names.kernel_layout(path, shape)


FAMILY = torch_names.Family("torchvision", "torchvision AlexNet", torch_name, layout)
