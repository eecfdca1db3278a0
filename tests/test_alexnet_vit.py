"""AlexNet and the Vision Transformers: parameter counts, logits against torchvision/timm,
training on digits in fp32 and bf16, and 8 devices against 1 (CPU, small)."""

import collections
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.traverse_util import unflatten_dict
from safetensors.numpy import save_file

from jaxnet.core import experiment

from jaxnet.core import models

from jaxnet.core import sharding as parallel

from jaxnet.core import state as precision

from jaxnet.core import steps

from jaxnet.core.tasks import classification
from jaxnet.tools import summary
from jaxnet.core.models.alexnet import adaptive_avg_pool
from jaxnet.core.models.vit import posemb_sincos_2d
from jaxnet.core.state import LossScale
from jaxnet.core.state import step_key
from jaxnet.tools.weights import alexnet_names, pretrained, vit_names
from tests import models_helpers as H
from tests.helpers import REPO
from tests import torch_weights as tw
from tests.test_parallel import make_config, rel_diff, run_steps
from tests.test_torch_reference import model_shapes

REFERENCE = os.path.join(os.path.dirname(__file__), "data", "reference_logits_alexnet_vit.npz")

# torchvision's alexnet and timm's vit_*_patch16_224 and vit_huge_patch14_224 (1000 classes, 224px;
# torchvision's vit_h_14 publishes the same 632,045,800).
PUBLISHED_PARAMS = {
    "alexnet": 61_100_840,
    "vit_ti16": 5_717_416,
    "vit_s16": 22_050_664,
    "vit_b16": 86_567_656,
    "vit_l16": 304_326_632,
    "vit_h14": 632_045_800,
}


def _abstract_variables(name, image=(224, 224, 3), **options):
  model = models.create(name, **options)
  # eval_shape: nothing the size of ViT-L is allocated.
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1,) + image), train=False))


def _count(tree):
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_param_counts_match_torchvision_and_timm(name):
  variables = _abstract_variables(name)
  assert list(variables) == ["params"]  # no batch norm, so no batch_stats
  assert _count(variables["params"]) == PUBLISHED_PARAMS[name]


def test_plain_vit_params_and_learned_pos_embedding_guard():
  # plain: no class token (D) and no learned position embedding (197 D), plus a D x D tanh pre-logits layer.
  d = 384
  plain = _count(_abstract_variables("vit_s16", flavour="plain")["params"])
  assert plain == PUBLISHED_PARAMS["vit_s16"] - d - 197 * d + d * d + d
  # Shapes only (eval_shape): the checks below run at trace time.
  timm_style = models.create("vit_mini", num_classes=3)
  v = _abstract_variables("vit_mini", (16, 16, 1), num_classes=3)
  with pytest.raises(ValueError, match=r"position embedding is for 16 patches.*flavour=plain"):
    jax.eval_shape(lambda v: timm_style.apply(v, jnp.zeros((1, 32, 32, 1)), train=False), v)
  plain_mini = models.create("vit_mini", num_classes=3, flavour="plain")
  pv = _abstract_variables("vit_mini", (16, 16, 1), num_classes=3, flavour="plain")
  out = jax.eval_shape(lambda v: plain_mini.apply(v, jnp.zeros((2, 32, 32, 1)), train=False), pv)
  assert out.shape == (2, 3)  # a fixed embedding fits any image size
  with pytest.raises(ValueError, match="flavour 'tok'"):
    _abstract_variables("vit_mini", (16, 16, 1), flavour="tok")


def test_summary_tool_reports_the_published_counts():
  # AlexNet's count does not depend on the input size (adaptive pool), so a small image is enough.
  s = summary.summarize("alexnet", image_size=64, batch_size=2, train_step=False)
  assert s["params"] == PUBLISHED_PARAMS["alexnet"] and s["bn_stats"] == 0
  s = summary.summarize("vit_ti16", image_size=224, batch_size=2, train_step=False)
  assert s["params"] == PUBLISHED_PARAMS["vit_ti16"]
  # timm's published 1.26 GMACs for vit_tiny_patch16_224 (patch conv, qkv, attention, MLPs, head).
  assert 1.25e9 < s["conventional_macs"] < 1.27e9


