"""FSDP against data parallelism: step time, and memory per device, of ViTs on 8 devices.

  python experiments/bench_fsdp.py --time      # step time, ViT-S/16 and ViT-B/16 (CPU: ~5 min)
  python experiments/bench_fsdp.py --memory    # per-device memory, ViT-B/16, L/16, H/14 (~10 min)
  python experiments/bench_fsdp.py --gpu-plan  # largest batch per H100, ViT-L/16 and H/14 (needs
                                               # the CUDA plugin wheels, docs/gpu_plan.md; ~1 h)

--time runs the jitted train step (Experiment.train_step: shardings, donation) on 8
devices with and without config.mesh.fsdp and prints the median step time. On a machine
without accelerators the 8 devices are host CPU devices forced onto its cores: the
all-gathers and reduce-scatters of FSDP are memory copies there, so the overhead says
what FSDP adds to the program, not what NVLink would cost.

--memory compiles each model's train step of configs/vit.py (bf16, AdamW with a bf16 first
moment, as the recipe) for 8 devices and reads XLA's memory analysis: the per-device
arguments (the train state and one batch), temporaries and total. It runs nothing, so it
works for ViT-H/14 on a laptop; the CPU compiler's temporaries differ from a GPU's.

--gpu-plan runs `python -m jaxnet.cli.gpu_plan --find-max-batch` (compiled for 8 H100s on
this CPU) for ViT-L/16 and ViT-H/14, with and without FSDP.
"""

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

DEVICES = 8
GIB = 2**30


def _config(variant: str, fsdp: bool, per_device_batch: int, image_size: int, precision: str = "bf16"):
  sys.path.insert(0, REPO)
  from jaxnet.configs import vit
  c = vit.get_config(variant)
  c.data.source = "synthetic"
  c.data.synthetic_size = per_device_batch * DEVICES
  c.batch_size = per_device_batch * DEVICES
  c.image_size = image_size
  c.precision = precision
  c.mesh.num_devices = DEVICES
  c.mesh.fsdp = fsdp
  c.data.randaug_num_ops = 0
  return c


def _time_rows(args):
  import jax
  from jaxnet.core.experiment import Experiment
  rows = []
  for variant in ("s16", "b16"):
    for fsdp in (False, True):
      exp = Experiment(_config(variant, fsdp, args.per_device_batch, args.image_size, "fp32"))
      state = jax.device_put(benchlib.filled_state(exp.abstract_state), exp.state_sharding)
      batch = benchlib.synthetic_batch(exp, exp.config.batch_size)
      start = time.perf_counter()
      step = exp.train_step.lower(state, batch).compile()
      compile_s = time.perf_counter() - start
      for _ in range(2):  # warm-up
        state, _ = step(state, batch)
      _, times = benchlib.median_step_seconds(lambda s: step(s, batch)[0], state, args.steps,
                                              args.repeats, jax.block_until_ready)
      rows.append(dict(model=f"vit_{variant}", fsdp=fsdp, step_ms=1e3 * benchlib.median(times),
                       compile_s=compile_s))
      print(f"  vit_{variant} fsdp={fsdp}: {rows[-1]['step_ms']:.1f} ms/step", file=sys.stderr, flush=True)
  return rows


def _memory_rows(args):
  import numpy as np
  import jax
  from jaxnet.core.experiment import Experiment
  rows = []
  for variant in ("b16", "l16", "h14"):
    for fsdp in (False, True):
      exp = Experiment(_config(variant, fsdp, args.per_device_batch, 224))
      n = exp.config.batch_size
      batch = {"image": jax.ShapeDtypeStruct((n,) + exp.image_shape, np.uint8, sharding=exp.batch_sharding),
               "label": jax.ShapeDtypeStruct((n,), np.int32, sharding=exp.batch_sharding),
               "mask": jax.ShapeDtypeStruct((n,), np.bool_, sharding=exp.batch_sharding),
               "corrupt": jax.ShapeDtypeStruct((n,), np.int32, sharding=exp.batch_sharding)}
      start = time.perf_counter()
      m = exp.train_step.lower(exp.abstract_state, batch).compile().memory_analysis()
      rows.append(dict(model=f"vit_{variant}", fsdp=fsdp, arguments=m.argument_size_in_bytes,
                       temporaries=m.temp_size_in_bytes,
                       total=m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
                       + m.temp_size_in_bytes, compile_s=time.perf_counter() - start))
      print(f"  vit_{variant} fsdp={fsdp}: {rows[-1]['total'] / GIB:.2f} GiB", file=sys.stderr, flush=True)
  return rows


