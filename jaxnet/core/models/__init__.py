"""Model registry: `config.model.name` -> a Flax module, built with `config.model`'s other
keys as its keyword arguments (big_vision's `Model(**config.model)`).

Every model is a `flax.linen` module taking NHWC images already normalized and
cast to the compute dtype, with a `train: bool` argument, returning float32
logits. Models with batch norm keep its running statistics in the
`batch_stats` collection; the others have none (an empty collection in the
train state). Models with dropout draw from the `dropout` RNG stream, which the
train step feeds with a key derived from the seed and the step. Add a model by
decorating its factory with `@register("name")`: its module's fields are its options
(config.model keys), documented where the module defines them.
"""

import contextlib
import contextvars
import dataclasses
import functools
import importlib
import pkgutil
from typing import Callable

import flax.linen as nn
import jax

from jaxnet.core.errors import InvalidValueError

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}
# The platform models are traced for, where it is not jax's default backend: the GPU plan
# compiles for a GPU from a CPU process, and must see the kernels a GPU run would choose.
_TARGET_PLATFORM = contextvars.ContextVar("jaxnet_target_platform", default=None)


def max_pool(x, window_shape, strides, padding, scatter_free: bool = False):
  """nn.max_pool over NHWC `x`; `padding` a pair per spatial dimension, "SAME" or "VALID".

  scatter_free: the gradient goes through `scatter_free_max_pool` (no select-and-scatter; the
  same values, bit for bit). Otherwise it is jax's own, in fp32 for fp16 inputs (the result
  and its gradient are the same values). Why fp32: compiled for several GPUs, the fp16 gradient
  of a batch-sharded max pool (XLA's select-and-scatter) is partitioned by all-gathering the
  whole global batch onto every GPU (ResNet-50 fp16 on 8 H100s: two all-gathers of up to 3.4 GB,
  19.1 GiB per GPU against bf16's 10.1; `python -m jaxnet.cli.gpu_plan`, experiments/RESULTS.md).
  In fp32 (and bf16) it stays sharded; the scatter-free gradient has no scatter to partition.
  """
  import jax.numpy as jnp
  with jax.named_scope("max_pool"):  # names its kernels, forward and backward (jaxnet.tools.hlo)
    if scatter_free:
      return scatter_free_max_pool(x, tuple(window_shape), tuple(strides),
                                   padding if isinstance(padding, str) else tuple(map(tuple, padding)))
    if x.dtype == jnp.float16:
      return nn.max_pool(x.astype(jnp.float32), window_shape, strides=strides, padding=padding).astype(x.dtype)
    return nn.max_pool(x, window_shape, strides=strides, padding=padding)


def _pool_pads(shape, window, strides, padding):
  """((low, high), ...) for the spatial dimensions of NHWC `shape`."""
  if isinstance(padding, str):
    return tuple(jax.lax.padtype_to_pads(shape[1:-1], window, strides, padding))
  return tuple(padding)


def _window_offsets(window):
  """The window's offsets in row-major order: the order XLA scans a window in."""
  import itertools
  return list(itertools.product(*(range(w) for w in window)))


def _window_view(xp, offset, strides, out_spatial):
  """xp[:, o0 + s0 * i, o1 + s1 * j, :] for every output position (i, j): one window offset."""
  start = (0, *offset, 0)
  limit = (xp.shape[0], *(o + s * (n - 1) + 1 for o, s, n in zip(offset, strides, out_spatial)), xp.shape[-1])
  return jax.lax.slice(xp, start, limit, (1, *strides, 1))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def scatter_free_max_pool(x, window, strides, padding):
  """Max pool whose gradient is a compare-and-select over the window's offsets, not XLA's
  select-and-scatter (a scatter with atomics on a GPU, and an all-gather of the batch when
  XLA partitions it in fp16).

  The gradient is jax's own, bit for bit: each output's gradient goes to the first position
  of its window (row-major) that holds the maximum, as select-and-scatter's `ge` selection
  picks, and an input's gradients from the windows that overlap on it are summed in the
  order select-and-scatter adds them (output positions in row-major order), from zero, in
  the input's dtype (tests/test_models.py). NaNs are not handled as XLA does.
  """
  return nn.max_pool(x, window, strides=strides, padding=padding)


def _scatter_free_forward(x, window, strides, padding):
  y = scatter_free_max_pool(x, window, strides, padding)
  return y, (x, y)