def test_adaptive_avg_pool_uses_pytorch_bins():
  x = np.arange(2 * 7 * 9 * 3, dtype=np.float32).reshape(2, 7, 9, 3)
  out = np.asarray(adaptive_avg_pool(jnp.asarray(x), 6))
  for i in range(6):
    for j in range(6):
      r0, r1 = (i * 7) // 6, -(-((i + 1) * 7) // 6)
      c0, c1 = (j * 9) // 6, -(-((j + 1) * 9) // 6)
      np.testing.assert_allclose(out[:, i, j], x[:, r0:r1, c0:c1].mean(axis=(1, 2)), rtol=1e-6)
  # A 6x6 map (224px input) passes through unchanged.
  y = np.random.default_rng(0).standard_normal((1, 6, 6, 4)).astype(np.float32)
  np.testing.assert_allclose(adaptive_avg_pool(jnp.asarray(y), 6), y, rtol=1e-6)


def test_sincos_position_embedding():
  pe = posemb_sincos_2d(3, 4, 8)
  assert pe.shape == (1, 12, 8)
  # Token (row 1, col 2): frequencies 1 and 1/10000 for each of sin(col), cos(col), sin(row), cos(row).
  f = np.array([1.0, 1e-4])
  np.testing.assert_allclose(pe[0, 1 * 4 + 2], np.concatenate([np.sin(2 * f), np.cos(2 * f),
                                                                np.sin(1 * f), np.cos(1 * f)]), rtol=1e-6)


def test_vit_bf16_matmuls_with_fp32_softmax_and_layernorm_statistics():
  model = models.create("vit_mini", num_classes=10, dtype=jnp.bfloat16)
  v = _abstract_variables("vit_mini", (16, 16, 1), num_classes=10)
  x = jax.ShapeDtypeStruct((2, 16, 16, 1), jnp.float32)
  hlo = jax.jit(lambda v, x: model.apply(v, x, train=False)).lower(v, x).as_text()
  ops = collections.Counter()
  for line in hlo.splitlines():
    m = re.search(r"stablehlo\.(dot_general|exponential|reduce|convolution|rsqrt)\b.*:\s*(.*)$", line)
    if m:
      ops[(m[1], tuple(re.findall(r"x(bf16|f32)>", m[2])))] += 1
  # Per block: qkv, proj, fc1, fc2 and attention-weights x values on bf16 operands, and
  # q x k on bf16 operands into f32 logits; the head is f32.
  assert ops[("dot_general", ("bf16", "bf16", "bf16"))] == 5 * 2
  assert ops[("dot_general", ("bf16", "bf16", "f32"))] == 2
  assert ops[("convolution", ("bf16", "bf16", "bf16"))] == 1          # the patch embedding
  # Softmax exponentials and every reduction (softmax max/sum, LayerNorm moments) in f32.
  assert ops[("exponential", ("f32",))] == 2
  assert {dtypes for (op, dtypes) in ops if op in ("reduce", "rsqrt", "exponential")} <= {("f32",) * n for n in range(1, 9)}
  assert sum(n for (op, _), n in ops.items() if op == "reduce") >= 2 * 2 + 2 * 2


# --- the same logits as torchvision and timm -----------------------------------------------


def _reference(key):
  assert os.path.exists(REFERENCE), "run experiments/make_reference_logits_alexnet_vit.py"
  return np.load(REFERENCE)[key]


def _load_drawn(name, tensors, setup, tmp_path):
  """`tensors` written to a .safetensors file and read back as `init.weights` reads it."""
  path = str(tmp_path / f"{name}.safetensors")
  save_file(tensors, path)
  shapes = model_shapes(models.create(name), size=setup["image_size"])
  values, head_reason = pretrained.fill(shapes, pretrained.load(path, shapes, name), keep_head=True)
  assert head_reason is None and set(values) == set(shapes)  # every variable, head included
  return unflatten_dict(values)


