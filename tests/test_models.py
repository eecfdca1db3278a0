"""ResNet registry, parameter counts, BN options, NHWC layout and the summary tool (CPU, small)."""

import functools
import math
import re
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxnet.core import models

from jaxnet.core import state as precision

from jaxnet.core import steps

from jaxnet.core.tasks import classification
from jaxnet.core.models import resnet
from jaxnet.cli import summary as summary_command
from jaxnet.tools import summary
from jaxnet.core.models.batchnorm import BatchNorm
from jaxnet.core.state import LossScale

from tests import models_helpers as H

# torchvision's published parameter counts (1000 classes), e.g. the "num_params"
# of ResNet50_Weights.IMAGENET1K_V1 etc.; our v1.5 models differ from them only
# in where the stride sits, which does not change the count.
TORCHVISION_PARAMS = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
}


def _param_count(name, num_classes=1000, image=(64, 64, 3)):
  model = models.create(name, num_classes=num_classes)
  # eval_shape: shapes only, nothing the size of a ResNet-152 is allocated.
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1,) + image), train=False))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(variables["params"]))


def _reference_count(stages, bottleneck, stem, num_classes, width=64, in_ch=3):
  """Parameter count of the torchvision architecture, written out layer by layer."""
  bn = lambda c: 2 * c  # scale + bias
  n = (7 * 7 if stem == "imagenet" else 3 * 3) * in_ch * width + bn(width)
  cin = width
  for s, blocks in enumerate(stages):
    f = width * 2**s
    for b in range(blocks):
      stride = 2 if s > 0 and b == 0 else 1
      if bottleneck:
        cout = 4 * f
        n += cin * f + bn(f) + 9 * f * f + bn(f) + f * cout + bn(cout)
      else:
        cout = f
        n += 9 * cin * f + bn(f) + 9 * f * f + bn(f)
      if cin != cout or stride != 1:
        n += cin * cout + bn(cout)  # 1x1 projection + its BN
      cin = cout
  return n + cin * num_classes + num_classes


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_param_counts_match_torchvision(name):
  assert _param_count(name) == TORCHVISION_PARAMS[name]


@pytest.mark.parametrize("name,stages,bottleneck,stem,width,classes,in_ch", [
    ("resnet200", [3, 24, 36, 3], True, "imagenet", 64, 1000, 3),
    ("resnet50_small", [3, 4, 6, 3], True, "small", 64, 10, 3),
    ("resnet18_small", [2, 2, 2, 2], False, "small", 64, 100, 3),
    ("resnet_tiny", [1, 1, 1], False, "small", 16, 10, 1),
])
def test_param_counts_match_layer_by_layer_formula(name, stages, bottleneck, stem, width, classes, in_ch):
  expected = _reference_count(stages, bottleneck, stem, classes, width, in_ch)
  assert _param_count(name, classes, (32, 32, in_ch)) == expected
  # The formula reproduces torchvision's resnet50 number too, so it is the same architecture.
  assert _reference_count([3, 4, 6, 3], True, "imagenet", 1000) == TORCHVISION_PARAMS["resnet50"]


def test_registry():
  names = models.names()
  for depth in (18, 34, 50, 101, 152, 200):
    assert f"resnet{depth}" in names and f"resnet{depth}_small" in names
  assert models.create("resnet50").stem == "imagenet"
  assert models.create("resnet50_small").stem == "small"
  with pytest.raises(ValueError, match="resnet50"):
    models.create("resnet51")
  with pytest.raises(ValueError, match="twice"):
    models.register("resnet50")(lambda **kw: None)


# --- batch norm options -----------------------------------------------------------------

def _bn_reference(x, scale, bias, eps):
  x = x.astype(np.float64)
  mean = x.mean(axis=(0, 1, 2))
  var = ((x - mean) ** 2).mean(axis=(0, 1, 2))  # two-pass, float64
  return (x - mean) / np.sqrt(var + eps) * scale + bias, mean, var


