"""ConvNeXt and EfficientNet: parameter counts and logits against torchvision, weights in and out
under torchvision's names (ConvNeXt's under timm's too), stochastic depth, and a few training
steps of the mini variants (CPU)."""

import json
import math
import os

import jax
import jax.numpy as jnp
import flax.linen as nn
import numpy as np
import optax
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict
from safetensors.numpy import save_file

from jaxnet.core import models
from jaxnet.core.errors import InvalidValueError
from jaxnet.tools.weights import export, pretrained
from tests import convnet_weights as cw
from tests import models_helpers as H

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


def state_dict_spec(name, setup, names="torchvision") -> tuple[dict, dict]:
  """({name: PyTorch shape} of every tensor jaxnet's `names` map gives model `name`
  (torchvision's by default, "timm" for timm's), {jaxnet path: shape})."""
  family = pretrained.names_of(name, names)
  shapes = {p: tuple(x.shape) for p, x in flatten_dict(
      abstract_variables(name, setup["image_size"], num_classes=setup["num_classes"])).items()}
  spec = {}
  for path, shape in shapes.items():
    torch_name = family.torch_name(path)
    spec[torch_name] = family.to_torch_layout(path, np.empty(shape, bool)).shape
    spec.update({k: v.shape for k, v in family.extras(torch_name).items()})
  return spec, shapes


def load_reference_weights(name, tmp_path, rename=lambda tensors: tensors):
  """(the model, its variables loaded from the reference weights through a .safetensors file
  and `init.weights`'s reader, the torchvision state dict those came from); the file holds
  `rename` of that state dict (another library's names for it)."""
  setup = cw.SETUPS[name]
  spec, shapes = state_dict_spec(name, setup)
  stored = np.load(REFERENCE)
  stored_spec = {n: tuple(int(d) for d in s.split(",") if d) for n, s in
                 zip(stored[name + "/names"], stored[name + "/shapes"])}
  assert spec == stored_spec  # jaxnet's map names every tensor of torchvision's state dict, and no other
  tensors = cw.draw(spec, setup["seed"])
  path = str(tmp_path / f"{name}.safetensors")
  save_file(rename(tensors), path)
  values, head_reason = pretrained.fill(shapes, pretrained.load(path, shapes, name), keep_head=True)
  assert head_reason is None and set(values) == set(shapes)  # every variable, head included
  return models.create(name, num_classes=setup["num_classes"]), unflatten_dict(values), tensors


def jaxnet_logits(model, variables, image_size):
  x = cw.reference_input(image_size).transpose(0, 2, 3, 1)
  return np.asarray(jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x))


def check_logits(name, tmp_path, rename=lambda tensors: tensors):
  model, variables, _ = load_reference_weights(name, tmp_path, rename)
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


# --- the same weights under timm's names ----------------------------------------------------

TIMM_NAMES = os.path.join(os.path.dirname(__file__), "data", "timm_names_convnets.json")


def timm_recorded(name) -> dict:
  """{timm name: shape} of timm's `name` at 1000 classes (experiments/make_timm_names_convnets.py)."""
  with open(TIMM_NAMES) as f:
    return {key: tuple(shape) for key, shape in json.load(f)["models"][name].items()}


# The renamings below are written from torchvision's and timm's module trees, apart from jaxnet's
# maps, so that a map that swaps two layers of one shape (a norm's bias and a depthwise
# convolution's) loads other weights than torchvision's and gives other logits.

# A torchvision ConvNeXt block's layers and timm's names for them.
_TIMM_CONVNEXT_BLOCK = {"block.0": "conv_dw", "block.2": "norm", "block.3": "mlp.fc1", "block.5": "mlp.fc2"}


