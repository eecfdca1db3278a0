"""The train state: one pytree of arrays holding everything a step changes.

It is what the checkpoint saves (with the data iterator's position beside it),
so resuming from it continues the run bit for bit.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from jaxnet.precision import LossScale


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array                  # int32 scalar: optimizer steps taken
  params: Any                      # fp32 master weights
  batch_stats: Any                 # fp32 BN running statistics ({} for models without BN)
  opt_state: Any
  loss_scale: LossScale            # fp16 dynamic scale (carried, unused, in fp32/bf16)
  ema_params: Any                  # EMA of params; None when EMA is off (no second copy)
  rng: jax.Array                   # uint32 key data; step_key() derives each step's randomness


def init_state(model, tx, image_shape, seed: int, loss_scale_config, keep_ema: bool = False) -> TrainState:
  """Builds a fresh state. Call under `jax.jit` (with out_shardings) or `jax.eval_shape`.

  `keep_ema`: the run keeps an EMA of the params (config.ema_decay > 0), starting at them.
  """
  init_rng, state_rng = jax.random.split(jax.random.PRNGKey(seed))
  variables = model.init(init_rng, jnp.zeros((1,) + tuple(image_shape), jnp.float32), train=False)
  params = variables["params"]
  return TrainState(
      step=jnp.int32(0), params=params, batch_stats=variables.get("batch_stats", {}),
      opt_state=tx.init(params),
      loss_scale=LossScale.create(loss_scale_config.initial_scale, loss_scale_config.growth_interval),
      ema_params=params if keep_ema else None, rng=state_rng)


def step_key(state: TrainState) -> jax.Array:
  """The random key of the step `state.step` (dropout, mixup): a function of the
  seed and the step only, so a resumed run draws exactly what the original did."""
  return jax.random.fold_in(state.rng, state.step)


def with_ema_as_kept(restored: TrainState, keep_ema: bool) -> TrainState:
  """A restored state with the EMA field this run keeps. A checkpoint written with
  another ema_decay setting (or before jaxnet dropped the EMA copy of runs without
  one) may have it when this run does not (dropped), or lack it when this run keeps
  one (it starts at the params, as a fresh run's does)."""
  if not keep_ema:
    return restored.replace(ema_params=None)
  if restored.ema_params is None:
    return restored.replace(ema_params=jax.tree.map(jnp.copy, restored.params))
  return restored


def restore_target(abstract_state: TrainState, saved_has_ema: bool) -> TrainState:
  """The abstract state to read a checkpoint into: this run's, with the EMA field as the
  checkpoint has it (see with_ema_as_kept)."""
  if saved_has_ema and abstract_state.ema_params is None:
    return abstract_state.replace(ema_params=abstract_state.params)
  if not saved_has_ema and abstract_state.ema_params is not None:
    return abstract_state.replace(ema_params=None)
  return abstract_state
