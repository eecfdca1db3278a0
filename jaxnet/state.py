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
  ema_params: Any                  # EMA of params; equals params when EMA is off
  rng: jax.Array                   # uint32 key data; step_key() derives each step's randomness


def init_state(model, tx, image_shape, seed: int, loss_scale_config) -> TrainState:
  """Builds a fresh state. Call under `jax.jit` (with out_shardings) or `jax.eval_shape`."""
  init_rng, state_rng = jax.random.split(jax.random.PRNGKey(seed))
  variables = model.init(init_rng, jnp.zeros((1,) + tuple(image_shape), jnp.float32), train=False)
  params = variables["params"]
  return TrainState(
      step=jnp.int32(0), params=params, batch_stats=variables.get("batch_stats", {}),
      opt_state=tx.init(params),
      loss_scale=LossScale.create(loss_scale_config.initial_scale, loss_scale_config.growth_interval),
      ema_params=params, rng=state_rng)


def step_key(state: TrainState) -> jax.Array:
  """The random key of the step `state.step` (dropout, mixup): a function of the
  seed and the step only, so a resumed run draws exactly what the original did."""
  return jax.random.fold_in(state.rng, state.step)
