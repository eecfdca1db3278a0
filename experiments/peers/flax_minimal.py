"""Peer 1: the shortest honest JAX/Flax training step, written by hand, to measure jaxnet's own overhead.

    python experiments/peers/flax_minimal.py --precision bf16 --batch 64 --image-size 224

Decision: the *model* is jaxnet's Flax module (passed in, `jaxnet.core.models.create`),
everything around it is written here without jaxnet: state as a plain dict,
uint8 -> normalised input on the device, fp32 cross-entropy, SGD with Nesterov
momentum and weight decay on kernels (jaxnet's default optimizer), the same
precision policy (fp32 master weights, compute in the policy dtype, dynamic loss
scaling for fp16), `jax.jit` with the state donated. Using the same module means
the jaxnet/flax ratio in experiments/bench_train.py isolates what jaxnet adds
around the model (TrainState, masks, metrics, mesh shardings, loss-scale
plumbing); a different ResNet definition would mix model-code differences into it.

Multi-device: the batch is sharded over all devices and the state replicated,
with plain `jax.device_put`; jit propagates the shardings.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def make_optimizer(learning_rate=0.1, momentum=0.9, weight_decay=5e-5):
  kernels = lambda params: jax.tree.map(lambda p: p.ndim > 1, params)
  return optax.chain(optax.add_decayed_weights(weight_decay, mask=kernels),
                     optax.sgd(learning_rate, momentum=momentum, nesterov=True))


def make_step(model, tx, precision: str, num_classes: int):
  """Returns step(state, images_uint8, labels) -> (state, loss)."""
  dtype = DTYPES[precision]
  scaled = precision == "fp16"

  def loss_fn(params, batch_stats, images, labels, scale, key):
    x = (images.astype(jnp.float32) / 255.0 - jnp.asarray(MEAN)) / jnp.asarray(STD)
    # Dropout (AlexNet) draws from a key of the step; models with no batch norm return no batch_stats.
    logits, updates = model.apply({"params": params, "batch_stats": batch_stats}, x.astype(dtype),
                                  train=True, mutable=["batch_stats"], rngs={"dropout": key})
    onehot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
    loss = optax.softmax_cross_entropy(logits.astype(jnp.float32), onehot).mean()
    return (loss * scale if scaled else loss), (loss, updates.get("batch_stats", batch_stats))

  def step(state, images, labels):
    key = jax.random.fold_in(jax.random.PRNGKey(0), state["step"])
    grads, (loss, batch_stats) = jax.grad(loss_fn, has_aux=True)(
        state["params"], state["batch_stats"], images, labels, state["scale"], key)
    if scaled:
      grads = jax.tree.map(lambda g: g / state["scale"], grads)
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    new = {"params": optax.apply_updates(state["params"], updates), "batch_stats": batch_stats,
           "opt_state": opt_state, "scale": state["scale"], "good": state["good"],
           "step": state["step"] + 1}
    if scaled:
      # Dynamic loss scaling: skip a step with non-finite grads and halve the
      # scale; double it after 2000 finite steps in a row.
      finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
      new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state)
      grow = finite & (state["good"] + 1 >= 2000)
      new["scale"] = jnp.where(finite, jnp.where(grow, state["scale"] * 2, state["scale"]),
                               jnp.maximum(state["scale"] / 2, 1.0))
      new["good"] = jnp.where(finite & ~grow, state["good"] + 1, 0)
    return new, loss

  return step


def build(model, precision: str, batch_size: int, image_size: int, num_classes: int,
          variables=None, seed: int = 0):
  """(jitted step, state, images, labels) with the batch sharded over all local devices.

  `variables` ({"params", "batch_stats"} host arrays) skips the model's init, e.g. to
  start from exactly the same weights as another run (and to save its compile time).
  """
  tx = make_optimizer()
  if variables is None:
    variables = jax.jit(lambda: model.init(jax.random.PRNGKey(seed),
                                           jnp.zeros((1, image_size, image_size, 3)), train=False))()
  mesh = Mesh(np.asarray(jax.devices()), ("data",))
  replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  params = jax.device_put(variables["params"], replicated)
  state = {"params": params, "batch_stats": jax.device_put(variables.get("batch_stats", {}), replicated),
           "opt_state": jax.jit(tx.init, out_shardings=replicated)(params),
           "scale": jax.device_put(jnp.float32(2.0**15 if precision == "fp16" else 1.0), replicated),
           "good": jax.device_put(jnp.int32(0), replicated),
           "step": jax.device_put(jnp.int32(0), replicated)}
  rng = np.random.default_rng(seed)
  images = jax.device_put(rng.integers(0, 256, (batch_size, image_size, image_size, 3), np.uint8), sharded)
  labels = jax.device_put(rng.integers(0, num_classes, (batch_size,)).astype(np.int32), sharded)
  step = jax.jit(make_step(model, tx, precision, num_classes), donate_argnums=0)
  return step, state, images, labels


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="resnet50")
  parser.add_argument("--precision", default="bf16", choices=sorted(DTYPES))
  parser.add_argument("--batch", type=int, default=64, help="global batch")
  parser.add_argument("--image-size", type=int, default=224)
  parser.add_argument("--steps", type=int, default=20)
  args = parser.parse_args(argv)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  import time
  from jaxnet.core import models  # the model only; see the module docstring
  model = models.create(args.model, num_classes=1000, dtype=DTYPES[args.precision])
  step, state, images, labels = build(model, args.precision, args.batch, args.image_size, 1000)
  state, loss = step(state, images, labels)
  jax.block_until_ready(state)
  start = time.perf_counter()
  for _ in range(args.steps):
    state, loss = step(state, images, labels)
  jax.block_until_ready(state)
  seconds = (time.perf_counter() - start) / args.steps
  print(f"flax-minimal {args.model} {args.precision} batch {args.batch} on "
        f"{jax.device_count()}x {jax.devices()[0].device_kind}: {args.batch / seconds:.1f} img/s, "
        f"{1000 * seconds:.1f} ms/step, loss {float(loss):.3f}")


if __name__ == "__main__":
  main()