def test_bn_num_groups_two_normalizes_each_half_separately():
  rng = np.random.default_rng(0)
  # The halves have different distributions, so group and global statistics differ a lot.
  x = np.concatenate([rng.normal(3.0, 2.0, (4, 3, 3, 5)), rng.normal(-1.0, 0.5, (4, 3, 3, 5))]).astype(np.float32)
  scale, bias = rng.uniform(0.5, 1.5, 5).astype(np.float32), rng.normal(size=5).astype(np.float32)
  variables = {"params": {"scale": scale, "bias": bias},
               "batch_stats": {"mean": np.zeros(5, np.float32), "var": np.ones(5, np.float32)}}
  apply = lambda bn: jax.jit(lambda v, x: bn.apply(v, x, train=True, mutable=["batch_stats"]))
  y, upd = apply(BatchNorm(momentum=0.8, epsilon=1e-3, num_groups=2))(variables, x)

  ya, ma, va = _bn_reference(x[:4], scale, bias, 1e-3)
  yb, mb, vb = _bn_reference(x[4:], scale, bias, 1e-3)
  np.testing.assert_allclose(y, np.concatenate([ya, yb]), atol=2e-5)
  # Running statistics: momentum update towards the average of the group statistics.
  np.testing.assert_allclose(upd["batch_stats"]["mean"], 0.2 * (ma + mb) / 2, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(upd["batch_stats"]["var"], 0.8 + 0.2 * (va + vb) / 2, rtol=1e-5)

  y_global, _ = apply(BatchNorm(epsilon=1e-3))(variables, x)
  y_ref_global, _, _ = _bn_reference(x, scale, bias, 1e-3)
  np.testing.assert_allclose(y_global, y_ref_global, atol=2e-5)
  assert np.abs(np.asarray(y_global) - np.asarray(y)).max() > 0.5  # grouping really changed the result


def _perturb_bn_scales(params, seed=0):
  # Zero-init silences every residual branch; random BN scales make every BN matter.
  rng = np.random.default_rng(seed)
  def f(path, p):
    if path[-1].key == "scale":
      return rng.uniform(0.5, 1.5, p.shape).astype(np.float32)
    return p
  return jax.tree_util.tree_map_with_path(f, params)


@functools.lru_cache(maxsize=None)
def _tiny_bn_forward(bn_num_groups):
  """Jitted train-mode forward of resnet_tiny (BN momentum 0.25, epsilon 0.5), capturing
  every module's output, with random BN scales (zero-init would silence residual branches)."""
  v = H.tiny_variables()
  params = _perturb_bn_scales(v["params"])
  model = models.create("resnet_tiny", num_classes=10, bn_num_groups=bn_num_groups,
                        bn_momentum=0.25, bn_epsilon=0.5)
  fwd = jax.jit(lambda x: model.apply({"params": params, "batch_stats": v["batch_stats"]}, x, train=True,
                                      mutable=["batch_stats", "intermediates"], capture_intermediates=True))
  return fwd, params


def test_model_with_two_bn_groups_equals_two_separate_half_batches():
  grouped, _ = _tiny_bn_forward(2)
  plain, _ = _tiny_bn_forward(1)
  rng = np.random.default_rng(1)
  a = rng.normal(0.0, 1.0, (4,) + H.TINY_SHAPE).astype(np.float32)
  b = rng.normal(2.0, 3.0, (4,) + H.TINY_SHAPE).astype(np.float32)
  # If the group count were not plumbed through, the whole-batch statistics of
  # these two very different halves would make the logits differ by O(1).
  logits_ab, upd_ab = grouped(np.concatenate([a, b]))
  logits_a, upd_a = plain(a)
  logits_b, upd_b = plain(b)
  np.testing.assert_allclose(logits_ab, np.concatenate([logits_a, logits_b]), rtol=1e-4, atol=1e-4)
  # Running stats of the grouped model = mean of what each half alone would give.
  jax.tree.map(lambda g, x, y: np.testing.assert_allclose(g, (x + y) / 2, rtol=1e-4, atol=1e-5),
               upd_ab["batch_stats"], upd_a["batch_stats"], upd_b["batch_stats"])


def test_bn_momentum_and_epsilon_reach_every_bn():
  fwd, params = _tiny_bn_forward(1)
  x = np.random.default_rng(2).normal(size=(4,) + H.TINY_SHAPE).astype(np.float32)
  _, state = fwd(x)
  conv_out = np.asarray(state["intermediates"]["stem_conv"]["__call__"][0], np.float64)
  bn_out = np.asarray(state["intermediates"]["stem_bn"]["__call__"][0])
  p = params["stem_bn"]
  ref, mean, var = _bn_reference(conv_out, p["scale"], p["bias"], 0.5)
  np.testing.assert_allclose(bn_out, ref, atol=1e-4)
  stats = state["batch_stats"]["stem_bn"]
  np.testing.assert_allclose(stats["mean"], 0.75 * mean, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(stats["var"], 0.25 + 0.75 * var, rtol=1e-4)
  # Every BN in the model updated its running variance away from the initial 1.
  n_bn = 0
  for name, s in jax.tree_util.tree_flatten_with_path(state["batch_stats"])[0]:
    if name[-1].key == "var":
      assert not np.allclose(s, 1.0)
      n_bn += 1
  assert n_bn == 9  # stem + 2 per block x 3 blocks + 2 projections


# --- zero-init of the last BN of each block ---------------------------------------------

def _intermediate(state, *path):
  node = state["intermediates"]
  for p in path:
    node = node[p]
  return np.asarray(node["__call__"][0])


def test_zero_init_basic_blocks_start_as_identity_or_projection():
  v = H.tiny_variables(zero_init_last_bn=True)
  for block in ("stage1_block1", "stage2_block1", "stage3_block1"):
    assert np.all(v["params"][block]["BatchNorm_1"]["scale"] == 0)  # last BN of the block
    assert np.all(v["params"][block]["BatchNorm_0"]["scale"] == 1)
  model = models.create("resnet_tiny", num_classes=10)
  x = np.random.default_rng(3).normal(size=(4,) + H.TINY_SHAPE).astype(np.float32)

  @jax.jit
  def run(params):
    _, st = model.apply({"params": params, "batch_stats": v["batch_stats"]}, x, train=True,
                        mutable=["batch_stats", "intermediates"], capture_intermediates=True)
    return st

  st = run(v["params"])
  block_in = np.maximum(_intermediate(st, "stem_bn"), 0)  # relu(stem_bn(stem_conv(x)))
  out1 = _intermediate(st, "stage1_block1")
  np.testing.assert_array_equal(out1, np.maximum(block_in, 0))           # identity block: relu(x)
  out2 = _intermediate(st, "stage2_block1")
  proj2 = _intermediate(st, "stage2_block1", "proj_bn")
  np.testing.assert_array_equal(out2, np.maximum(proj2, 0))              # projection block: relu(proj(x))
  assert np.abs(out1).max() > 0.1 and np.abs(out2).max() > 0.1

  # Control: a non-zero last-BN scale makes the residual branch visible.
  ones = jax.tree_util.tree_map_with_path(
      lambda p, a: np.ones_like(a) if p[-1].key == "scale" else a, v["params"])
  st = run(ones)
  assert np.abs(_intermediate(st, "stage1_block1") - np.maximum(_intermediate(st, "stem_bn"), 0)).max() > 1e-2


def test_zero_init_bottleneck_block_starts_as_projection():
  model = resnet.ResNet([1, 1], resnet.BottleneckBlock, num_classes=10, width=8, stem="small")
  x = np.random.default_rng(4).normal(size=(2, 8, 8, 3)).astype(np.float32)

  @jax.jit
  def init_and_apply():
    v = model.init(H.init_key(), x, train=False)
    return v, model.apply(v, x, train=True, mutable=["batch_stats", "intermediates"],
                          capture_intermediates=True)[1]
  v, st = init_and_apply()
  for block in ("stage1_block1", "stage2_block1"):
    assert np.all(np.asarray(v["params"][block]["BatchNorm_2"]["scale"]) == 0)
  for block in ("stage1_block1", "stage2_block1"):
    np.testing.assert_array_equal(_intermediate(st, block), np.maximum(_intermediate(st, block, "proj_bn"), 0))
  # The residual branch is not trivially zero: its pre-BN output is live.
  assert np.abs(_intermediate(st, "stage1_block1", "Conv_2")).max() > 1e-2


# --- NHWC layout of the lowered train step ----------------------------------------------

# dimension_numbers of the three convolutions jax emits per NHWC/HWIO conv layer in a
# train step (b=batch, f=feature, 0/1=spatial; i/o=kernel in/out features):
FORWARD = "[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]"       # NHWC x HWIO -> NHWC
INPUT_GRAD = "[b, 0, 1, f]x[0, 1, o, i]->[b, 0, 1, f]"    # NHWC out-grad x HWIO kernel read as HWOI
KERNEL_GRAD = "[f, 0, 1, b]x[i, 0, 1, o]->[0, 1, b, f]"   # NHWC activation x NHWC out-grad -> HWIO
NHWC_CONVS = (FORWARD, INPUT_GRAD, KERNEL_GRAD)


def layout_problems(stablehlo: str) -> list[str]:
  """Everything in a lowered module that is not an NHWC/HWIO convolution pipeline.

  1. every convolution has one of the three NHWC dimension_numbers above: the
     spatial dims of each activation are dims 1,2 of an NHWC array (an NCHW
     model shows `[b, f, 0, 1]`);
  2. no transpose of rank >= 3: no activation or conv kernel is ever relaid out
     (the only transposes left are rank-2 ones of the dense head).
  """
  problems = [f"convolution with non-NHWC dim_numbers {dn}: {lhs} x {rhs}"
              for dn, lhs, rhs, _ in H.convolutions(stablehlo) if dn not in NHWC_CONVS]
  problems += [f"rank-{H._rank(i)} transpose {i} -> {o}" for i, o in H.transposes(stablehlo)
               if H._rank(i) >= 3]
  return problems


@functools.lru_cache(maxsize=None)
def _lowered_resnet50_step(policy_name="bf16", image=32, batch=2):
  policy = precision.get_policy(policy_name)
  model = models.create("resnet50", num_classes=10, dtype=policy.compute_dtype)
  tx = optax.sgd(0.1, momentum=0.9)
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, image, image, 3)), train=False))
  state = jax.eval_shape(lambda v: H.make_state(v["params"], v["batch_stats"], tx, LossScale.create()), variables)
  step = classification.make_train_step(model, tx, lambda s: 0.1, policy, num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3)
  text = jax.jit(step).lower(state, H.abstract_batch(batch, (image, image, 3))).as_text()
  return text, variables