def _scatter_free_backward(window, strides, padding, residuals, dy):
  with jax.named_scope("max_pool"):  # the backward is traced outside the forward's scope
    return _scatter_free_gradient(window, strides, padding, residuals, dy)


def _scatter_free_gradient(window, strides, padding, residuals, dy):
  import jax.numpy as jnp
  x, y = residuals
  pads = _pool_pads(x.shape, window, strides, padding)
  lowest = jnp.array(-jnp.inf, x.dtype)
  xp = jax.lax.pad(x, lowest, [(0, 0, 0), *((lo, hi, 0) for lo, hi in pads), (0, 0, 0)])
  out_spatial = y.shape[1:-1]
  zero = jnp.zeros((), dy.dtype)
  offsets = _window_offsets(window)
  # Which offset of each window is the first to hold its maximum: one small integer per
  # output, so the gradient below reads it (and dy) instead of the window's values.
  first = jnp.full(y.shape, len(offsets) - 1, jnp.int8 if len(offsets) < 128 else jnp.int32)
  for k in reversed(range(len(offsets) - 1)):
    first = jnp.where(_window_view(xp, offsets[k], strides, out_spatial) == y, k, first).astype(first.dtype)
  placed = []
  for k, offset in enumerate(offsets):
    g = jnp.where(first == k, dy, zero)
    # Put each output's share back at its input position: o * stride + offset - pad_low.
    config = [(0, 0, 0)]
    for o, s, n, (lo, _), size in zip(offset, strides, out_spatial, pads, x.shape[1:-1]):
      start = o - lo
      config.append((start, size - (start + s * (n - 1) + 1), s - 1))
    placed.append(jax.lax.pad(g, zero, config + [(0, 0, 0)]))
  dx = jnp.zeros(x.shape, dy.dtype)
  for p in reversed(placed):  # later offsets come from earlier windows: add those first
    dx = dx + p
  return (dx,)


scatter_free_max_pool.defvjp(_scatter_free_forward, _scatter_free_backward)


def drop_path(x, rate: float, train: bool):
  """Stochastic depth (ConvNeXt, EfficientNet), called inside a module's compact method: in
  training each sample's `x` is zeroed with probability `rate` and the survivors scaled by
  1 / (1 - rate) (one draw per sample: dropout broadcast over H, W, C, from the `dropout` stream)."""
  return nn.Dropout(rate, broadcast_dims=tuple(range(1, x.ndim)), deterministic=not train,
                    name="drop_path")(x)


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


def _registry() -> dict:
  """The registry, filled on first use by importing the model files (each registers its models:
  imported here, not at this module's end, so no import runs back up from a member)."""
  # Every module of this package is imported: a new family is a new file, listed nowhere else.
  # Importing a module twice is a no-op, so a model file imported first (by a tool that needs
  # its class) does not stop the others from registering.
  for module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{module.name}")
  return _REGISTRY


def names() -> list[str]:
  return sorted(_registry())


def create(name: str, **kwargs) -> nn.Module:
  """Builds the registered model `name` with keyword options (num_classes, dtype, ...)."""
  if name not in _registry():
    raise InvalidValueError(
        f"unknown model {name!r}; set config.model.name to one of: {', '.join(names())}")
  return _REGISTRY[name](**kwargs)


# Fields a run sets itself, not config.model: the compute dtype comes from config.precision,
# the BN groups from config.bn_group_size and the mesh.
RUN_FIELDS = ("dtype", "bn_num_groups")


def options(name: str) -> dict:
  """{option: default} of model `name`: its module's fields that config.model may set (those
  the registry's factory binds by keyword are options too, at the factory's values)."""
  if name not in _registry():
    raise InvalidValueError(
        f"unknown model {name!r}; set config.model.name to one of: {', '.join(names())}")
  factory = _REGISTRY[name]
  cls, bound = factory, 0
  if isinstance(factory, functools.partial):  # positional arguments are the architecture
    cls, bound = factory.func, len(factory.args)
  fields = [f for f in dataclasses.fields(cls) if f.init and f.name not in ("parent", "name")]
  defaults = getattr(factory, "keywords", None) or {}
  out = {}
  for f in fields[bound:]:
    if f.name in RUN_FIELDS:
      continue
    value = defaults.get(f.name, f.default)
    out[f.name] = tuple(value) if isinstance(value, list) else value
  return out


