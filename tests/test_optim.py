"""Learning-rate schedules and which parameters get weight decay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnet.core import optim
from jaxnet.core.config import base_config, duration_in_steps


def _optim_config(**kw):
  c = base_config().optim
  c.update(kw)
  return c


def _config(optim_config):
  """A whole config with this optim section (the warmup is a duration: steps or epochs)."""
  c = base_config()
  c.optim = optim_config
  return c


def test_warmup_then_cosine_scaled_by_batch():
  c = _optim_config(learning_rate=0.1, base_batch_size=256, warmup_epochs=2, schedule="cosine")
  lr = optim.learning_rate_schedule(c, batch_size=1024, total_steps=100,
                                   warmup_steps=duration_in_steps(_config(c), "warmup", 10))
  peak = 0.4
  assert float(lr(0)) == 0.0
  assert float(lr(10)) == pytest.approx(peak / 2)      # halfway through the 20 warmup steps
  assert float(lr(20)) == pytest.approx(peak)
  assert float(lr(60)) == pytest.approx(peak / 2, rel=1e-5)  # cosine midpoint
  assert float(lr(100)) == pytest.approx(0.0, abs=1e-7)
  assert all(float(lr(s)) >= float(lr(s + 1)) for s in range(20, 99))


def test_warmup_steps_override_epochs_and_poly2():
  c = _optim_config(learning_rate=2.0, base_batch_size=512, warmup_steps=5, warmup_epochs=50,
                    schedule="poly2")
  lr = optim.learning_rate_schedule(c, batch_size=512, total_steps=25,
                                   warmup_steps=duration_in_steps(_config(c), "warmup", 1))
  assert float(lr(5)) == pytest.approx(2.0)
  assert float(lr(15)) == pytest.approx(2.0 * 0.5**2)   # (1 - 10/20)^2


@pytest.mark.parametrize("name", ["sgd", "lars", "adamw"])
def test_weight_decay_skips_bn_and_biases(name):
  c = _optim_config(name=name, learning_rate=0.0, weight_decay=0.5, warmup_epochs=0,
                    schedule="constant", momentum=0.0, nesterov=False)
  params = {"conv": {"kernel": jnp.ones((3, 3, 2, 2))}, "bn": {"scale": jnp.ones((2,)),
                                                              "bias": jnp.ones((2,))}}
  # With a zero LR nothing moves; with LR 1 and zero gradients only decay acts.
  c.learning_rate = 1.0
  c.base_batch_size = 1
  tx = optim.make_optimizer(c, optim.learning_rate_schedule(c, 1, 10, warmup_steps=0))
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
  assert np.all(np.asarray(updates["bn"]["scale"]) == 0)
  assert np.all(np.asarray(updates["bn"]["bias"]) == 0)
  assert np.all(np.asarray(updates["conv"]["kernel"]) < 0)


def test_lars_trust_ratio_scales_kernels_only():
  """LARS scales a kernel's step by trust_coefficient * |w| / |g|; BN params and biases take the plain step."""
  c = _optim_config(name="lars", learning_rate=1.0, base_batch_size=1, weight_decay=0.0,
                    warmup_epochs=0, schedule="constant", momentum=0.0, nesterov=False)
  tx = optim.make_optimizer(c, optim.learning_rate_schedule(c, 1, 10, warmup_steps=0))
  params = {"conv": {"kernel": 2 * jnp.ones((3, 3, 2, 2))}, "bn": {"scale": jnp.ones((2,)),
                                                                  "bias": jnp.ones((2,))}}
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  # Kernel: |w| = 2 * 6, |g| = 0.1 * 6, so the step is lr * 0.001 * 20 * g = 0.002.
  np.testing.assert_allclose(updates["conv"]["kernel"], -0.002, rtol=1e-5)
  # BN scale and bias: -lr * g. (A trust ratio there would give 0.001 * sqrt(2) / (0.1 * sqrt(2)) * g.)
  np.testing.assert_allclose(updates["bn"]["scale"], -0.1, rtol=1e-6)
  np.testing.assert_allclose(updates["bn"]["bias"], -0.1, rtol=1e-6)


def test_unknown_optimizer_is_a_clear_error():
  c = _optim_config(name="adamm")
  with pytest.raises(ValueError, match="config.optim.name='adamm'"):
    optim.make_optimizer(c, lambda s: 0.1)


def test_weight_decay_skips_vit_embeddings_and_layernorm():
  c = _optim_config(name="adamw", learning_rate=1.0, base_batch_size=1, weight_decay=0.5,
                    warmup_epochs=0, schedule="constant")
  params = {"cls_token": jnp.ones((1, 1, 4)), "pos_embed": jnp.ones((1, 5, 4)),
            "patch_embed": {"kernel": jnp.ones((2, 2, 3, 4)), "bias": jnp.ones((4,))},
            "norm": {"scale": jnp.ones((4,)), "bias": jnp.ones((4,))},
            "head": {"kernel": jnp.ones((4, 3)), "bias": jnp.ones((3,))}}
  tx = optim.make_optimizer(c, optim.learning_rate_schedule(c, 1, 10, warmup_steps=0))
  updates, _ = jax.jit(tx.update)(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
  decayed = jax.tree.map(lambda u: bool(np.all(np.asarray(u) < 0)), updates)
  untouched = jax.tree.map(lambda u: bool(np.all(np.asarray(u) == 0)), updates)
  assert decayed["patch_embed"]["kernel"] and decayed["head"]["kernel"]
  for path in (("cls_token",), ("pos_embed",), ("patch_embed", "bias"), ("norm", "scale"), ("head", "bias")):
    leaf = untouched
    for key in path:
      leaf = leaf[key]
    assert leaf, path


def test_adamw_first_moment_dtype():
  params = {"dense": {"kernel": jnp.ones((3, 2))}}
  grads = {"dense": {"kernel": jnp.full((3, 2), 0.5)}}
  for mu_dtype, expected in (("", jnp.float32), ("bfloat16", jnp.bfloat16)):
    c = _optim_config(name="adamw", mu_dtype=mu_dtype, schedule="constant")
    tx = optim.make_optimizer(c, lambda s: 1e-3)
    state = tx.init(params)
    _, state = jax.jit(tx.update)(grads, state, params)
    adam = next(s for s in jax.tree.leaves(state, is_leaf=lambda s: hasattr(s, "mu")) if hasattr(s, "mu"))
    assert adam.mu["dense"]["kernel"].dtype == expected
    assert adam.nu["dense"]["kernel"].dtype == jnp.float32   # the second moment stays fp32
  with pytest.raises(ValueError, match="mu_dtype applies to adamw only"):
    optim.make_optimizer(_optim_config(name="sgd", mu_dtype="bfloat16"), lambda s: 0.1)
  with pytest.raises(ValueError, match="mu_dtype='bf17' is not a dtype"):
    optim.make_optimizer(_optim_config(name="adamw", mu_dtype="bf17"), lambda s: 0.1)