def timm_convnext_name(torchvision_name: str) -> str:
  """What timm names the ConvNeXt tensor torchvision names `torchvision_name`: torchvision's
  features.(2S-2) and features.(2S-1) are the downsampling into and the blocks of timm's
  stages.(S-1)."""
  module, _, leaf = torchvision_name.rpartition(".")
  if module.startswith("classifier."):
    return f"{ {'classifier.0': 'head.norm', 'classifier.2': 'head.fc'}[module]}.{leaf}"
  _, index, *rest = module.split(".")
  index = int(index)
  if index == 0:
    return f"stem.{rest[0]}.{leaf}"
  stage = f"stages.{index // 2}"
  if index % 2 == 0:
    return f"{stage}.downsample.{rest[0]}.{leaf}"
  block = f"{stage}.blocks.{rest[0]}"
  return f"{block}.gamma" if leaf == "layer_scale" else f"{block}.{_TIMM_CONVNEXT_BLOCK['.'.join(rest[1:])]}.{leaf}"


# timm's names of a torchvision EfficientNet block's layers, block.I -> (its convolution, its BN),
# for a block without expansion (timm's depthwise-separable block) and one with it.
_TIMM_EFFICIENTNET_BLOCK = {False: {"0": ("conv_dw", "bn1"), "2": ("conv_pw", "bn2")},
                            True: {"0": ("conv_pw", "bn1"), "1": ("conv_dw", "bn2"), "3": ("conv_pwl", "bn3")}}


def timm_efficientnet_names(tensors: dict) -> dict[str, str]:
  """{torchvision name: timm name} of a torchvision EfficientNet (B0-B7) state dict: features.0 is
  timm's stem, the last of `features` its head, features.S.B timm's blocks.(S-1).B; a block
  expands when it has a block.3."""
  last = max(int(n.split(".")[1]) for n in tensors if n.startswith("features."))

  def rename(name):
    parts = name.split(".")
    if parts[0] == "classifier":
      return f"classifier.{parts[-1]}"
    index, leaf = int(parts[1]), parts[-1]
    if index in (0, last):
      return f"{(('conv_stem', 'bn1') if index == 0 else ('conv_head', 'bn2'))[int(parts[2])]}.{leaf}"
    block, layer, inner = parts[2], parts[4], parts[5]
    expands = f"features.{index}.{block}.block.3.0.weight" in tensors
    prefix = f"blocks.{index - 1}.{block}"
    if inner in ("fc1", "fc2"):
      return f"{prefix}.se.{'conv_reduce' if inner == 'fc1' else 'conv_expand'}.{leaf}"
    return f"{prefix}.{_TIMM_EFFICIENTNET_BLOCK[expands][layer][int(inner)]}.{leaf}"
  return {name: rename(name) for name in tensors}


def timm_named(tensors: dict) -> dict:
  """A torchvision ConvNeXt or EfficientNet state dict under timm's names (timm's ConvNeXt layer
  scale is (C,), not (C, 1, 1))."""
  if any(n.startswith("classifier.2.") for n in tensors):  # ConvNeXt's classifier: norm, flatten, linear
    return {timm_convnext_name(n): v.reshape(-1) if n.endswith("layer_scale") else v for n, v in tensors.items()}
  names = timm_efficientnet_names(tensors)
  return {names[n]: v for n, v in tensors.items()}


@pytest.mark.parametrize("name", ["convnext_tiny", "efficientnet_b0"])
def test_timm_names_are_timms_state_dict(name):
  """jaxnet's timm names and shapes, and those the renamings above give torchvision's, are timm's:
  every tensor of its state dict, no other."""
  recorded = timm_recorded(name)
  setup = dict(cw.SETUPS[name], num_classes=1000)
  assert state_dict_spec(name, setup, "timm")[0] == recorded
  torchvision = state_dict_spec(name, setup)[0]
  renamed = timm_named({n: np.empty(s, bool) for n, s in torchvision.items()})
  assert {n: v.shape for n, v in renamed.items()} == recorded


@pytest.mark.parametrize("name", ["convnext_mini", "efficientnet_b0",
                                  pytest.param("convnext_tiny", marks=pytest.mark.slow)])
def test_timm_named_weights_give_torchvisions_logits(name, tmp_path):
  """The reference weights under timm's names load (the file's names choose the naming) into
  the network torchvision computed the reference logits with."""
  check_logits(name, tmp_path, timm_named)


