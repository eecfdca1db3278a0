"""jaxnet's FCN and DeepLabV3 (jaxnet/core/models/segmentation.py) compute what torchvision's
compute, for the same weights, and their weights go in and out under torchvision's names.

tests/data/torchvision_segmentation.npz holds torchvision's fp32 eval-mode outputs for seeded
weights, every BN randomised (experiments/make_reference_logits_segmentation.py, run once
where torch is installed), their state dicts' names and shapes, the four models' parameter
counts and one F.interpolate. Here the same tensors are drawn with numpy
(tests/reference_weights.draw_segmentation), written to a .safetensors file and loaded
through `init.weights`' own path, without torch.
"""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict
from safetensors.numpy import save_file

from jaxnet.core import models
from jaxnet.core.errors import InvalidValueError
from jaxnet.core.models import segmentation
from jaxnet.tools.weights import export, pretrained, tensor_files
from jaxnet.tools.weights.segmentation_names import FAMILY
from tests import reference_weights as rw

REFERENCE = os.path.join(os.path.dirname(__file__), "data", "torchvision_segmentation.npz")
TINY = ("fcn_tiny", "deeplabv3_tiny")


def variable_shapes(model, height: int = 64, width: int = 64) -> dict:
  """{jaxnet path: shape} of `model`'s variables, from shapes alone."""
  abstract = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, height, width, 3)),
                                               train=False))
  return {p: tuple(x.shape) for p, x in flatten_dict(abstract).items()}


def drawn_variables(model, seed: int = 0, size: int = 32) -> dict:
  """{"params", "batch_stats"} of `model` drawn with numpy from its shapes alone: no init to
  compile (seconds on 2 cores), BN statistics away from their init."""
  rng = np.random.default_rng(seed)
  flat = {p: (rng.uniform(0.5, 1.5, s) if p[-1] in ("var", "scale") else rng.normal(0, 0.1, s)).astype(np.float32)
          for p, s in variable_shapes(model, size, size).items()}
  return unflatten_dict(flat)


def param_count(shapes: dict) -> int:
  return sum(int(np.prod(s)) for p, s in shapes.items() if p[0] == "params")


@pytest.mark.parametrize("name", ["fcn_resnet50", "deeplabv3_resnet50", "fcn_resnet101", "deeplabv3_resnet101"])
def test_param_counts_equal_torchvision(name):
  """With and without the auxiliary head, torchvision's counts at 21 classes (stored by the
  experiment script: 35,322,218 / 42,004,074 / 54,314,346 / 60,996,202 with it)."""
  stored = np.load(REFERENCE)
  for aux_loss, key in ((True, "params_aux"), (False, "params")):
    shapes = variable_shapes(models.create(name, num_classes=21, aux_loss=aux_loss), 32, 32)
    assert param_count(shapes) == int(stored[f"{name}/{key}"]), aux_loss
    assert aux_loss == any(p[1] == "aux_head" for p in shapes)


def torchvision_shapes(shapes: dict) -> dict:
  return {FAMILY.torch_name(p): FAMILY.to_torch_layout(p, np.empty(s, bool)).shape for p, s in shapes.items()}


def reference_weights(name: str, tmp_path):
  """(model, variables loaded from the drawn torchvision tensors through a .safetensors file,
  the tensors, the input NHWC) of `name` built as the reference was."""
  model = models.create(name, num_classes=rw.SEGMENTATION_CLASSES, aux_loss=True)
  shapes = variable_shapes(model)
  stored = np.load(REFERENCE)
  stored_spec = {n: tuple(int(d) for d in s.split(",") if d)
                 for n, s in zip(stored[name + "/names"], stored[name + "/shapes"])}
  spec = torchvision_shapes(shapes)
  spec.update({n: () for n in stored_spec if n.endswith("num_batches_tracked")})
  assert spec == stored_spec  # jaxnet's map names every tensor of torchvision's state dict, and no other
  images, tensors = rw.draw_segmentation(stored_spec)
  path = str(tmp_path / f"{name}.safetensors")
  save_file(tensors, path)
  values, head_reason = pretrained.fill(shapes, pretrained.load(path, shapes, name), keep_head=True)
  assert head_reason is None and set(values) == set(shapes)  # every variable, class layer included
  return model, unflatten_dict(values), tensors, images.transpose(0, 2, 3, 1)