def _gpu_plan_rows(args):
  rows = []
  for variant in ("l16", "h14"):
    for fsdp in (False, True):
      cmd = [sys.executable, "-m", "jaxnet.cli.gpu_plan", f"--config=configs/vit.py:{variant}",
             f"--gpus={DEVICES}", "--find-max-batch", "--json", f"--config.mesh.fsdp={fsdp}"]
      start = time.perf_counter()
      proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
      if proc.returncode:
        rows.append(dict(model=f"vit_{variant}", fsdp=fsdp, error=proc.stderr.strip().splitlines()[-1]))
        continue
      plan = json.loads(proc.stdout)
      found = plan["max_per_gpu_batch"]
      traffic = {op: c["bytes"] / GIB for op, c in plan["train"]["collectives"].items()}
      rows.append(dict(model=f"vit_{variant}", fsdp=fsdp, max_batch=found["per_gpu_batch"],
                       does_not_fit=found.get("does_not_fit"), memory_at_128=plan["memory"]["total"] / GIB,
                       state=plan["memory"]["arguments"] / GIB, traffic=traffic,
                       minutes=(time.perf_counter() - start) / 60))
      print(f"  vit_{variant} fsdp={fsdp}: {rows[-1]}", file=sys.stderr, flush=True)
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--time", action="store_true")
  p.add_argument("--memory", action="store_true")
  p.add_argument("--gpu-plan", action="store_true")
  p.add_argument("--per-device-batch", type=int, default=0,
                 help="default: 2 (--time, at --image-size) / 32 (--memory, at 224px)")
  p.add_argument("--image-size", type=int, default=64, help="--time only")
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--repeats", type=int, default=3)
  args = p.parse_args()
  if not (args.time or args.memory or args.gpu_plan):
    p.error("choose --time, --memory and/or --gpu-plan")
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={DEVICES}").strip()
  print(benchlib.cpu_line())
  print(benchlib.versions_line())
  print(benchlib.date_line(), "|", benchlib.load_line(), flush=True)

  if args.time:
    args.per_device_batch = args.per_device_batch or 2
    rows = _time_rows(args)
    import jax
    print(f"\nstep time, {DEVICES} x {jax.devices()[0].device_kind} ({jax.default_backend()}), fp32 AdamW, "
          f"{args.image_size}px, {args.per_device_batch} images per device, median of "
          f"{args.repeats} x {args.steps} steps")
    print(f"{'model':<9} {'data parallel ms':>16} {'FSDP ms':>8} {'FSDP / DP':>9}")
    for dp, sharded in zip(rows[::2], rows[1::2]):
      print(f"{dp['model']:<9} {dp['step_ms']:>16.1f} {sharded['step_ms']:>8.1f} "
            f"{sharded['step_ms'] / dp['step_ms']:>9.2f}")
  if args.memory:
    args.per_device_batch = args.per_device_batch or 32
    rows = _memory_rows(args)
    print(f"\nmemory per device, compiled for {DEVICES} devices on this CPU (XLA memory analysis), "
          f"configs/vit.py (bf16, AdamW), 224px, {args.per_device_batch} images per device")
    print(f"{'model':<9} {'state+batch DP':>14} {'FSDP':>7} {'ratio':>6} {'total DP':>9} {'FSDP':>7}  (GiB)")
    for dp, sharded in zip(rows[::2], rows[1::2]):
      print(f"{dp['model']:<9} {dp['arguments'] / GIB:>14.2f} {sharded['arguments'] / GIB:>7.2f} "
            f"{sharded['arguments'] / dp['arguments']:>6.3f} {dp['total'] / GIB:>9.2f} "
            f"{sharded['total'] / GIB:>7.2f}")
  if args.gpu_plan:
    rows = _gpu_plan_rows(args)
    print(f"\nlargest batch per GPU on {DEVICES} H100s (jaxnet.gpu_plan --find-max-batch; compiled, not run)")
    print(f"{'model':<9} {'FSDP':<5} {'max batch/GPU':>13} {'does not fit':>12} {'GiB at 128/GPU':>14} "
          f"{'state GiB':>9}  collectives per step (GiB sent in)")
    for r in rows:
      if "error" in r:
        print(f"{r['model']:<9} {str(r['fsdp']):<5} error: {r['error']}")
      else:
        traffic = ", ".join(f"{op} {gib:.2f}" for op, gib in sorted(r["traffic"].items()))
        print(f"{r['model']:<9} {str(r['fsdp']):<5} {r['max_batch']!s:>13} {r['does_not_fit']!s:>12} "
              f"{r['memory_at_128']:>14.2f} {r['state']:>9.2f}  {traffic}")


if __name__ == "__main__":
  main()
