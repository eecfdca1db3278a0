"""EMA of the parameters: updated every step, used by eval when enabled."""

import jax
import numpy as np

from jaxnet import api

from jaxnet.core import train as evaluation

from jaxnet.core import experiment

from jaxnet.core import sharding as parallel
from tests.helpers import max_abs_diff


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


def _digits_experiment(**overrides):
  return experiment.Experiment(api.load_config("configs/digits.py", **{
      "batch_size": 16, "mesh.num_devices": 1, "image_size": 8, **overrides}))


def test_without_ema_the_state_holds_no_second_copy_of_the_params():
  exp = _digits_experiment()
  state = exp.init_state()
  assert state.ema_params is None and exp.abstract_state.ema_params is None
  batch = parallel.to_global(next(iter(exp.train_loader())), exp.batch_sharding)
  state, _ = exp.train_step(state, batch)
  assert state.ema_params is None
  with_ema = _digits_experiment(ema_decay=0.9).init_state()
  size = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))
  assert size(with_ema) - size(state) == size(state.params)


def test_checkpoints_restore_across_ema_settings(tmp_path):
  """A checkpoint with an EMA (an EMA run, or one jaxnet wrote before it dropped the copy of
  runs without EMA) restores into a run without one, and the other way round (the EMA then
  starts at the params, as a fresh run's does)."""
  from jaxnet.core import checkpoint as ckpt
  with_ema, without = _digits_experiment(ema_decay=0.9), _digits_experiment()
  state = with_ema.init_state()
  state = state.replace(ema_params=jax.tree.map(lambda x: x + 1.0, state.params))
  saver = ckpt.Checkpoints(str(tmp_path / "ema"), async_save=False)
  saver.save(1, state, b"", {})
  saver.close()
  restored = ckpt.Checkpoints(str(tmp_path / "ema"), read_only=True).restore(1, without.abstract_state)
  assert restored.ema_params is None
  assert max_abs_diff(restored.params, state.params) == 0

  saver = ckpt.Checkpoints(str(tmp_path / "plain"), async_save=False)
  saver.save(1, restored, b"", {})
  saver.close()
  on = ckpt.Checkpoints(str(tmp_path / "plain"), read_only=True).restore(1, with_ema.abstract_state)
  assert max_abs_diff(on.ema_params, state.params) == 0 and max_abs_diff(on.params, state.params) == 0
  sizes = {name: sum(f.stat().st_size for f in (tmp_path / name).rglob("*") if f.is_file())
           for name in ("ema", "plain")}
  assert sizes["plain"] < 0.75 * sizes["ema"], sizes