@pytest.mark.parametrize("name", ["convnext_mini", "convnext_tiny", "efficientnet_b0"])
def test_export_under_timm_names_is_timms_state_dict(name, tmp_path):
  """`--format=torch --names=timm` of the variables read from a torchvision state dict is that
  state dict under timm's names; at timm's sizes, exactly timm's names and shapes."""
  _, variables, tensors = load_reference_weights(name, tmp_path)
  out, expected = export.torch_tensors(variables, name, "timm"), timm_named(tensors)
  assert set(out) == set(expected)
  for key, value in expected.items():
    assert out[key].dtype == value.dtype, key
    np.testing.assert_array_equal(out[key], value, err_msg=key)
  if name != "convnext_mini":
    assert {key: value.shape for key, value in out.items()} == timm_recorded(name)


def test_weights_in_neither_naming_name_both(tmp_path):
  """A file whose names are neither torchvision's nor timm's: the error names each variable
  both ways. A model without timm names, or a V2's fused blocks, refuse a timm export."""
  _, shapes = state_dict_spec("convnext_mini", cw.SETUPS["convnext_mini"])
  path = str(tmp_path / "other.safetensors")
  save_file({"conv0.weight": np.zeros((16, 3, 4, 4), np.float32)}, path)
  with pytest.raises(pretrained.WeightsMismatchError) as info:
    pretrained.fill(shapes, pretrained.load(path, shapes, "convnext_mini"), keep_head=True)
  assert ("missing from the weights: features.0.0.weight (torchvision) or stem.0.weight (timm) "
          "(stem_conv/kernel) (4, 4, 3, 16)") in str(info.value)
  assert "not used by the model: conv0.weight" in str(info.value)
  with pytest.raises(InvalidValueError, match="resnet18 has no timm names in jaxnet: it has torchvision's"):
    export.torch_tensors({}, "resnet18", "timm")
  fused = {"params": {"stage1_block1": {"fused0": {"conv": {"kernel": np.zeros((3, 3, 8, 8))}}}}}
  with pytest.raises(ValueError, match="no timm EfficientNet name: params/stage1_block1/fused0/conv/kernel"):
    export.torch_tensors(fused, "efficientnet_mini", "timm")


@pytest.mark.parametrize("name", ["convnext_tiny", "efficientnet_b0"])
def test_timms_own_model_computes_the_same_logits_from_a_timm_export(name, tmp_path):
  """Real timm (skipped where it is not installed, as in CI): its model loads jaxnet's export
  under timm's names strictly and computes jaxnet's logits for the reference weights."""
  torch = pytest.importorskip("torch")
  # timm imports torchvision, whose compiled operators may not load against a CPU torch wheel of
  # another build (as in experiments/make_reference_logits_convnets.py): these models use none.
  register_fake = torch.library.register_fake
  torch.library.register_fake = lambda *args, **kwargs: (lambda fn: fn)
  try:
    timm = pytest.importorskip("timm")
  finally:
    torch.library.register_fake = register_fake
  setup = cw.SETUPS[name]
  model, variables, _ = load_reference_weights(name, tmp_path)
  tensors = export.torch_tensors(variables, name, "timm")
  theirs = timm.create_model(name, pretrained=False, num_classes=setup["num_classes"]).eval()
  theirs.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=True)
  with torch.no_grad():
    their_logits = theirs(torch.from_numpy(cw.reference_input(setup["image_size"]))).numpy()
  difference = np.abs(jaxnet_logits(model, variables, setup["image_size"]) - their_logits).max()
  print(f"{name}: max |logit - timm's| = {difference:.2e}")
  assert their_logits.std() > 0.1 and difference <= 1e-4


# --- stochastic depth -----------------------------------------------------------------------


