"""The train state, and the precision it is trained in.

The state is one pytree of arrays holding everything a step changes. It is what the
checkpoint saves (with the data iterator's position beside it), so resuming from it
continues the run bit for bit.

Precision: params and optimizer state are always fp32 (the "master weights"); the model
computes in the policy's `compute_dtype`; batch-norm statistics and the loss are fp32.
bf16 has fp32's exponent range, so it needs no loss scaling. fp16 does: small gradients
underflow, so the loss is multiplied by a large scale before the backward pass and the
gradients divided by it after. The scale is dynamic: a step with non-finite gradients is
skipped (params, optimizer state, BN statistics and EMA unchanged) and halves the scale;
after `growth_interval` finite steps in a row it doubles. It is jaxnet's own rather than
flax's DynamicScale, which computes the gradient itself (one value_and_grad, where
gradient accumulation sums several inside a scan), counts no skipped steps, and would
change the checkpointed tree.
"""

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from jaxnet.core.errors import InvalidValueError

_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class Policy:
  name: str
  compute_dtype: jnp.dtype

  @property
  def uses_loss_scale(self) -> bool:
    return self.name == "fp16"


def get_policy(name: str) -> Policy:
  if name not in _DTYPES:
    raise InvalidValueError(f"config.precision={name!r} is not one of {sorted(_DTYPES)}")
  return Policy(name, _DTYPES[name])


class LossScale(flax.struct.PyTreeNode):
  """Dynamic loss scale; part of the train state, so it is checkpointed."""
  scale: jax.Array            # float32 scalar
  good_steps: jax.Array       # int32: finite steps since the last change
  skipped_steps: jax.Array    # int32: total steps skipped for non-finite grads
  growth_interval: int = flax.struct.field(pytree_node=False, default=2000)

  @classmethod
  def create(cls, initial_scale: float = 2.0**15, growth_interval: int = 2000) -> "LossScale":
    return cls(jnp.float32(initial_scale), jnp.int32(0), jnp.int32(0), growth_interval)

  def update(self, grads_finite: jax.Array) -> "LossScale":
    grow = grads_finite & (self.good_steps + 1 >= self.growth_interval)
    scale = jnp.where(grads_finite, jnp.where(grow, self.scale * 2, self.scale),
                      jnp.maximum(self.scale / 2, 1.0))
    good = jnp.where(grads_finite & ~grow, self.good_steps + 1, 0)
    return self.replace(scale=scale, good_steps=good.astype(jnp.int32),
                        skipped_steps=self.skipped_steps + (~grads_finite).astype(jnp.int32))


def all_finite(tree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def select_tree(pred: jax.Array, on_true, on_false):
  """Per-leaf `where`; keeps the old params and optimizer state on a skipped step."""
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array                  # int32 scalar: optimizer steps taken
  params: Any                      # fp32 master weights
  batch_stats: Any                 # fp32 BN running statistics ({} for models without BN)
  opt_state: Any
  loss_scale: LossScale            # fp16 dynamic scale (carried, unused, in fp32/bf16)
  ema_params: Any                  # EMA of params; None when EMA is off (no second copy)
  rng: jax.Array                   # uint32 key data; step_key() derives each step's randomness


def init_state(model, tx, image_shape, seed: int, loss_scale_config, keep_ema: bool = False) -> TrainState:
  """A fresh state: the model's random init. Call under `jax.jit` (with out_shardings) or
  `jax.eval_shape`. `keep_ema`: the run keeps an EMA of the params (config.ema_decay > 0),
  starting at them."""
  variables = model.init(_keys(seed)[0], jnp.zeros((1,) + tuple(image_shape), jnp.float32), train=False)
  return start_state(variables, tx, seed, loss_scale_config, keep_ema)


def start_state(variables, tx, seed: int, loss_scale_config, keep_ema: bool = False) -> TrainState:
  """The state at step 0 with these params and BN statistics ({"params", "batch_stats"}): a
  fresh one's (init_state) or pretrained ones (fine-tuning), the rest made alike, so a run
  started from given weights differs from a fresh one in the variables alone."""
  params = variables["params"]
  return TrainState(
      step=jnp.int32(0), params=params, batch_stats=variables.get("batch_stats", {}),
      opt_state=tx.init(params),
      loss_scale=LossScale.create(loss_scale_config.initial_scale, loss_scale_config.growth_interval),
      ema_params=params if keep_ema else None, rng=_keys(seed)[1])


def _keys(seed: int) -> tuple[jax.Array, jax.Array]:
  """(the model's init key, the state's key, from which step_key derives each step's)."""
  init_rng, state_rng = jax.random.split(jax.random.PRNGKey(seed))
  return init_rng, state_rng


def step_key(state: TrainState) -> jax.Array:
  """The random key of the step `state.step` (dropout, mixup): a function of the
  seed and the step only, so a resumed run draws exactly what the original did."""
  return jax.random.fold_in(state.rng, state.step)


def with_ema_as_kept(restored: TrainState, keep_ema: bool) -> TrainState:
  """A restored state with the EMA field this run keeps. A checkpoint written with another
  ema_decay (a change accepted on resume) may have it when this run does not (dropped), or
  lack it when this run keeps one (it starts at the params, as a fresh run's does)."""
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
