"""Gradient accumulation: K micro-batches in one jitted step give the whole batch's update."""

import jax
import numpy as np
import pytest

from jaxnet.configs import digits
from jaxnet.core import config as config_lib
from jaxnet.core import experiment
from tests.test_parallel import rel_diff


def _experiment(model, accum, devices, batch=16):
  c = config_lib.switch_model(digits.get_config(), model)
  c.grad_accum_steps, c.mesh.num_devices, c.batch_size = accum, devices, batch
  c.optim.schedule, c.optim.warmup_epochs, c.optim.learning_rate = "constant", 0.0, 0.4
  return experiment.Experiment(c)


def _one_step(exp, state_host, batch):
  state = jax.device_put(state_host, exp.state_sharding)
  from jaxnet.core import sharding as parallel
  new_state, metrics = exp.train_step(state, parallel.to_global(batch, exp.batch_sharding))
  return jax.device_get(new_state), jax.device_get(metrics)


def test_four_micro_batches_update_like_one_batch():
  # vit_mini has neither batch norm nor dropout, so the two must agree up to
  # float32 summation order.
  whole = _experiment("vit_mini", 1, 1)
  micro = _experiment("vit_mini", 4, 1)
  init = jax.device_get(whole.init_state())
  batch = next(iter(whole.train_loader()))
  batch["mask"][3] = False  # a masked example counts in neither
  a, ma = _one_step(whole, init, batch)
  b, mb = _one_step(micro, init, batch)
  moved = rel_diff(a.params, init.params)
  assert moved > 1e-4, moved  # not vacuous
  assert rel_diff(b.params, a.params) <= 1e-5
  assert rel_diff(b.opt_state, a.opt_state) <= 1e-5
  for key in ("train/loss", "train/accuracy", "train/grad_norm"):
    assert float(mb[key]) == pytest.approx(float(ma[key]), rel=1e-5), key


def test_micro_batches_on_eight_devices_with_batch_norm():
  exp = _experiment("resnet_tiny", 4, 8, batch=32)  # 8 examples per micro-batch, 1 per device
  state = exp.init_state()
  loader = iter(exp.train_loader())
  from jaxnet.core import sharding as parallel
  losses = []
  for _ in range(3):
    state, metrics = exp.train_step(state, parallel.to_global(next(loader), exp.batch_sharding))
    losses.append(float(metrics["train/loss"]))
  assert np.all(np.isfinite(losses))
  stats = jax.device_get(state.batch_stats)
  assert any(np.any(x != 0) for x in jax.tree.leaves(stats))  # running means moved


def test_batch_must_split_into_micro_batches():
  """Checked once, where the batch is split (sharding.check_batch_sizes, by the Experiment)."""
  c = digits.get_config()
  c.batch_size, c.grad_accum_steps = 30, 4
  with pytest.raises(ValueError, match="batch_size=30 must be a multiple of grad_accum_steps=4"):
    experiment.Experiment(c)
  c.batch_size, c.grad_accum_steps, c.mesh.num_devices = 16, 4, 8  # micro-batches of 4 on 8 devices
  with pytest.raises(ValueError, match=r"batch_size / grad_accum_steps=4 does not divide evenly over 8"):
    experiment.Experiment(c)