def _logits(name, variables, setup):
  x = tw.reference_input(setup["input_seed"], setup["batch"], setup["image_size"]).transpose(0, 2, 3, 1)
  model = models.create(name)
  return np.asarray(jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, x))


def test_alexnet_logits_match_torchvision(tmp_path):
  setup = tw.ALEXNET_SETUP
  sd = tw.draw(tw.alexnet_spec(), setup["weights_seed"])
  ours = _logits("alexnet", _load_drawn("alexnet", sd, setup, tmp_path), setup)
  ref = _reference("alexnet")
  assert np.abs(ref).max() > 0.5  # logits of order one: the tolerance below means something
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_vit_tiny_logits_match_timm(tmp_path):
  setup = tw.VIT_SETUP
  sd = tw.draw(tw.vit_tiny_spec(setup["image_size"]), setup["weights_seed"])
  ours = _logits("vit_ti16", _load_drawn("vit_ti16", sd, setup, tmp_path), setup)
  ref = _reference("vit_tiny")
  assert np.abs(ref).max() > 0.5
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["alexnet", "vit_ti16"])
def test_export_writes_back_the_reference_state_dict(name, tmp_path):
  """`--format=torch` of the variables loaded from the reference state dict is that state
  dict again, every name, layout and value: torchvision's alexnet and timm's ViT load it
  strictly and compute the reference logits the tests above compare with."""
  from jaxnet.tools.weights import export
  setup = tw.ALEXNET_SETUP if name == "alexnet" else tw.VIT_SETUP
  spec = tw.alexnet_spec() if name == "alexnet" else tw.vit_tiny_spec(setup["image_size"])
  sd = tw.draw(spec, setup["weights_seed"])
  out = export.torch_tensors(_load_drawn(name, sd, setup, tmp_path), name)
  assert set(out) == set(sd)
  for key, value in sd.items():
    assert out[key].dtype == value.dtype and out[key].flags.c_contiguous, key
    np.testing.assert_array_equal(out[key], value, err_msg=key)


def test_plain_vit_export_is_an_error_naming_the_flavour(tmp_path):
  import types
  from jaxnet import api
  from jaxnet.tools.weights import export
  from tests.helpers import REPO
  config = api.load_config(os.path.join(REPO, "configs", "vit.py:ti16"))
  assert config.model.flavour == "plain"  # the recipe's flavour
  predictor = types.SimpleNamespace(config=config, variables={}, num_classes=10, class_names=None,
                                    workdir=str(tmp_path), step=1)
  with pytest.raises(ValueError, match=r"flavour='plain' has no timm counterpart.*--format=jax"):
    export.save(predictor, str(tmp_path / "vit.safetensors"))
  assert not os.path.exists(tmp_path / "vit.safetensors")


@pytest.mark.parametrize("name,family", [("alexnet_mini", alexnet_names.FAMILY),
                                         ("vit_mini", vit_names.FAMILY)])
def test_weights_names_and_layouts_invert(name, family):
  """Every variable has a PyTorch name that maps back to it, and the layouts invert."""
  shapes = model_shapes(models.create(name, num_classes=5), size=64 if name.startswith("alex") else 16)
  rng = np.random.default_rng(0)
  jaxnet_path = family.inverse(shapes)
  for path, shape in shapes.items():
    torch_name = family.torch_name(path)
    assert torch_name is not None and jaxnet_path[torch_name] == path, path
    value = rng.standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(
        family.from_torch_layout(path, family.to_torch_layout(path, value), shape), value,
        err_msg=str(path))