def test_resnet50_train_step_is_nhwc_end_to_end():
  text, variables = _lowered_resnet50_step()
  assert layout_problems(text) == []
  convs = H.convolutions(text)
  kinds = [dn for dn, *_ in convs]
  n_layers = sum(1 for path, _ in jax.tree_util.tree_flatten_with_path(variables["params"])[0]
                 if path[-1].key == "kernel" and path[-2].key != "head")
  assert n_layers == 53  # 1 stem + 16 blocks x 3 + 4 projections
  assert kinds.count(FORWARD) == n_layers
  assert kinds.count(KERNEL_GRAD) == n_layers
  assert kinds.count(INPUT_GRAD) == n_layers - 1  # no gradient w.r.t. the input images
  # Forward convolutions read NHWC activations: batch first, channels last.
  stem = next(c for c in convs if c[0] == FORWARD)
  assert stem[1].startswith("tensor<2x32x32x3x") and stem[2].startswith("tensor<7x7x3x64x")
  # The transposes that do exist are the dense head's (rank 2), not layout changes.
  assert all(H._rank(i) == 2 for i, _ in H.transposes(text))


class _NCHWNet(nn.Module):
  """Negative control: a conv net computing in NCHW, as a PyTorch port would."""
  transpose_input: bool = True

  @nn.compact
  def __call__(self, x, train):
    del train
    if self.transpose_input:
      x = jnp.transpose(x, (0, 3, 1, 2))  # NHWC batch -> NCHW
    k = self.param("kernel", nn.initializers.lecun_normal(), (8, x.shape[1], 3, 3))  # OIHW
    y = jax.lax.conv_general_dilated(x, k.astype(x.dtype), (1, 1), "SAME",
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return nn.Dense(10)(jnp.mean(nn.relu(y), axis=(2, 3)).astype(jnp.float32))


@pytest.mark.parametrize("transpose_input", [True, False])
def test_layout_checker_flags_an_nchw_model(transpose_input):
  model = _NCHWNet(transpose_input)
  image = (8, 8, 3) if transpose_input else (3, 8, 8)
  tx = optax.sgd(0.1)
  variables = jax.eval_shape(lambda: {"batch_stats": {}, **model.init(jax.random.PRNGKey(0), jnp.zeros((1,) + image), train=False)})
  state = jax.eval_shape(lambda v: H.make_state(v["params"], v["batch_stats"], tx, LossScale.create()), variables)
  step = classification.make_train_step(model, tx, lambda s: 0.1, precision.get_policy("fp32"), num_classes=10,
                               mean=(0.5,), std=(0.25,))
  text = jax.jit(step).lower(state, H.abstract_batch(2, image)).as_text()
  problems = layout_problems(text)
  assert any("non-NHWC dim_numbers [b, f, 0, 1]" in p for p in problems), problems
  assert any("rank-4 transpose" in p for p in problems) == transpose_input, problems


# --- summary tool ------------------------------------------------------------------------

def _same_out(n, k, s):
  out = -(-n // s)
  pad_lo = max((out - 1) * s + k - n, 0) // 2
  return out, pad_lo


def _taps_in_bounds(n, k, s, pad_lo):
  out, _ = _same_out(n, k, s)
  return sum(sum(1 for t in range(k) if 0 <= o * s - pad_lo + t < n) for o in range(out))


def _resnet_convs(stages, bottleneck, stem, size, width=64, in_ch=3):
  """(input size, kernel, stride, padding, cin, cout) of every conv, torchvision layout."""
  convs = []
  if stem == "imagenet":
    convs.append((size, 7, 2, 3, in_ch, width))
    size = -(-size // 2)
    size = -(-size // 2)  # 3x3/2 max-pool
  else:
    convs.append((size, 3, 1, None, in_ch, width))
  cin = width
  for st, blocks in enumerate(stages):
    f = width * 2**st
    for b in range(blocks):
      s = 2 if st > 0 and b == 0 else 1
      cout = 4 * f if bottleneck else f
      if bottleneck:
        convs += [(size, 1, 1, None, cin, f), (size, 3, s, None, f, f), (-(-size // s), 1, 1, None, f, cout)]
      else:
        convs += [(size, 3, s, None, cin, f), (-(-size // s), 3, 1, None, f, f)]
      if cin != cout or s != 1:
        convs.append((size, 1, s, None, cin, cout))
      cin, size = cout, -(-size // s)
  return convs, cin


def test_conventional_macs_of_resnet50_at_224():
  model = models.create("resnet50")
  v = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3)), train=False))
  macs = summary.conventional_macs(lambda v, x: model.apply(v, x, train=False), v,
                                   jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32))
  convs, feat = _resnet_convs([3, 4, 6, 3], True, "imagenet", 224)
  expected = sum(_same_out(n, k, s)[0] ** 2 * k * k * ci * co for n, k, s, _, ci, co in convs) + feat * 1000
  assert macs == expected
  assert 4.08e9 < macs < 4.10e9  # the ~4.1 GMACs usually quoted for ResNet-50


def test_summary_tool_on_a_small_model(capsys, monkeypatch):
  s = summary.summarize("resnet_tiny", image_size=16, batch_size=4, num_classes=10, channels=1)
  n_params = _reference_count([1, 1, 1], False, "small", 10, 16, 1)
  assert s["params"] == n_params
  assert s["flops_per_fma"] == 2.0
  convs, feat = _resnet_convs([1, 1, 1], False, "small", 16, width=16, in_ch=1)
  full = sum(_same_out(n, k, s_)[0] ** 2 * k * k * ci * co for n, k, s_, _, ci, co in convs) + feat * 10
  assert s["conventional_macs"] == full
  # XLA charges only the kernel taps that land inside the input (no padding
  # multiply-adds), at 2 FLOPs each, plus a little elementwise work (BN, ReLU, adds).
  valid = sum(_taps_in_bounds(n, k, s_, _same_out(n, k, s_)[1]) ** 2 * ci * co
              for n, k, s_, _, ci, co in convs) + feat * 10
  assert valid < full
  assert 2 * valid <= s["forward_flops"] <= 2 * valid * 1.1, (s["forward_flops"], 2 * valid)
  # Saved activations: at least every conv output of the batch in fp32 (the BN
  # backward needs them), and the tool's number scales with the batch.
  conv_out = sum(_same_out(n, k, s_)[0] ** 2 * co for n, k, s_, _, ci, co in convs) * 4 * 4
  assert conv_out <= s["saved_for_backward_bytes"] <= 8 * conv_out
  model = models.create("resnet_tiny", num_classes=10)
  v = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 16, 16, 1)), train=False))
  assert summary.saved_for_backward_bytes(model, v["params"], v["batch_stats"], (8, 16, 16, 1),
                                          jnp.float32) == 2 * s["saved_for_backward_bytes"]
  assert s["train_step_temp_bytes"] > 0
  assert s["train_step_flops_per_image"] > 2 * s["forward_flops"]  # backward ~2x forward

  # The command line: arguments reach summarize, and the table shows the numbers.
  seen = {}
  monkeypatch.setattr(summary, "summarize", lambda name, **kw: seen.update(name=name, **kw) or s)
  assert summary_command.main(["resnet_tiny", "--image-size", "16", "--batch-size", "4", "--num-classes", "10",
                       "--channels", "1"]) == 0
  assert seen == dict(name="resnet_tiny", image_size=16, batch_size=4, num_classes=10, channels=1,
                      precision_name="fp32", train_step=True)
  table = capsys.readouterr().out
  assert re.search(rf"^parameters +{n_params:,} ", table, re.M), table
  assert f"{s['forward_flops'] / 1e9:.3f} G" in table and "XLA counts 1 FMA = 2 FLOPs" in table
  assert "train-step temp, batch 4" in table


@pytest.mark.parametrize("argv,expected", [
    (["resnet5"], "error: no model 'resnet5'; did you mean resnet50"),
    (["vit_s16", "--image-size=30"],
     "error: vit_s16 takes image sides that are multiples of 16: --image-size=30 is not; use e.g. --image-size=32"),
    (["alexnet", "--image-size=16", "--no-train-step"],
     "error: alexnet at --image-size=16: AlexNet needs images of at least 63x63 pixels, got 16x16; raise --image-size"),
])
def test_summary_command_refuses_bad_input_in_one_line(argv, expected, capsys, monkeypatch):
  monkeypatch.delenv("JAXNET_DEBUG", raising=False)
  for hook in ("excepthook", "unraisablehook"):  # one_line_errors installs filters: put them back
    monkeypatch.setattr(sys, hook, getattr(sys, hook))
  with pytest.raises(SystemExit) as exit_:
    summary_command.main(argv)
  assert exit_.value.code == 1
  err = capsys.readouterr().err.splitlines()
  assert err[0].startswith(expected) and err[1:] == ["(set JAXNET_DEBUG=1 to see the traceback)"]


def test_scatter_free_max_pool_gradient_is_jax_s_own_bit_for_bit():
  """models.max_pool(scatter_free=True): the pooled values and the gradient are those of
  jax's select-and-scatter, bit for bit, in fp32, bf16 and fp16, with ties (small integers:
  many equal maxima in a window) and overlapping windows (stride 1: up to 9 gradients summed
  into one input, in XLA's order), and its gradient has no scatter."""
  rng = np.random.default_rng(0)
  cases = [((3, 3), (2, 2), ((1, 1), (1, 1)), (9, 10)), ((3, 3), (1, 1), "SAME", (6, 5))]
  inputs, weights = {}, {}
  for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
    for i, (window, strides, padding, hw) in enumerate(cases):
      x = jnp.asarray(rng.integers(-3, 4, (2, *hw, 3)) * rng.choice([1.0, 0.37], (2, *hw, 3)), dtype)
      inputs[(dtype.__name__, i)] = x
      weights[(dtype.__name__, i)] = jnp.asarray(rng.normal(size=nn.max_pool(x, window, strides, padding).shape), dtype)

  def pools(i):
    window, strides, padding, _ = cases[i]
    return (lambda x: nn.max_pool(x, window, strides=strides, padding=padding),
            lambda x: models.max_pool(x, window, strides, padding, scatter_free=True))

  @jax.jit  # one compile for every case
  def both(inputs):
    out = {}
    for key, x in inputs.items():
      w = weights[key]
      out[key] = [(p(x), jax.grad(lambda x: jnp.sum((p(x) * w).astype(jnp.float32)))(x)) for p in pools(key[1])]
    return out

  for key, ((y, theirs), (ours_y, ours)) in both(inputs).items():
    assert np.asarray(ours_y).tobytes() == np.asarray(y).tobytes(), key
    assert np.asarray(ours).tobytes() == np.asarray(theirs).tobytes(), key
  x = inputs[("float32", 0)]
  lowered = lambda pool: jax.jit(jax.grad(lambda x: jnp.sum(pool(x)))).lower(x).as_text()
  assert "select_and_scatter" in lowered(pools(0)[0]) and "scatter" not in lowered(pools(0)[1])


def test_scatter_free_max_pool_gradient_on_eight_devices_is_one_device_s():
  """Batch-sharded over 8 devices, the scatter-free pool's gradient is the 1-device one, bit for
  bit (per example: nothing is reduced across the batch), and the step moves nothing between
  the devices."""
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  assert jax.device_count() >= 8, "tests/conftest.py must force 8 host devices"
  x = jnp.asarray(np.random.default_rng(1).integers(-3, 4, (8, 9, 9, 4)), jnp.bfloat16)
  loss = lambda x: jnp.sum(models.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)), scatter_free=True)
                           .astype(jnp.float32) ** 2)
  grad = jax.jit(jax.grad(loss))
  sharded = jax.device_put(x, NamedSharding(Mesh(np.array(jax.devices()[:8]), ("data",)), P("data")))
  assert np.asarray(grad(sharded)).tobytes() == np.asarray(grad(x)).tobytes()
  hlo = grad.lower(sharded).compile().as_text()
  assert not re.search(r"all-gather|all-reduce|collective-permute|all-to-all", hlo)
