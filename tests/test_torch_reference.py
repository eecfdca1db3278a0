"""jaxnet's ResNets compute what torchvision's compute, for the same weights.

tests/data/torchvision_resnet_logits.npz holds torchvision's fp32 eval-mode
logits for seeded weights (experiments/make_reference_logits.py, run once where
torch is installed). Here the same tensors are drawn with numpy
(tests/reference_weights.py), written to a .safetensors file and loaded through
`init.weights`'s own path (jaxnet.tools.weights.pretrained), without torch.
"""

import os

import jax
import jax.numpy as jnp
import flax.linen as nn
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict
from safetensors.numpy import save_file

from jaxnet.core import models
from jaxnet.core.models import resnet
from jaxnet.tools.weights import pretrained
from jaxnet.tools.weights.resnet_names import FAMILY as RESNET
from tests import reference_weights

LOGITS = os.path.join(os.path.dirname(__file__), "data", "torchvision_resnet_logits.npz")


def model_shapes(model, size: int = 64) -> dict:
  """{jaxnet path: shape} of `model`'s variables, from shapes alone."""
  abstract = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, size, size, 3)),
                                               train=False))
  return {p: tuple(x.shape) for p, x in flatten_dict(abstract).items()}


def torchvision_shapes(shapes: dict) -> dict:
  """The torchvision state-dict names and shapes of jaxnet variables with these shapes."""
  return {RESNET.torch_name(p): RESNET.to_torch_layout(p, np.empty(s, bool)).shape
          for p, s in shapes.items()}


def jaxnet_logits(name, tmp_path, options=({},)):
  """jaxnet's fp32 eval-mode logits for the reference weights and images of `name`; with
  several `options`, a list: the logits of the model built with each."""
  model = models.create(name, num_classes=1000)
  shapes = model_shapes(model)
  images, tensors = reference_weights.draw(torchvision_shapes(shapes))
  path = str(tmp_path / f"{name}.safetensors")
  save_file(tensors, path)

  values, head_reason = pretrained.fill(shapes, pretrained.load(path, shapes), keep_head=True)
  assert head_reason is None and set(values) == set(shapes)  # every variable, head included
  # Eager (un-jitted) apply: no compile, fast enough at 64 px on the CPU.
  logits = [np.asarray(models.create(name, num_classes=1000, **o).apply(
      unflatten_dict(values), images.transpose(0, 2, 3, 1), train=False)) for o in options]
  return logits if len(options) > 1 else logits[0]


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_logits_equal_torchvision_for_the_same_weights(name, tmp_path):
  logits = jaxnet_logits(name, tmp_path)
  reference = np.load(LOGITS)[name]
  assert logits.shape == reference.shape == (2, 1000)
  assert np.abs(reference).max() > 0.5  # the reference is not degenerate
  assert np.abs(logits - reference).max() <= 1e-4


def test_the_stem_conv_levers_import_torchvision_weights_and_compute_its_logits(tmp_path):
  """model.stem_conv (channels padded to 4 or 8, space-to-depth): the same parameters, so
  torchvision's weights import as they are, and the same function: logits within fp32
  rounding of the plain stem's, and as close to torchvision's."""
  stem_convs = ("pad4", "space_to_depth")  # pad8 is pad4's code with another number
  plain, *levers = jaxnet_logits("resnet18", tmp_path, [{}] + [{"stem_conv": s} for s in stem_convs])
  reference = np.load(LOGITS)["resnet18"]
  for stem_conv, logits in zip(stem_convs, levers):
    np.testing.assert_allclose(logits, plain, rtol=1e-5, atol=1e-5 * np.abs(plain).max())
    assert np.abs(logits - reference).max() <= 1e-4, stem_conv


@pytest.mark.parametrize("name, measured", [("resnet18", 0.099), ("resnet50", 0.178)])
def test_same_padding_would_be_far_from_torchvision(name, measured, tmp_path, monkeypatch):
  # jaxnet's ResNets once padded the stem max-pool and the stride-2 3x3 convs "SAME"
  # (0 before, 1 after on even sizes). docs/models.md gives the error that would make.
  conv, max_pool = resnet._conv, nn.max_pool

  def same_padded_conv(features, kernel_size, strides=(1, 1), dilation=1, **kwargs):
    if strides != (1, 1) and kernel_size == (3, 3):
      return nn.Conv(features, kernel_size, strides, padding="SAME", **kwargs)
    return conv(features, kernel_size, strides, dilation, **kwargs)

  monkeypatch.setattr(resnet, "_conv", same_padded_conv)
  monkeypatch.setattr(resnet.nn, "max_pool", lambda x, *a, **k: max_pool(x, *a, **{**k, "padding": "SAME"}))
  error = np.abs(jaxnet_logits(name, tmp_path) - np.load(LOGITS)[name]).max()
  assert error > 100 * 1e-4  # far outside what the test above allows
  assert error == pytest.approx(measured, abs=0.005)