def test_alexnet_weights_fc1_rows_follow_the_flatten_order():
  # torchvision's fc1 input index is c * 36 + h * 6 + w; jaxnet's is (h * 6 + w) * C + c.
  c, fout = 4, 3
  torch_w = np.arange(fout * c * 36, dtype=np.float32).reshape(fout, c * 36)
  ours = alexnet_names.FAMILY.from_torch_layout(("params", "fc1", "kernel"), torch_w, (c * 36, fout))
  for h, w, ch, o in [(0, 0, 1, 2), (5, 2, 3, 0), (1, 4, 0, 1)]:
    assert ours[(h * 6 + w) * c + ch, o] == torch_w[o, ch * 36 + h * 6 + w]


def test_vit_weights_mismatch_is_one_error_in_timm_names(tmp_path):
  shapes = model_shapes(models.create("vit_mini", num_classes=5), size=16)
  vit = vit_names.FAMILY
  tensors = {vit.torch_name(p): np.zeros(vit.to_torch_layout(p, np.empty(s, bool)).shape, np.float32)
             for p, s in shapes.items()}
  del tensors["blocks.0.mlp.fc1.bias"]
  tensors["blocks.0.norm1.weight"] = np.zeros(7, np.float32)
  tensors["fc_norm.weight"] = np.zeros(3, np.float32)
  path = str(tmp_path / "vit.safetensors")
  save_file(tensors, path)
  with pytest.raises(pretrained.WeightsMismatchError) as error:
    pretrained.fill(shapes, pretrained.load(path, shapes, "vit_mini"), keep_head=True,
                    spec="init.weights=v")
  message = str(error.value)
  assert "missing from the weights: blocks.0.mlp.fc1.bias (block0/fc1/bias)" in message
  assert "not used by the model: fc_norm.weight" in message
  assert "shape differs: blocks.0.norm1.weight (block0/norm1/scale) is (7,)" in message
  assert "(3 problems;" in message
  # A model family without PyTorch names is refused by name.
  with pytest.raises(ValueError, match="model 'lenet' has no PyTorch tensor names"):
    pretrained.load(path, shapes, "lenet")


# --- training -----------------------------------------------------------------------------

# (model, image size, Adam's learning rate): AlexNet needs >= 63px, so its digits are upsampled to 64.
TRAINED = [("alexnet_mini", 64, 2e-3), ("vit_mini", 16, 3e-3)]


def _digits(size, num, batch):
  from jaxnet.core.data.sources import digits_source
  src = digits_source("train", size)
  rng = np.random.default_rng(0)
  out = []
  for _ in range(num):
    idx = rng.choice(len(src), batch, replace=False)
    out.append({"image": src.images[idx], "label": src.labels[idx], "mask": np.ones(batch, bool),
                "corrupt": np.zeros(batch, np.int32)})
  return out