def test_stochastic_depth_rates_rise_linearly_as_torchvision():
  # ConvNeXt: 0 at the first block to the size's rate at the last (torchvision's id / (n - 1));
  # EfficientNet: rate * id / n (torchvision's), so the last block stays below the rate.
  def rates(name):
    """{block: its Dropout's rate}, from the module tree flax builds (no compile)."""
    model = models.create(name, num_classes=10)
    x = jnp.zeros((1, 32, 32, 3))
    tree = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x, train=False))
    found = {}
    def record(next_fun, args, kwargs, context):
      if isinstance(context.module, nn.Dropout) and context.module.name == "drop_path":
        found[context.module.scope.path[-2]] = context.module.rate
      return next_fun(*args, **kwargs)
    with nn.intercept_methods(record):
      jax.eval_shape(lambda v: model.apply(v, x, train=False), tree)
    return found
  assert rates("convnext_mini") == {"stage1_block1": 0.0, "stage2_block1": 0.05, "stage2_block2": 0.1}
  # efficientnet_mini: 4 blocks at 0.2; those with a residual connection (1, 3) have a drop_path.
  assert rates("efficientnet_mini") == {"stage1_block1": 0.0, "stage2_block2": 0.1}


def small_residual_nets():
  """One-stage nets of each family whose every block has a residual branch, stochastic depth
  0.9 and no other randomness (ConvNeXt's layer scale at 1: at its 1e-6 init a dropped branch
  would change nothing visible)."""
  from jaxnet.core.models.convnext import ConvNeXt
  from jaxnet.core.models.efficientnet import EfficientNet, Stage
  return {"convnext": ConvNeXt(depths=(3,), widths=(8,), num_classes=4, stochastic_depth=0.9, layer_scale=1.0),
          "efficientnet": EfficientNet((Stage("mb", 2, 3, 1, 8, 8, 3),), head_width=8, num_classes=4,
                                       dropout_rate=0.0, stochastic_depth=0.9)}


@pytest.mark.parametrize("family", ["convnext", "efficientnet"])
def test_stochastic_depth_draws_from_the_steps_dropout_key(family):
  """Training drops whole residual branches per sample, drawn from the `dropout` stream the train
  step feeds from (seed, step): the same key the same output (a resumed run repeats it), another
  key another; eval mode uses no key and drops nothing."""
  model = small_residual_nets()[family]
  x = jnp.asarray(np.random.default_rng(0).standard_normal((8, 8, 8, 3)), jnp.float32)
  variables = numpy_variables(model, x[:1])
  forward = jax.jit(lambda key: model.apply(variables, x, train=True, rngs={"dropout": key},
                                            mutable=["batch_stats"])[0])
  key = H.init_key  # the cheap-to-compile generator: any key shows the dependence
  at_0, at_1, at_0_again = forward(key(0)), forward(key(1)), forward(key(0))
  np.testing.assert_array_equal(at_0, at_0_again)
  assert np.abs(np.asarray(at_0) - np.asarray(at_1)).max() > 1e-5
  # Eval: no key needed, nothing dropped.
  assert jax.jit(lambda: model.apply(variables, x, train=False))().shape == (8, 4)


def numpy_init(model, x):
  """The model's own initial distributions drawn with numpy (compiling its init costs ~10 s of
  CPU): ConvNeXt's kernels N(0, 0.02); EfficientNet's He-normal fan-out convolutions and a head
  uniform in +-1/sqrt(classes); norms at identity, layer scales at 1e-6, biases zero."""
  rng = np.random.default_rng(0)
  shapes = flatten_dict(jax.eval_shape(lambda: model.init(H.init_key(), x, train=False)))
  convnext = type(model).__name__ == "ConvNeXt"

  def draw(path, shape):
    if path[-1] == "kernel" and convnext:
      return rng.normal(0.0, 0.02, shape)
    if path[-1] == "kernel" and path[1] == "head":
      return rng.uniform(-1, 1, shape) / np.sqrt(shape[-1])
    if path[-1] == "kernel":
      return rng.normal(0.0, np.sqrt(2.0 / (math.prod(shape[:-2]) * shape[-1])), shape)
    if path[-1] in ("scale", "var"):
      return np.ones(shape)
    return np.full(shape, 1e-6) if path[-1] == "layer_scale" else np.zeros(shape)
  return unflatten_dict({p: draw(p, s.shape).astype(np.float32) for p, s in shapes.items()})