@pytest.mark.parametrize("name", ["fcn_resnet50", "deeplabv3_resnet50"])
def test_logits_equal_torchvision_and_export_writes_its_state_dict_back(name, tmp_path):
  model, variables, tensors, images = reference_weights(name, tmp_path)
  logits = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, images)
  stored = np.load(REFERENCE)
  for key in ("out", "aux") if f"{name}/aux" in stored else ("out",):
    reference = stored[f"{name}/{key}"].transpose(0, 2, 3, 1)
    assert logits[key].shape == reference.shape and logits[key].dtype == np.float32
    assert reference.std() > 0.3  # the logits vary: the tolerance below means something
    difference = float(np.abs(np.asarray(logits[key]) - reference).max())
    print(f"{name} {key}: max |logit - torchvision's| = {difference:.2e}")
    assert difference <= 1e-4
  out = export.torch_tensors(variables, name)  # --format=torch: the same state dict back
  assert set(out) == set(tensors)
  for key, value in tensors.items():
    assert out[key].dtype == value.dtype, key
    np.testing.assert_array_equal(out[key], value, err_msg=key)


def test_names_are_torchvisions_state_dict():
  """Every variable of fcn_resnet50 and deeplabv3_resnet50 (auxiliary head included) has the
  name and shape of a tensor of torchvision's state dict, and every tensor is named (shapes
  only: no weights drawn)."""
  stored = np.load(REFERENCE)
  for name in ("fcn_resnet50", "deeplabv3_resnet50"):
    spec = torchvision_shapes(variable_shapes(models.create(name, num_classes=rw.SEGMENTATION_CLASSES,
                                                            aux_loss=True), 32, 32))
    stored_spec = {n: tuple(int(d) for d in s.split(",") if d)
                   for n, s in zip(stored[name + "/names"], stored[name + "/shapes"])
                   if not n.endswith("num_batches_tracked")}
    assert spec == stored_spec, name


def test_bilinear_upsampling_is_torchs_interpolate():
  """F.interpolate(size=(17, 12), mode="bilinear", align_corners=False) of a 5x7 array: 3.4x
  and 1.7x, the edges clamped."""
  stored = np.load(REFERENCE)
  x = stored["interpolate/in"].transpose(0, 2, 3, 1)
  got = np.asarray(segmentation.upsample_bilinear(jnp.asarray(x), (17, 12)))
  np.testing.assert_allclose(got, stored["interpolate/out"].transpose(0, 2, 3, 1), atol=1e-6, rtol=0)
  rows = segmentation.bilinear_matrix(17, 5)
  np.testing.assert_allclose(rows.sum(1), 1, atol=1e-6)  # each output a weighted mean of two inputs
  assert (np.count_nonzero(rows, axis=1) <= 2).all()


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_return_logits_at_the_images_size(name):
  """{"out", "aux"} float32 (N, H, W, classes) at the input's H, W (not a multiple of 8 here),
  "aux" only with aux_loss; bf16 compute, train mode (dropout, BN statistics updated)."""
  assert models.task(name) == "segmentation"
  model = models.create(name, num_classes=5, aux_loss=True, dtype=jnp.bfloat16)
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 36, 44, 3)), jnp.bfloat16)
  variables = drawn_variables(model)
  out, updates = jax.jit(lambda v, x: model.apply(v, x, train=True, rngs={"dropout": jax.random.PRNGKey(1)},
                                                  mutable=["batch_stats"]))(variables, x)
  assert set(out) == {"out", "aux"}
  for logits in out.values():
    assert logits.shape == (2, 36, 44, 5) and logits.dtype == jnp.float32 and np.isfinite(logits).all()
  assert not np.allclose(out["out"], out["aux"])
  changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), updates["batch_stats"], variables["batch_stats"])
  assert all(jax.tree.leaves(changed))  # every BN saw the batch, the heads' included
  without = models.create(name, num_classes=5)  # shapes alone from here on
  assert set(jax.eval_shape(lambda: without.apply(variables, x, train=False))) == {"out"}
  # The backbone's output stride is 8: the last stage's map is the input's / 8, rounded up.
  _, features = jax.eval_shape(lambda: without.apply(variables, x, train=False, capture_intermediates=True,
                                                     mutable=["intermediates"]))
  assert features["intermediates"]["backbone"]["stage4_block1"]["__call__"][0].shape[1:3] == (5, 6)


def test_an_fcn_refuses_aspp_dilations_it_has_no_aspp_for():
  with pytest.raises(InvalidValueError, match=r"config.model.atrous_rates=\(6, 12, 18\): they are DeepLabV3's ASPP "
                                             r"dilations, and an FCN has no ASPP: leave it out"):
    models.create("fcn_tiny", num_classes=3, atrous_rates=[6, 12, 18])
  assert models.create("fcn_tiny", num_classes=3, atrous_rates=[12, 24, 36]).atrous_rates == [12, 24, 36]
  assert models.create("deeplabv3_tiny", num_classes=3, atrous_rates=(6, 12, 18)).atrous_rates == (6, 12, 18)


