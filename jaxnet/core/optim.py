"""Optimizers and learning-rate schedules from `config.optim`.

The peak learning rate scales linearly with the global batch:
`peak = optim.learning_rate * batch_size / optim.base_batch_size` (Goyal et al.).
Weight decay and LARS trust ratios apply to convolution and dense kernels only:
not to BN or LayerNorm parameters, biases, or a ViT's class token and learned
position embedding.
"""

import jax
import jax.numpy as jnp
import optax

from jaxnet.core.errors import InvalidValueError


def _is_kernel(params):
  # Flax names every conv and dense weight matrix "kernel"; everything else
  # (scale, bias, cls_token, pos_embed) is left alone.
  return jax.tree_util.tree_map_with_path(
      lambda path, p: getattr(path[-1], "key", None) == "kernel", params)


def _mu_dtype(name: str):
  if not name:
    return None
  try:
    return jnp.dtype(name)
  except TypeError as e:
    raise InvalidValueError(f"config.optim.mu_dtype={name!r} is not a dtype; use e.g. 'bfloat16' or ''") from e


def learning_rate_schedule(optim_config, batch_size: int, total_steps: int, warmup_steps: int):
  """Linear warmup over `warmup_steps` (at most all but the last step), then the decay."""
  peak = optim_config.learning_rate * batch_size / optim_config.base_batch_size
  warmup = min(warmup_steps, max(total_steps - 1, 0))
  decay_steps = max(total_steps - warmup, 1)
  kind = optim_config.schedule
  if kind == "cosine":
    decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=optim_config.end_lr_fraction)
  elif kind == "linear":
    decay = optax.linear_schedule(peak, peak * optim_config.end_lr_fraction, decay_steps)
  elif kind == "constant":
    decay = optax.constant_schedule(peak)
  elif kind == "poly2":  # MLPerf LARS recipe: polynomial (power 2) decay
    decay = optax.polynomial_schedule(peak, peak * optim_config.end_lr_fraction, 2, decay_steps)
  else:
    raise InvalidValueError(f"config.optim.schedule={kind!r}: use cosine, linear, poly2 or constant")
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def make_optimizer(optim_config, schedule) -> optax.GradientTransformation:
  name = optim_config.name
  wd = optim_config.weight_decay
  if optim_config.mu_dtype and name != "adamw":
    raise InvalidValueError(f"config.optim.mu_dtype applies to adamw only; clear it for optim.name={name!r}")
  if name == "sgd":
    tx = optax.chain(
        optax.add_decayed_weights(wd, mask=_is_kernel) if wd else optax.identity(),
        optax.sgd(schedule, momentum=optim_config.momentum or None, nesterov=optim_config.nesterov))
  elif name == "lars":
    tx = optax.lars(schedule, weight_decay=wd, weight_decay_mask=_is_kernel,
                    trust_ratio_mask=_is_kernel, momentum=optim_config.momentum,
                    nesterov=optim_config.nesterov)
  elif name == "adamw":
    # optax's decay is coupled to the learning rate: update -= lr(t) * wd * param.
    tx = optax.adamw(schedule, b1=optim_config.b1, b2=optim_config.b2, weight_decay=wd, mask=_is_kernel,
                     mu_dtype=_mu_dtype(optim_config.mu_dtype))
  else:
    raise InvalidValueError(f"config.optim.name={name!r}: use sgd, lars or adamw")
  if optim_config.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(optim_config.grad_clip_norm), tx)
  return tx
