"""ConvNeXt and EfficientNet: parameter counts and logits against torchvision, weights in and out
under torchvision's names, stochastic depth, and a few training steps of the mini variants (CPU)."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict
from safetensors.numpy import save_file

from jaxnet.core import models
from jaxnet.tools.weights import export, pretrained
from tests import convnet_weights as cw

REFERENCE = os.path.join(os.path.dirname(__file__), "data", "reference_logits_convnets.npz")

# torchvision's counts at 1000 classes (sum of the parameters' sizes; BN statistics are not
# parameters), checked against torchvision 0.28 by experiments/make_reference_logits_convnets.py's
# models and listed in docs/models.md.
TORCHVISION_PARAMS = {
    "convnext_tiny": 28_589_128, "convnext_small": 50_223_688, "convnext_base": 88_591_464,
    "convnext_large": 197_767_336,
    "efficientnet_b0": 5_288_548, "efficientnet_b1": 7_794_184, "efficientnet_b2": 9_109_994,
    "efficientnet_b3": 12_233_232, "efficientnet_b4": 19_341_616, "efficientnet_b5": 30_389_784,
    "efficientnet_b6": 43_040_704, "efficientnet_b7": 66_347_960,
    "efficientnet_v2_s": 21_458_488, "efficientnet_v2_m": 54_139_356, "efficientnet_v2_l": 118_515_272,
}


def abstract_variables(name, image_size=64, **options):
  """The model's variables as shapes only (jax.eval_shape: nothing is allocated or compiled)."""
  model = models.create(name, **options)
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, image_size, image_size, 3)),
                                           train=False))


# Tracing the deep ones takes seconds each (B7: 55 blocks): one of each kind runs by default.
QUICK_COUNTS = ("convnext_tiny", "efficientnet_b0", "efficientnet_v2_s")


@pytest.mark.parametrize("name", [n if n in QUICK_COUNTS else pytest.param(n, marks=pytest.mark.slow)
                                  for n in TORCHVISION_PARAMS])
def test_param_counts_equal_torchvision(name):
  params = abstract_variables(name, 32)["params"]
  assert sum(math.prod(x.shape) for x in jax.tree.leaves(params)) == TORCHVISION_PARAMS[name]


# --- the same logits as torchvision for the same weights -------------------------------------


def torchvision_spec(name, setup) -> dict:
  """{torchvision name: torchvision shape} of every tensor jaxnet's map gives model `name`."""
  family = pretrained.names_of(name)
  shapes = {p: tuple(x.shape) for p, x in flatten_dict(
      abstract_variables(name, setup["image_size"], num_classes=setup["num_classes"])).items()}
  spec = {}
  for path, shape in shapes.items():
    torch_name = family.torch_name(path)
    spec[torch_name] = family.to_torch_layout(path, np.empty(shape, bool)).shape
    spec.update({k: v.shape for k, v in family.extras(torch_name).items()})
  return spec, shapes


def load_reference_weights(name, tmp_path):
  """(the model, its variables loaded from the reference weights through a .safetensors file
  and `init.weights`'s reader, the torchvision state dict those came from)."""
  setup = cw.SETUPS[name]
  spec, shapes = torchvision_spec(name, setup)
  stored = np.load(REFERENCE)
  stored_spec = {n: tuple(int(d) for d in s.split(",") if d) for n, s in
                 zip(stored[name + "/names"], stored[name + "/shapes"])}
  assert spec == stored_spec  # jaxnet's map names every tensor of torchvision's state dict, and no other
  tensors = cw.draw(spec, setup["seed"])
  path = str(tmp_path / f"{name}.safetensors")
  save_file(tensors, path)
  values, head_reason = pretrained.fill(shapes, pretrained.load(path, shapes, name), keep_head=True)
  assert head_reason is None and set(values) == set(shapes)  # every variable, head included
  return models.create(name, num_classes=setup["num_classes"]), unflatten_dict(values), tensors


def jaxnet_logits(model, variables, image_size):
  x = cw.reference_input(image_size).transpose(0, 2, 3, 1)
  return np.asarray(jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x))


def check_logits(name, tmp_path):
  model, variables, _ = load_reference_weights(name, tmp_path)
  logits = jaxnet_logits(model, variables, cw.SETUPS[name]["image_size"])
  reference = np.load(REFERENCE)[name]
  assert logits.shape == reference.shape
  assert reference.std() > 0.1  # the logits vary: the tolerance below means something
  difference = np.abs(logits - reference).max()
  print(f"{name}: max |logit - torchvision's| = {difference:.2e}")
  assert difference <= 1e-4
  return difference


@pytest.mark.parametrize("name", ["convnext_mini", "efficientnet_mini"])
def test_mini_logits_equal_torchvision(name, tmp_path):
  check_logits(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["convnext_tiny", "efficientnet_b0", "efficientnet_v2_s"])
def test_logits_equal_torchvision(name, tmp_path):
  check_logits(name, tmp_path)


@pytest.mark.parametrize("name", ["convnext_mini", "efficientnet_mini"])
def test_export_writes_back_the_torchvision_state_dict(name, tmp_path):
  """`--format=torch` of the variables read from a torchvision state dict is that state dict,
  every name, layout and value (BN's counter included)."""
  _, variables, tensors = load_reference_weights(name, tmp_path)
  out = export.torch_tensors(variables, name)
  assert set(out) == set(tensors)
  for key, value in tensors.items():
    assert out[key].dtype == value.dtype and out[key].flags.c_contiguous, key
    np.testing.assert_array_equal(out[key], value, err_msg=key)