# bf16 in the slow run (25 s): bf16 training is held in the default run by test_precision.py.
@pytest.mark.parametrize("policy_name", ["fp32", pytest.param("bf16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name,size,lr", TRAINED)
def test_trains_on_digits(name, size, lr, policy_name):
  policy = precision.get_policy(policy_name)
  model = models.create(name, num_classes=10, dtype=policy.compute_dtype)
  variables = jax.jit(lambda: model.init(H.init_key(), jnp.zeros((1, size, size, 1)), train=False))()
  assert "batch_stats" not in variables
  tx = optax.adamw(lr, weight_decay=1e-4)
  state = H.make_state(variables["params"], {}, tx, LossScale.create())
  step = jax.jit(classification.make_train_step(model, tx, lambda s: lr, policy, num_classes=10,
                                       mean=(0.2,), std=(0.35,)))
  losses, accuracies = [], []
  for batch in _digits(size, 40, 32):
    state, metrics = step(state, batch)
    losses.append(float(metrics["train/loss"]))
    accuracies.append(float(metrics["train/accuracy"]))
  first, last = np.mean(losses[:10]), np.mean(losses[-10:])
  print(f"\n{name} {policy_name}: loss {first:.3f} -> {last:.3f}, "
        f"accuracy {np.mean(accuracies[:10]):.2f} -> {np.mean(accuracies[-10:]):.2f}")
  assert np.all(np.isfinite(losses))
  # 40 steps from chance (loss ln 10 = 2.30, accuracy 0.1); 10-step means move by ~0.02 from noise.
  assert last < 0.9 * first
  assert np.mean(accuracies[-10:]) > np.mean(accuracies[:10]) + 0.1
  assert state.batch_stats == {}
  leaves = jax.tree.leaves(state.params)
  assert all(p.dtype == jnp.float32 for p in leaves)  # fp32 master weights in bf16 too


def test_dropout_masks_come_from_the_seed_and_step():
  """The train step feeds AlexNet's dropout from step_key(state): a new mask each step,
  the same mask for the same (seed, step), as a resumed run needs."""
  model = models.create("alexnet_mini", num_classes=10)
  x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 64, 64, 1)), jnp.float32)
  variables = jax.jit(lambda: model.init(H.init_key(), x[:1], train=False))()
  forward = jax.jit(lambda key: model.apply(variables, x, train=True, rngs={"dropout": key}))
  state = H.make_state(variables["params"], {}, optax.sgd(0.1), LossScale.create())
  key = lambda step: step_key(state.replace(step=jnp.int32(step)))
  at_0, at_1, at_0_again = forward(key(0)), forward(key(1)), forward(key(0))
  assert np.abs(np.asarray(at_0) - np.asarray(at_1)).max() > 1e-4
  np.testing.assert_array_equal(at_0, at_0_again)
  # eval mode has no dropout: the same logits every call, without any key.
  evaluate = jax.jit(lambda: model.apply(variables, x, train=False))
  np.testing.assert_array_equal(evaluate(), evaluate())
  assert np.abs(np.asarray(evaluate()) - np.asarray(at_0)).max() > 1e-4


# --- 8 devices train like 1 ---------------------------------------------------------------

PARALLEL = {
    # AlexNet with dropout, ViT with CutMix (a Beta draw, a box, the batch rolled across
    # devices): the random parts must not depend on the sharding. Mixup shares all of
    # that but the box, and each Beta sampler costs ~7 s of CPU compile. (SGD: Adam's first
    # steps amplify float rounding in ~0 gradients, which would measure Adam, not the step.)
    "alexnet_mini": {"image_size": 64},
    # mix.groups fixed, so that the 1-device run pairs examples as the 8-device one does.
    "vit_mini": {"mix.cutmix_alpha": 1.0, "mix.groups": 8},
}


# vit_mini in the slow run (30 s): 8 devices against one stays in the default run for alexnet_mini here
# and for ResNets in test_parallel.py.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "vit_mini" else n
                                  for n in sorted(PARALLEL)])
def test_each_step_on_eight_devices_matches_one_device(name):
  """From the same state and batch, one step on 8 devices = one step on 1 device (2 steps)."""
  extra = {"model.name": name, "total_steps": 2, **PARALLEL[name]}
  exp1 = experiment.Experiment(make_config(1, **extra))
  exp8 = experiment.Experiment(make_config(8, **extra))
  # The init with the cheap-to-compile key (tests/models_helpers.py), not the Experiment's.
  image = jnp.zeros((1,) + exp1.image_shape)
  variables = jax.jit(lambda: exp1.model.init(H.init_key(), image, train=False))()
  assert "batch_stats" not in variables
  init = jax.device_get(H.make_state(variables["params"], {}, exp1.tx, LossScale.create()))
  loader = iter(exp1.train_loader())
  batches = [next(loader) for _ in range(2)]
  _, states1, losses1 = run_steps(exp1, init, batches)
  step8 = exp8.train_step.lower(jax.device_put(init, exp8.state_sharding),
                                parallel.to_global(batches[0], exp8.batch_sharding)).compile()
  worst, losses8 = 0.0, []
  for state, batch, after_1 in zip([init] + states1[:-1], batches, states1):
    after_8, metrics = step8(jax.device_put(state, exp8.state_sharding),
                             parallel.to_global(batch, exp8.batch_sharding))
    after_8 = jax.device_get(after_8)
    losses8.append(float(metrics["train/loss"]))
    worst = max(worst, rel_diff(after_8.params, after_1.params), rel_diff(after_8.opt_state, after_1.opt_state))
  print(f"\n{name}: worst single-step rel diff, 8 vs 1 devices: {worst:.2e}")
  assert worst <= 1e-5
  assert rel_diff(states1[-1].params, init.params) > 1e-4  # the steps really moved the weights
  np.testing.assert_allclose(losses8, losses1, rtol=1e-5)