def numpy_variables(model, x):
  """Variables of `model` drawn with numpy from their shapes: no initializer to compile (XLA:CPU
  takes seconds over the truncated normals). BN variances positive, everything else +-0.5."""
  rng = np.random.default_rng(0)
  shapes = flatten_dict(jax.eval_shape(lambda: model.init(H.init_key(), x, train=False)))
  return unflatten_dict({p: (rng.uniform(0.5, 1.5, s.shape) if p[-1] == "var" else rng.uniform(-0.5, 0.5, s.shape)
                             ).astype(np.float32) for p, s in shapes.items()})


# --- recipes --------------------------------------------------------------------------------


def test_imagenet_recipes_follow_the_published_settings():
  from jaxnet.configs import convnext, efficientnet
  for variant in convnext.VARIANTS:
    assert convnext.get_config(variant).model.name in models.names()
  c = convnext.get_config("tiny")
  assert (c.num_epochs, c.optim.name, c.optim.weight_decay, c.optim.warmup_epochs) == (300, "adamw", 0.05, 20.0)
  assert c.optim.learning_rate * 4096 / c.optim.base_batch_size == pytest.approx(4e-3)
  assert (c.mix.mixup_alpha, c.mix.cutmix_alpha, c.label_smoothing, c.ema_decay) == (0.8, 1.0, 0.1, 0.9999)
  # The sizes' stochastic depth is each model's default.
  assert [models.options(f"convnext_{v}")["stochastic_depth"] for v in ("tiny", "small", "base", "large")] == [
      0.1, 0.4, 0.5, 0.5]
  for variant in efficientnet.VARIANTS:
    assert efficientnet.get_config(variant).model.name in models.names()
  assert [efficientnet.get_config(v).image_size for v in ("b0", "b3", "b7", "v2_s")] == [224, 300, 600, 384]
  assert efficientnet.get_config("v2_s").progressive_resizing == ((0.0, 300),)
  # B5-B7 and V2 use torchvision's BN eps 1e-3 (and B5-B7 momentum 0.01, 0.99 here).
  assert [models.options(n)["bn_epsilon"] for n in ("efficientnet_b4", "efficientnet_b5", "efficientnet_v2_s")] == [
      1e-5, 1e-3, 1e-3]
  assert models.options("efficientnet_b7")["bn_momentum"] == 0.99
  with pytest.raises(ValueError, match=r"variant 'b8'.*--config=efficientnet:b0"):
    efficientnet.get_config("b8")


# Each costs ~15-40 s of CPU compile: the EfficientNet one (batch norm, squeeze-excitation, fused and
# depthwise blocks) runs by default, ConvNeXt's with the slow tests.
@pytest.mark.parametrize("variant", [pytest.param("convnext.py:mini", marks=pytest.mark.slow), "efficientnet.py:mini"])
def test_cpu_recipe_trains_on_digits(variant):
  """The mini recipes' model and optimizer, 30 steps of batch 32 on the digits: the loss falls."""
  from jaxnet.core import config as config_lib
  from jaxnet.core import state as precision
  from jaxnet.core.state import LossScale
  from jaxnet.core.tasks import classification
  from tests.test_alexnet_vit import _digits
  c = config_lib.load(os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", variant))
  policy = precision.get_policy(c.precision)
  model = models.from_config(c.model, 10, policy.compute_dtype)
  size = c.image_size
  variables = numpy_init(model, jnp.zeros((1, size, size, 1)))
  lr = c.optim.learning_rate * 32 / c.optim.base_batch_size
  tx = optax.adamw(lr, weight_decay=c.optim.weight_decay)
  state = H.make_state(variables["params"], variables.get("batch_stats", {}), tx, LossScale.create())
  step = jax.jit(classification.make_train_step(model, tx, lambda s: lr, policy, num_classes=10,
                                                mean=c.data.mean, std=c.data.std))
  losses = []
  for batch in _digits(size, 30, 32):
    state, metrics = step(state, batch)
    losses.append(float(metrics["train/loss"]))
  first, last = np.mean(losses[:8]), np.mean(losses[-8:])
  print(f"\n{c.model.name}: loss {first:.3f} -> {last:.3f}")
  assert np.all(np.isfinite(losses)) and last < 0.85 * first


# torchvision's published GFLOPS (multiply-adds, at the weights' eval size) and that size.
TORCHVISION_GMACS = {"convnext_tiny": (4.46, 224), "efficientnet_b0": (0.39, 224), "efficientnet_v2_s": (8.37, 384)}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TORCHVISION_GMACS))
def test_summary_reports_torchvisions_counts_and_macs(name):
  from jaxnet.tools import summary
  gmacs, size = TORCHVISION_GMACS[name]
  s = summary.summarize(name, image_size=size, batch_size=2, train_step=False)
  assert s["params"] == TORCHVISION_PARAMS[name]
  assert s["conventional_macs"] / 1e9 == pytest.approx(gmacs, abs=0.005)  # measured 4.456, 0.386, 8.366


