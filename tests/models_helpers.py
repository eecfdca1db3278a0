"""Shared pieces for test_models.py and test_precision.py (kept small and CPU-cheap)."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxnet.core import models

from jaxnet.core import state as precision

from jaxnet.core import steps

from jaxnet.core.tasks import classification
from jaxnet.core.state import TrainState

TINY_SHAPE = (16, 16, 1)   # digits-sized input for resnet_tiny
NUM_CLASSES = 10


def init_key(seed: int = 0):
  # XLA:CPU takes ~4x longer to compile threefry than the "unsafe_rbg" generator
  # for the dozens of per-parameter draws of a model init (8.7 s vs 2.3 s for
  # resnet_tiny on this machine). These tests need *an* init, not threefry's.
  return jax.random.key(seed, impl="unsafe_rbg")


@functools.lru_cache(maxsize=None)
def _tiny_init():
  model = models.create("resnet_tiny", num_classes=NUM_CLASSES, zero_init_last_bn=True)
  init = jax.jit(lambda: model.init(init_key(), jnp.zeros((1,) + TINY_SHAPE, jnp.float32), train=False))
  return jax.device_get(init())


def tiny_variables(zero_init_last_bn: bool = True):
  """Initial {"params", "batch_stats"} of resnet_tiny; the init is compiled once per process.

  zero_init_last_bn=False differs from the default init only in the last BN scale
  of each block (ones, not zeros; BN scales draw no random numbers), so it is
  derived here instead of compiling a second init.
  """
  v = _tiny_init()
  if zero_init_last_bn:
    return v
  params = jax.tree_util.tree_map_with_path(
      lambda p, x: np.ones_like(x) if (p[-2].key == "BatchNorm_1" and p[-1].key == "scale") else x,
      v["params"])
  return {"params": params, "batch_stats": v["batch_stats"]}


def make_state(params, batch_stats, tx, loss_scale: precision.LossScale, keep_ema: bool = False) -> TrainState:
  """A TrainState as state.init_state builds it, from given initial variables."""
  params = jax.tree.map(jnp.asarray, params)
  return TrainState(step=jnp.int32(0), params=params, batch_stats=jax.tree.map(jnp.asarray, batch_stats),
                    opt_state=tx.init(params), loss_scale=loss_scale,
                    ema_params=params if keep_ema else None,
                    rng=jax.random.key_data(jax.random.PRNGKey(0)))


def tiny_train_step(policy_name: str, tx, *, ema_decay: float = 0.0, model_kwargs=None):
  policy = precision.get_policy(policy_name)
  model = models.create("resnet_tiny", num_classes=NUM_CLASSES, dtype=policy.compute_dtype,
                        **(model_kwargs or {}))
  return classification.make_train_step(model, tx, lambda s: 0.0, policy, num_classes=NUM_CLASSES,
                               mean=(0.2,), std=(0.35,), ema_decay=ema_decay)


def abstract_batch(batch_size: int, image_shape):
  return {"image": jax.ShapeDtypeStruct((batch_size,) + tuple(image_shape), jnp.uint8),
          "label": jax.ShapeDtypeStruct((batch_size,), jnp.int32),
          "mask": jax.ShapeDtypeStruct((batch_size,), jnp.bool_),
          "corrupt": jax.ShapeDtypeStruct((batch_size,), jnp.int32)}


def digits_batches(num: int, batch_size: int, seed: int = 0):
  """`num` train batches of scikit-learn digits at 16x16, in a fixed shuffled order."""
  from jaxnet.core.data.sources import digits_source
  src = digits_source("train", TINY_SHAPE[0])
  rng = np.random.default_rng(seed)
  order = np.concatenate([rng.permutation(len(src)) for _ in range(num * batch_size // len(src) + 1)])
  out = []
  for i in range(num):
    idx = order[i * batch_size:(i + 1) * batch_size]
    out.append({"image": src.images[idx], "label": src.labels[idx],
                "mask": np.ones(batch_size, bool), "corrupt": np.zeros(batch_size, np.int32)})
  return out


def sgd(lr: float = 0.05):
  return optax.sgd(lr, momentum=0.9, nesterov=True)


# --- StableHLO inspection -------------------------------------------------------------

_CONV = re.compile(
    r"stablehlo\.convolution\((?P<args>[^)]*)\)\s*dim_numbers = (?P<dn>\[[^\]]*\]x\[[^\]]*\]->\[[^\]]*\])"
    r".*?:\s*\((?P<lhs>tensor<[^>]*>),\s*(?P<rhs>tensor<[^>]*>)\)\s*->\s*(?P<out>tensor<[^>]*>)")
_TRANSPOSE = re.compile(r"stablehlo\.transpose .*?:\s*\((?P<in>tensor<[^>]*>)\)\s*->\s*(?P<out>tensor<[^>]*>)")


def _rank(tensor_type: str) -> int:
  return len(tensor_type[len("tensor<"):-1].split("x")) - 1


def _dtype(tensor_type: str) -> str:
  return tensor_type[len("tensor<"):-1].split("x")[-1]


def convolutions(stablehlo: str):
  """(dim_numbers, lhs type, rhs type, out type) of every convolution in the module."""
  convs = []
  for line in stablehlo.splitlines():
    if "stablehlo.convolution" in line:
      m = _CONV.search(line)
      assert m, f"unparsed convolution: {line[:300]}"
      convs.append((m["dn"], m["lhs"], m["rhs"], m["out"]))
  return convs


def transposes(stablehlo: str):
  out = []
  for line in stablehlo.splitlines():
    if "stablehlo.transpose" in line:
      m = _TRANSPOSE.search(line)
      assert m, f"unparsed transpose: {line[:300]}"
      out.append((m["in"], m["out"]))
  return out