def test_vit_config_variants_follow_the_big_vision_recipe():
  from jaxnet.configs import vit
  for variant in vit.VARIANTS:
    c = vit.get_config(variant)
    assert c.model.name == f"vit_{variant}" and c.model.name in models.names()
  c = vit.get_config("s16")
  assert (c.batch_size, c.num_epochs, c.optim.name, c.optim.mu_dtype) == (1024, 90, "adamw", "bfloat16")
  # big_vision's decoupled wd 1e-4 at lr 1e-3 is optax's coupled 0.1: lr * wd = 1e-4 at the peak.
  assert c.optim.learning_rate * c.optim.weight_decay == pytest.approx(1e-4)
  assert c.optim.learning_rate * c.batch_size / c.optim.base_batch_size == pytest.approx(1e-3)
  assert (c.optim.warmup_steps, c.optim.schedule, c.optim.grad_clip_norm) == (10_000, "cosine", 1.0)
  assert (c.data.randaug_num_ops, c.data.randaug_magnitude, c.mix.mixup_alpha) == (2, 10, 0.2)
  assert c.model.flavour == "plain"
  # Only ViT-H/14 splits its state (FSDP) and its batch (2 micro-batches) to fit 80 GB GPUs.
  assert [(v, vit.get_config(v).mesh.fsdp, vit.get_config(v).grad_accum_steps) for v in ("l16", "h14")] == [
      ("l16", False, 1), ("h14", True, 2)]
  with pytest.raises(ValueError, match=r"variant 's32'.*--config=vit:s16"):
    vit.get_config("s32")


def test_model_options_are_the_models_fields_passed_straight_to_it():
  from jaxnet.configs import digits
  from jaxnet.core import config as config_lib
  c = config_lib.load(os.path.join(REPO, "configs", "digits.py"))
  # digits sets zero_init_last_bn=False, a ResNet option; load fills in the others at ResNet's defaults.
  assert c.model.zero_init_last_bn is False and c.model.bn_momentum == 0.9
  assert models.from_config(c.model, 10, jnp.float32).zero_init_last_bn is False
  # Switching the model keeps only the options the new model has.
  c = config_lib.load(os.path.join(REPO, "configs", "digits.py"),
                      {"model.name": "vit_mini", "model.flavour": "plain"})
  assert "zero_init_last_bn" not in c.model and c.model.flavour == "plain"
  assert models.from_config(c.model, 10, jnp.float32).flavour == "plain"
  # A key the model does not have is an error naming it and the model.
  bad = digits.get_config()
  bad.model.name, bad.model.flavour = "alexnet_mini", "plain"
  with pytest.raises(ValueError, match=r"config.model.flavour: model 'alexnet_mini' has no option 'flavour'"):
    config_lib.with_model_options(bad)
  with pytest.raises(ValueError, match=r"config.model.flavour: model 'alexnet_mini' has no"):
    models.from_config(bad.model, 10, jnp.float32)
  alexnet = config_lib.switch_model(bad, "alexnet_mini").model
  with pytest.raises(ValueError, match="bn_group_size is set, but alexnet_mini has no batch norm"):
    models.from_config(alexnet, 10, jnp.float32, bn_num_groups=2)
  assert models.from_config(alexnet, 10, jnp.float32).dropout_rate == 0.5
  assert "bn_momentum" in models.options("resnet_tiny") and "bn_momentum" not in models.options("vit_s16")
  assert models.options("resnet_tiny")["width"] == 16  # the registry's keyword is the default