@pytest.mark.parametrize("name", ["convnext_mini", "efficientnet_mini"])
def test_bf16_convolutions_with_fp32_norms_and_squeeze_excitation(name):
  """In bf16 the convolutions and dense layers run in bf16; every reduction (LayerNorm and BN
  statistics, pooling) and the squeeze-excitation's 1x1 layers in fp32 (lowered only: no compile)."""
  import collections
  import re
  model = models.create(name, num_classes=10, dtype=jnp.bfloat16)
  v = abstract_variables(name, 16, num_classes=10)
  x = jax.ShapeDtypeStruct((2, 16, 16, 3), jnp.float32)
  hlo = jax.jit(lambda v, x: model.apply(v, x, train=True, rngs={"dropout": jax.random.PRNGKey(0)},
                                         mutable=["batch_stats"])).lower(v, x).as_text()
  ops = collections.Counter()
  for line in hlo.splitlines():
    m = re.search(r"stablehlo\.(convolution|dot_general|reduce)\b.*:\s*(.*)$", line)
    if m:
      ops[(m[1], tuple(re.findall(r"x(bf16|f32)>", m[2])))] += 1
  se_layers = 2 * 3 if name == "efficientnet_mini" else 0  # fc1, fc2 of each of the 3 MBConv blocks
  assert ops[("convolution", ("f32", "f32", "f32"))] == se_layers
  assert sum(n for (op, types), n in ops.items() if op == "convolution" and types == ("bf16",) * 3) > 0
  reductions = {types: n for (op, types), n in ops.items() if op == "reduce"}
  assert reductions and all(set(types) == {"f32"} for types in reductions), reductions


def test_import_reads_timm_names_and_export_writes_either(tmp_path):
  """`python -m jaxnet.cli.weights import` takes a timm-named file with no flag; `export
  --format=torch` writes torchvision's names, `--names=timm` timm's, and the metadata says whose."""
  from jaxnet.cli import export as export_command
  from jaxnet.cli import weights as weights_command
  from jaxnet.tools.weights import tensor_files
  _, _, tensors = load_reference_weights("convnext_mini", tmp_path)
  file, workdir = tmp_path / "timm.safetensors", tmp_path / "imported"
  save_file(timm_named(tensors), str(file))
  config = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "resnet.py:runlocal")
  assert weights_command.main(["import", f"--from={file}", f"--config={config}", f"--workdir={workdir}",
                               "--config.model.name=convnext_mini", "--config.data.source=synthetic",
                               "--config.data.num_classes=10", "--config.image_size=16",
                               "--config.batch_size=8", "--config.init.preprocessing=config"]) == 0
  for names, expected in ((None, tensors), ("timm", timm_named(tensors))):
    out = tmp_path / f"export_{names or 'default'}.safetensors"
    assert export_command.main([f"--workdir={workdir}", "--format=torch", f"--out={out}",
                                *([f"--names={names}"] if names else [])]) == 0
    written, metadata = tensor_files.read(str(out))
    assert metadata["names"] == (names or "torchvision") and set(written) == set(expected)
    for key, value in expected.items():
      np.testing.assert_array_equal(written[key], value, err_msg=key)