def _class(name: str):
  factory = _registry().get(name)
  return factory.func if isinstance(factory, functools.partial) else factory


def declared(name: str, constant: str, default=None):
  """What model `name`'s class declares as `constant` (a family's: TASK, ATTENTION,
  MLPERF_BENCHMARK), else `default`: what other modules ask instead of testing its name."""
  return getattr(_class(name), constant, default)


def image_multiple(model: nn.Module) -> int:
  """The image sides `model` takes are multiples of this (its `image_multiple`: a ViT's patch
  size; 1: any side)."""
  return int(getattr(model, "image_multiple", 1))


def task(name: str) -> str:
  """What model `name` does: "classification", or "detection" (a module whose class says
  TASK = "detection"): the key of its task in jaxnet/core/tasks."""
  return declared(name, "TASK", "classification")


def check_options(model_config) -> dict:
  """The options of the model `model_config.name` ({option: default}); InvalidValueError names
  a key of `model_config` the model does not have."""
  accepts = options(model_config.name)  # an unknown name is an error here
  unknown = sorted(set(model_config) - {"name", "num_classes"} - set(accepts))
  if unknown:
    raise InvalidValueError(
        f"config.model.{unknown[0]}: model {model_config.name!r} has no option {unknown[0]!r}"
        f"{f' (nor {unknown[1:]})' if unknown[1:] else ''}; its options are {', '.join(sorted(accepts))}")
  return accepts


def _number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def _rate(v) -> bool:
  return _number(v) and 0 <= v < 1


def _positive(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool) and v >= 1


# The ranges of options by name (the families share their names): checked with the config,
# before a run writes anything, so that a rate of 1.5 or a width of 0 is one line, not a run
# that trains on nonsense or a traceback from inside the model.
OPTION_RANGES = {
    "stochastic_depth": (_rate, "in [0, 1)"),
    "dropout_rate": (_rate, "in [0, 1)"),
    "bn_epsilon": (lambda v: _number(v) and v > 0, "> 0"),
    "bn_momentum": (lambda v: _number(v) and 0 <= v <= 1, "in [0, 1]"),
    "layer_scale": (lambda v: _number(v) and v >= 0, ">= 0"),
    "head_width": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                   "a whole number >= 0 (0: the family's default)"),
    "head_convs": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a whole number >= 0"),
    **{name: (_positive, "a whole number >= 1")
       for name in ("anchor_base", "depth", "fpn_channels", "hidden", "mlp_dim", "num_heads", "patch_size", "width")},
    **{name: (lambda v: isinstance(v, (tuple, list)) and len(v) > 0 and all(_positive(x) for x in v),
              "one whole number >= 1 per stage")
       for name in ("depths", "widths")},
}


def option_problems(model_config) -> list[str]:
  """"model.KEY=VALUE must be ..." for each option `model_config` sets outside its range
  (OPTION_RANGES); [] for a model name that is not registered (said where it is built)."""
  if model_config.get("name") not in _registry():
    return []
  problems = []
  for key, value in model_config.items():
    ok, requirement = OPTION_RANGES.get(key, (None, None))
    if ok is not None and not ok(value):
      problems.append(f"model.{key}={value!r} must be {requirement}")
  return problems


def from_config(model_config, num_classes: int, dtype, bn_num_groups: int | None = None) -> nn.Module:
  """The model `config.model` describes: `name`, and the rest as keyword arguments.

  `num_classes` replaces config.model.num_classes (whose 0 means the dataset's count).
  `bn_num_groups` (config.bn_group_size set) only changes how training computes BN
  statistics, not the variables, so inference rebuilds the model without it.
  """
  kwargs = {k: v for k, v in model_config.items() if k not in ("name", "num_classes")}
  check_options(model_config)
  if bn_num_groups is not None:
    factory = _REGISTRY[model_config.name]
    fields = dataclasses.fields(factory.func if isinstance(factory, functools.partial) else factory)
    if "bn_num_groups" not in {f.name for f in fields}:
      raise InvalidValueError(f"config.bn_group_size is set, but {model_config.name} has no batch "
                              "norm; leave it at 0")
    kwargs["bn_num_groups"] = bn_num_groups
  return create(model_config.name, num_classes=num_classes, dtype=dtype, **kwargs)