def test_dilate_stages_is_torchvisions_replace_stride_with_dilation():
  """ResNet's dilate_stages: a dilated stage keeps its input's resolution; its first block keeps
  the dilation before it (torchvision's _make_layer), so the parameters are the plain ResNet's."""
  x = jnp.zeros((1, 32, 32, 3))
  plain = models.create("resnet_tiny", num_classes=3)
  assert variable_shapes(plain, 32, 32) == variable_shapes(
      models.create("resnet_tiny", num_classes=3, dilate_stages=(False, True)), 32, 32)
  variables = drawn_variables(plain)
  sizes = []
  for options in ({}, {"dilate_stages": (False, True)}, {"dilate_stages": (True, True)}):
    model = models.create("resnet_tiny", num_classes=3, features_only=True, **options)
    sizes.append([s.shape[1] for s in jax.eval_shape(lambda: model.apply(variables, x, train=False))])
  assert sizes == [[32, 16, 8], [32, 16, 16], [32, 32, 32]]
  with pytest.raises(InvalidValueError, match="one flag per stage after the first"):
    jax.eval_shape(lambda: models.create("resnet_tiny", num_classes=3, dilate_stages=(True,)).init(
        jax.random.PRNGKey(0), x, train=False))


def _init_config(weights: str, name: str = "fcn_tiny"):
  """What pretrained.initialiser reads of a run's config."""
  return ml_collections.ConfigDict({"model": {"name": name}, "init": {"weights": weights, "keep_head": True}})


def test_imagenet_resnet_weights_initialise_the_backbone(tmp_path):
  """init.weights: a torchvision-named ResNet file (its fc included) of the backbone's shape
  fills the backbone, variable for variable; the heads start fresh."""
  fresh = drawn_variables(models.create("fcn_tiny", num_classes=4, aux_loss=True))
  rng = np.random.default_rng(0)
  backbone = {c: jax.tree.map(lambda x: rng.uniform(0.5, 1, x.shape).astype(np.float32), fresh[c]["backbone"])
              for c in ("params", "batch_stats")}
  tensors = export.torch_tensors(backbone, "resnet")
  tensors.update({"fc.weight": np.zeros((1000, 128), np.float32), "fc.bias": np.zeros(1000, np.float32)})
  path = str(tmp_path / "imagenet.safetensors")
  tensor_files.write(path, tensors, {})
  lines = []
  got = flatten_dict(pretrained.initialiser(_init_config(path), log=lines.append)(jax.tree.map(jnp.asarray, fresh)))
  want = flatten_dict(backbone)
  assert lines == [f"init: {len(want)} of {len(flatten_dict(fresh))} variables (the backbone's) from {path}"]
  for p, value in want.items():
    np.testing.assert_array_equal(got[p[:1] + ("backbone",) + p[1:]], value)
  for p, value in flatten_dict(fresh).items():
    if p[1] != "backbone":
      np.testing.assert_array_equal(got[p], value)


def test_weights_of_other_classes_load_with_a_fresh_class_layer(tmp_path):
  """A segmenter's own torchvision-named weights (an export) for 4 classes into a 6-class model:
  every variable but class_logits (both heads' per-class convolutions) from the file."""
  source = drawn_variables(models.create("deeplabv3_tiny", num_classes=4, aux_loss=True), seed=1)
  fresh = drawn_variables(models.create("deeplabv3_tiny", num_classes=6, aux_loss=True), seed=2)
  tensors = export.torch_tensors(source, "deeplabv3_tiny")
  assert {"classifier.4.weight", "aux_classifier.4.bias", "classifier.0.convs.4.2.running_var",
          "backbone.layer4.0.downsample.1.weight"} <= set(tensors)
  path = str(tmp_path / "four.safetensors")
  tensor_files.write(path, tensors, {})
  lines = []
  got = flatten_dict(pretrained.initialiser(_init_config(path, "deeplabv3_tiny"), log=lines.append)(
      jax.tree.map(jnp.asarray, fresh)))
  assert lines == [f"init: {len(got) - 4} of {len(got)} variables from {path}; classifier head "
                   "re-initialised: the weights have 4 classes, this run 6"]
  fresh = flatten_dict(fresh)
  for p, value in flatten_dict(source).items():
    np.testing.assert_array_equal(got[p], fresh[p] if p[1] == "class_logits" else value, err_msg=str(p))
  # The same file into a model without the auxiliary head: refused, saying how to load it.
  no_aux = unflatten_dict({p: v for p, v in flatten_dict(source).items() if "aux_head" not in p and "aux" != p[2]})
  config = _init_config(path, "deeplabv3_tiny")
  with pytest.raises(InvalidValueError, match=rf"{path} does not fit this deeplabv3_tiny: 7 tensors do not, e\.g\. "
                     r"not used by the model: aux_classifier.0.weight; the weights hold the auxiliary head "
                     r"\(aux_classifier.\*\): set --config.model.aux_loss=True to load it with the rest$"):
    pretrained.initialiser(config, log=lines.append)(jax.tree.map(jnp.asarray, no_aux))

