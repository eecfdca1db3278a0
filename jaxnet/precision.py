"""Mixed-precision policy and fp16 dynamic loss scaling.

Params and optimizer state are always fp32 (the "master weights"); the model
computes in `compute_dtype`; batch-norm statistics and the loss are fp32.
bf16 has fp32's exponent range, so it needs no loss scaling. fp16 does: small
gradients underflow, so the loss is multiplied by a large scale before the
backward pass and the gradients divided by it after. The scale is dynamic:
a step with non-finite gradients is skipped and halves the scale; after
`growth_interval` finite steps in a row it doubles.
"""

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from jaxnet.errors import InvalidValueError

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
  """Per-leaf `where`; used to keep the old params and optimizer state on a skipped step."""
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)
