"""EMA of the parameters: updated every step, used by eval when enabled."""

import jax
import numpy as np

from jaxnet import api, evaluation, experiment, parallel


def test_ema_tracks_params_and_eval_uses_it():
  config = api.load_config("configs/digits.py", **{
      "ema_decay": 0.5, "batch_size": 16, "mesh.num_devices": 1, "image_size": 8,
      "optim.warmup_epochs": 0.0, "optim.schedule": "constant"})
  exp = experiment.Experiment(config)
  state = exp.init_state()
  init_params = jax.device_get(state.params)
  batch = parallel.to_global(next(iter(exp.train_loader())), exp.batch_sharding)
  state, _ = exp.train_step(state, batch)
  new, ema = jax.device_get(state.params), jax.device_get(state.ema_params)
  for p0, p1, e in zip(jax.tree.leaves(init_params), jax.tree.leaves(new), jax.tree.leaves(ema)):
    np.testing.assert_allclose(e, 0.5 * p0 + 0.5 * p1, rtol=1e-5, atol=1e-7)
  assert any(np.abs(p1 - p0).max() > 0 for p0, p1 in zip(jax.tree.leaves(init_params),
                                                          jax.tree.leaves(new)))
  # Eval reads the EMA params: swapping them for the live params changes the metrics.
  with_ema = evaluation.evaluate(exp, state)
  without = evaluation.evaluate(exp, state.replace(ema_params=state.params))
  assert with_ema["eval/loss"] != without["eval/loss"]
