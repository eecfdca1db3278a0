"""Model registry: a name in `config.model.name` -> a Flax module.

Every model is a `flax.linen` module taking NHWC images already normalized and
cast to the compute dtype, with a `train: bool` argument, returning float32
logits. Models with batch norm keep its running statistics in the
`batch_stats` collection; the others have none (an empty collection in the
train state). Models with dropout draw from the `dropout` RNG stream, which the
train step feeds with a key derived from the seed and the step. Add a model by
decorating its factory with `@register("name")`.
"""

import contextlib
import contextvars
import dataclasses
from typing import Callable

import flax.linen as nn
import jax

from jaxnet.errors import InvalidValueError

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}
# The platform models are traced for, where it is not jax's default backend: jaxnet.gpu_plan
# compiles for a GPU from a CPU process, and must see the kernels a GPU run would choose.
_TARGET_PLATFORM = contextvars.ContextVar("jaxnet_target_platform", default=None)


def max_pool(x, window_shape, strides, padding):
  """nn.max_pool, in fp32 for fp16 inputs (the result and its gradient are the same values).

  Why: compiled for several GPUs, the fp16 gradient of a batch-sharded max pool (XLA's
  select-and-scatter) is partitioned by all-gathering the whole global batch onto every GPU
  (ResNet-50 fp16 on 8 H100s: two all-gathers of up to 3.4 GB, 19.1 GiB per GPU against bf16's
  10.1; `python -m jaxnet.gpu_plan`, experiments/RESULTS.md). In fp32 (and bf16) it stays sharded.
  """
  import jax.numpy as jnp
  if x.dtype == jnp.float16:
    return nn.max_pool(x.astype(jnp.float32), window_shape, strides=strides, padding=padding).astype(x.dtype)
  return nn.max_pool(x, window_shape, strides=strides, padding=padding)


def target_platform() -> str:
  """'gpu', 'cpu' or 'tpu': what the model is being traced for (jax's default backend
  unless inside `tracing_for`)."""
  return _TARGET_PLATFORM.get() or jax.default_backend()


@contextlib.contextmanager
def tracing_for(platform: str):
  """Models traced inside this block choose their kernels as on `platform` (e.g. "gpu")."""
  token = _TARGET_PLATFORM.set(platform)
  try:
    yield
  finally:
    _TARGET_PLATFORM.reset(token)


def register(name: str):
  def wrap(factory):
    if name in _REGISTRY:
      raise ValueError(f"model {name!r} is registered twice")
    _REGISTRY[name] = factory
    return factory
  return wrap


def names() -> list[str]:
  return sorted(_REGISTRY)


def create(name: str, **kwargs) -> nn.Module:
  """Builds the registered model `name` with keyword options (num_classes, dtype, ...)."""
  if name not in _REGISTRY:
    raise InvalidValueError(
        f"unknown model {name!r}; set config.model.name to one of: {', '.join(names())}")
  return _REGISTRY[name](**kwargs)


def options(name: str) -> set[str]:
  """The keyword options model `name` accepts (its module's fields), e.g. to pass
  batch-norm settings only to models that have batch norm."""
  module = create(name)
  return {f.name for f in dataclasses.fields(module) if f.init} - {"parent", "name"}


def from_config(config, num_classes: int, bn_num_groups: int = 1) -> nn.Module:
  """The model `config.model` describes (training builds it, and predict/export rebuild it).

  bn_num_groups only changes how training computes BN statistics, not the
  variables, so inference can rebuild the model with the default of 1.
  Each model gets the config.model options it has (BN settings, ViT flavour).
  """
  m = config.model
  accepts = options(m.name)
  if m.bn_group_size and "bn_num_groups" not in accepts:
    raise InvalidValueError(f"config.model.bn_group_size={m.bn_group_size}, but {m.name} has no batch norm; "
                            "leave it at 0")
  if m.vit_flavour != "timm" and "flavour" not in accepts:
    raise InvalidValueError(f"config.model.vit_flavour={m.vit_flavour!r} applies to ViTs, not {m.name}")
  given = dict(bn_momentum=m.bn_momentum, bn_epsilon=m.bn_epsilon, bn_num_groups=bn_num_groups,
               zero_init_last_bn=m.zero_init_last_bn, flavour=m.vit_flavour,
               freeze_bn_stats=m.freeze_bn_stats)
  from jaxnet import precision
  return create(m.name, num_classes=num_classes,
                       dtype=precision.get_policy(config.precision).compute_dtype,
                       **{k: v for k, v in given.items() if k in accepts})


# Importing the model files fills the registry.
from jaxnet.models import alexnet, resnet, vit  # noqa: E402,F401
