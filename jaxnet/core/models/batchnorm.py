"""Batch normalization with fp32 statistics and optional device-group statistics.

Under `jax.jit` with the batch sharded over the `data` mesh axis, a plain mean
over axis 0 is already the mean over the *global* batch: XLA inserts the
cross-device reduction. MLPerf-style runs instead normalise over small groups of
devices (fewer, cheaper all-reduces; a regularising effect at large batch). The
batch is laid out device-major, so "groups of k devices" is the same as
splitting the global batch into `num_groups` contiguous chunks.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp



class BatchNorm(nn.Module):
  """BatchNorm over NHWC with statistics always computed and stored in fp32.

  Parameter and collection names (`scale`, `bias`, `batch_stats/mean|var`) match
  flax.linen.BatchNorm, so parameter counts and checkpoints line up.
  """
  momentum: float = 0.9
  epsilon: float = 1e-5
  dtype: jnp.dtype = jnp.float32      # compute/output dtype
  scale_init: nn.initializers.Initializer = nn.initializers.ones
  num_groups: int = 1                 # statistics over this many batch chunks
  frozen: bool = False                # train=True also uses, and leaves unchanged, the running stats

  @nn.compact
  def __call__(self, x, train: bool):
    features = x.shape[-1]
    ra_mean = self.variable("batch_stats", "mean", lambda: jnp.zeros((features,), jnp.float32))
    ra_var = self.variable("batch_stats", "var", lambda: jnp.ones((features,), jnp.float32))
    scale = self.param("scale", self.scale_init, (features,), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (features,), jnp.float32)

    x32 = x.astype(jnp.float32)
    if train and not self.frozen:
      groups = self.num_groups  # the batch splits into them: sharding.check_batch_sizes
      xg = x32.reshape((groups, -1) + x.shape[1:])
      axes = tuple(range(1, xg.ndim - 1))
      mean = jnp.mean(xg, axis=axes, keepdims=True)
      # E[x^2]-E[x]^2 fuses into one pass over the activations; clamp the
      # rounding error that can make it slightly negative.
      var = jnp.maximum(jnp.mean(jnp.square(xg), axis=axes, keepdims=True) - jnp.square(mean), 0.)
      if not self.is_initializing():
        ra_mean.value = self.momentum * ra_mean.value + (1 - self.momentum) * jnp.mean(mean.reshape(groups, features), 0)
        ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * jnp.mean(var.reshape(groups, features), 0)
      inv = jax.lax.rsqrt(var + self.epsilon) * scale
      y = (xg - mean) * inv + bias
      y = y.reshape(x.shape)
    else:
      inv = jax.lax.rsqrt(ra_var.value + self.epsilon) * scale
      y = (x32 - ra_mean.value) * inv + bias
    return y.astype(self.dtype)
