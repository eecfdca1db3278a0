"""Data-parallel scaling: train-step throughput on 1, 2, 4, 8 devices at a fixed per-device batch.

  python experiments/bench_scaling.py --quick     # resnet_tiny, 16px, fp32: < 90 s on 2 CPU cores
  python experiments/bench_scaling.py             # resnet50, 224px, bf16, 128 images per device

Times only the jitted train step (`Experiment.train_step`, with its shardings
and donation) on synthetic batches that already sit on the devices: no input
pipeline, no host transfer. Each device count is compiled and warmed up
first; the figure is the median over repeats of (steps / elapsed), with
block_until_ready before the clock is read.

Weak scaling: the global batch grows with the device count, so perfect
scaling keeps the step time constant and efficiency = (images/s on n devices)
/ (n x images/s on 1 device).

On a machine without accelerators the "devices" are host CPU devices forced
with --xla_force_host_platform_device_count; they share the same cores, so
the CPU numbers say nothing about GPU scaling (they test that the benchmark
and the sharded step run, and show the collective overhead at best).
"""

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
MAX_DEVICES = 8


def _parse_args():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true", help="tiny model and images (a CPU smoke run)")
  p.add_argument("--model", help="default: resnet_tiny (--quick) / resnet50")
  p.add_argument("--image-size", type=int, help="default: 16 (--quick) / 224")
  p.add_argument("--precision", help="fp32 | bf16 | fp16; default: fp32 (--quick) / bf16")
  p.add_argument("--per-device-batch", type=int, help="default: 8 (--quick) / 128")
  p.add_argument("--devices", default="1,2,4,8", help="device counts to measure")
  p.add_argument("--steps", type=int, help="steps per timed repeat; default: 5 (--quick) / 20")
  p.add_argument("--repeats", type=int, help="timed repeats (median reported); default: 3 / 5")
  args = p.parse_args()
  quick = args.quick
  args.model = args.model or ("resnet_tiny" if quick else "resnet50")
  args.image_size = args.image_size or (16 if quick else 224)
  args.precision = args.precision or ("fp32" if quick else "bf16")
  args.per_device_batch = args.per_device_batch or (8 if quick else 128)
  args.steps = args.steps or (5 if quick else 20)
  args.repeats = args.repeats or (3 if quick else 5)
  args.devices = [int(n) for n in args.devices.split(",")]
  return args


def _force_host_devices() -> None:
  """Gives the CPU backend MAX_DEVICES devices; must run before jax is imported.

  Only the host (CPU) platform reads this flag, so it is harmless where GPUs
  are the default backend. A count the user already set wins.
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={MAX_DEVICES}".strip()


def main():
  args = _parse_args()
  _force_host_devices()
  sys.path.insert(0, REPO)
  from jaxnet.cli import process as runtime
  runtime.apply_xla_flags()  # the flags the command line sets (none but CPU workarounds here)

  import jax
  import numpy as np
  from jaxnet.core import experiment
  from jaxnet.core.config import base_config

  available = jax.device_count()
  counts = [n for n in args.devices if n <= available]
  if not counts:
    raise SystemExit(f"none of --devices={args.devices} fits the {available} available devices")

  def make_experiment(n):
    c = base_config()
    c.model.name = args.model
    c.image_size = args.image_size
    c.precision = args.precision
    c.batch_size = args.per_device_batch * n
    c.mesh.num_devices = n
    c.total_steps = 1_000_000  # only sets the LR schedule: no step changes the shapes
    c.data.source = "synthetic"
    c.data.num_classes = 10 if args.quick else 1000
    c.data.synthetic_size = c.batch_size
    return experiment.Experiment(c, need_train_data=True)

  backend = jax.default_backend()
  print(f"{args.model} {args.image_size}px {args.precision}, {args.per_device_batch} images per "
        f"device; jax {jax.__version__}, {available} x {jax.devices()[0].device_kind} "
        f"({backend}), {os.cpu_count()} CPU cores", flush=True)

  first = make_experiment(counts[0])
  init_host = benchlib.filled_state(first.abstract_state)
  rows = []
  for n in counts:
    exp = first if n == counts[0] else make_experiment(n)
    gb = exp.config.batch_size
    batch = benchlib.synthetic_batch(exp, gb)
    state = jax.device_put(init_host, exp.state_sharding)
    t0 = time.perf_counter()
    step = exp.train_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    for _ in range(2):  # warm-up: first executions allocate and (multi-device) set up collectives
      state, metrics = step(state, batch)
    jax.block_until_ready(state)
    rates = []
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      for _ in range(args.steps):
        state, metrics = step(state, batch)
      jax.block_until_ready(state)
      rates.append(args.steps * gb / (time.perf_counter() - t0))
    rate = statistics.median(rates)
    loss = float(metrics["train/loss"])
    if not np.isfinite(loss):
      raise SystemExit(f"non-finite loss {loss} on {n} devices")
    rows.append((n, gb, rate, compile_s))
    del state, batch

  base = rows[0][2] / rows[0][0]  # images/s per device at the smallest count
  print(f"\n{'devices':>7} {'global batch':>12} {'images/s':>10} {'efficiency':>10} {'compile s':>9}")
  for n, gb, rate, compile_s in rows:
    print(f"{n:>7} {gb:>12} {rate:>10.1f} {rate / (n * base):>9.0%} {compile_s:>9.1f}")
  print(f"\nefficiency = images/s / (devices x images/s per device at {rows[0][0]} device(s)); "
        f"median of {args.repeats} x {args.steps} steps, compile and warm-up excluded")
  if backend == "cpu":
    print(f"NOTE: these are {available} host CPU devices forced onto {os.cpu_count()} CPU cores: "
          "they share the same cores, so the efficiency here says nothing about GPU scaling.")


if __name__ == "__main__":
  main()
