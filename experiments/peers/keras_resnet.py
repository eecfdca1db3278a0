"""Peer 3: Keras 3 on its JAX backend, ResNet-50 v1.5 from keras-hub, same batch and precision as jaxnet.

    python experiments/peers/keras_resnet.py --precisions bf16 --batches 64,128,256 --image-size 224

A benchmark-only dependency, installed apart from jaxnet (not in pyproject.toml):
    pip install --no-deps keras keras-hub regex tokenizers
(`--no-deps` because keras-hub's wheel declares tensorflow-text on Linux, which it does
not import for this model; keras's own requirements, h5py, namex, optree, rich and
ml-dtypes, come with jax and orbax or are imported lazily.)

The model: keras-hub's `ResNetBackbone` configured as ResNet-50 v1.5 (7x7 stem, bottleneck
blocks [3, 4, 6, 3], stride on the 3x3 conv) plus global average pooling and a Dense head:
25,610,152 weights, which is torchvision's 25,557,032 plus the 53,120 batch-norm moving
statistics Keras counts as (non-trainable) weights. The run checks that count for 1000
classes and fails the cell if it differs, so a keras-hub change cannot slip in a
different network.

The step is the one Keras documents for a custom JAX training loop: `model.stateless_call`
inside `jax.value_and_grad`, `optimizer.stateless_apply`, all under one `jax.jit` with the
state donated. Precision is Keras's global dtype policy: `mixed_bfloat16` (bf16),
`mixed_float16` (fp16, with a `LossScaleOptimizer` whose loss scale is applied the way
Keras's own JAX trainer applies it), `float32` (fp32). The batch is uint8 NHWC already on
the device and is normalised inside the step, as in jaxnet and the torch peer; the loss is
fp32 cross-entropy; SGD with Nesterov momentum 0.9 (no weight decay: Keras's SGD decays
every weight alike, which is not the recipe's split).

Prints `INFO {json}` and one `RESULT {json}` per (precision, batch), the protocol of
experiments/bench_train.py; exits 1 if a cell failed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras is imported

RESNET50_WEIGHTS = 25_610_152  # torchvision's 25,557,032 + 53,120 BN moving statistics (1000 classes)
POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def build_model(num_classes: int, image_size: int):
  import keras
  import keras_hub
  backbone = keras_hub.models.ResNetBackbone(
      input_conv_filters=[64], input_conv_kernel_sizes=[7],
      stackwise_num_filters=[64, 128, 256, 512], stackwise_num_blocks=[3, 4, 6, 3],
      stackwise_num_strides=[1, 2, 2, 2], block_type="bottleneck_block",
      image_shape=(image_size, image_size, 3))
  inputs = keras.Input((image_size, image_size, 3))
  features = keras.layers.GlobalAveragePooling2D()(backbone(inputs))
  return keras.Model(inputs, keras.layers.Dense(num_classes)(features))


def bench_one(precision, batch, image_size, num_classes, steps, warmup, repeats) -> dict:
  import jax
  import jax.numpy as jnp
  import keras

  keras.config.set_dtype_policy(POLICIES[precision])
  keras.utils.set_random_seed(0)
  model = build_model(num_classes, image_size)
  weights = int(model.count_params())
  if num_classes == 1000 and weights != RESNET50_WEIGHTS:
    raise ValueError(f"keras-hub built {weights:,} weights, not ResNet-50's {RESNET50_WEIGHTS:,}")
  optimizer = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9, nesterov=True)
  if precision == "fp16":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  optimizer.build(model.trainable_variables)
  cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  mean = jnp.asarray(MEAN, jnp.float32) * 255
  std = jnp.asarray(STD, jnp.float32) * 255

  def loss_fn(trainable, non_trainable, opt_vars, images, labels):
    x = (images.astype(jnp.float32) - mean) / std
    logits, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
    loss = cross_entropy(labels, logits.astype(jnp.float32))
    # The loss scale lives in the optimizer's variables: read it statelessly, as Keras's trainer does.
    with keras.StatelessScope(state_mapping=list(zip(optimizer.variables, opt_vars))):
      scaled = optimizer.scale_loss(loss)
    return scaled, (loss, non_trainable)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  @functools.partial(jax.jit, donate_argnums=0)
  def train_step(state, images, labels):
    trainable, non_trainable, opt_vars = state
    (_, (loss, non_trainable)), grads = grad_fn(trainable, non_trainable, opt_vars, images, labels)
    trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
    return (trainable, non_trainable, opt_vars), loss

  rng = jax.random.key(0)
  images = jax.random.randint(rng, (batch, image_size, image_size, 3), 0, 256, jnp.int32).astype(jnp.uint8)
  labels = jax.random.randint(jax.random.fold_in(rng, 1), (batch,), 0, num_classes)
  state = ([v.value for v in model.trainable_variables],
           [v.value for v in model.non_trainable_variables],
           [v.value for v in optimizer.variables])

  start = time.perf_counter()
  state, loss = train_step(state, images, labels)
  jax.block_until_ready(state)
  first = time.perf_counter() - start  # includes the compile
  for _ in range(max(warmup - 1, 0)):
    state, loss = train_step(state, images, labels)
  jax.block_until_ready(state)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(steps):
      state, loss = train_step(state, images, labels)
    jax.block_until_ready(state)
    times.append((time.perf_counter() - start) / steps)
  seconds = statistics.median(times)
  stats = jax.local_devices()[0].memory_stats() or {}
  return {"precision": precision, "batch": batch, "img_s": batch / seconds, "ms_step": 1000 * seconds,
          "first_step_s": first, "peak_bytes": stats.get("peak_bytes_in_use"), "loss": float(loss),
          "weights": weights, "repeat_ms": [1000 * t for t in times]}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--precisions", default="bf16")
  parser.add_argument("--batches", default="64", help="comma list of batch sizes (one device)")
  parser.add_argument("--image-size", type=int, default=224)
  parser.add_argument("--num-classes", type=int, default=1000)
  parser.add_argument("--steps", type=int, default=20, help="steps per timed repeat")
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--deadline", type=float, default=0, help="time.time() after which no cell starts")
  args = parser.parse_args(argv)

  import jax
  import keras
  import keras_hub
  device = jax.devices()[0]
  print("INFO " + json.dumps({"keras": keras.__version__, "keras_hub": keras_hub.__version__,
                              "backend": keras.backend.backend(), "device": device.device_kind}),
        flush=True)
  failed = 0
  for precision in args.precisions.split(","):
    for batch in [int(b) for b in args.batches.split(",")]:
      if args.deadline and time.time() > args.deadline:
        print("RESULT " + json.dumps({"precision": precision, "batch": batch,
                                      "error": "not run: time budget spent"}), flush=True)
        continue
      try:
        result = bench_one(precision, batch, args.image_size, args.num_classes, args.steps,
                           args.warmup, args.repeats)
      except Exception as e:  # e.g. out of memory at the largest batch: report it, go on
        result = {"precision": precision, "batch": batch, "error": f"{type(e).__name__}: {e}"[:300]}
        failed += 1
      print("RESULT " + json.dumps(result), flush=True)
  return 1 if failed else 0  # a failed cell must fail the command that ran it


if __name__ == "__main__":
  sys.exit(main())
