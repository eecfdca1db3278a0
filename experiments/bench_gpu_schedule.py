"""How the GPU program's collectives are scheduled, and what XLA's scheduler options change.

  python experiments/bench_gpu_schedule.py [--config=configs/resnet50.py] [--gpus=8] [--target=h100]

Compiles the run's real train step (jaxnet/tools/gpu_plan.py) for 8 H100s on this CPU once per
row: jaxnet's GPU flags (the command line's), each candidate option added alone, and counts, per
collective, how many have no compute scheduled between their start and done ("exposed": the
GPU waits for them), with the kernels and HBM traffic per step. Compiled, not run: without a
device XLA cannot autotune, and nothing here measures time. Needs the CUDA plugin wheels
(python -m jaxnet.cli.gpu_plan --install-plugin puts them in the folder JAXNET_CUDA_PLUGIN_DIR
or ~/.cache/jaxnet/cuda-plugin/VERSION).
"""

import argparse
import os
import platform
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ["JAX_PLATFORMS"] = "cpu"

# One option at a time, beside jaxnet's defaults (xla.GPU_XLA_FLAGS): the ones NVIDIA's JAX
# containers document for overlapping communication with compute.
CANDIDATES = [
    ("jaxnet defaults", {}),
    ("pipelined all-reduce", {"xla_gpu_enable_pipelined_all_reduce": True}),
    ("pipelined reduce-scatter", {"xla_gpu_enable_pipelined_reduce_scatter": True}),
    ("pipelined all-gather", {"xla_gpu_enable_pipelined_all_gather": True}),
    ("all-reduce combine 1 GiB", {"xla_gpu_all_reduce_combine_threshold_bytes": 1 << 30}),
    ("no latency-hiding scheduler", {"xla_gpu_enable_latency_hiding_scheduler": False}),
]


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--config", default="configs/resnet50.py")
  p.add_argument("--precision", default="bf16")
  p.add_argument("--per-gpu-batch", type=int, default=256)
  p.add_argument("--gpus", type=int, default=8)
  p.add_argument("--target", default="h100")
  args = p.parse_args()
  from jaxnet.tools import gpu_plan
  if os.path.isdir(gpu_plan.plugin_dir()):
    sys.path.insert(0, gpu_plan.plugin_dir())
  gpu_plan.check_plugin()
  import jax
  from jaxnet.core import config as config_lib
  from jaxnet.tools import hlo
  name, text = gpu_plan.target_text(args.target)
  devices = gpu_plan.topology_devices(text, args.gpus)
  config = gpu_plan.plan_config(config_lib.load(args.config, {"precision": args.precision}),
                                args.per_gpu_batch, args.gpus)
  print(f"hardware: compiled on {platform.processor() or platform.machine()} ({os.cpu_count()} cores) "
        f"for {args.gpus}x {devices[0].device_kind}; jax {jax.__version__}; not run")
  print(f"{config.model.name} {args.precision} {config.image_size}px, {args.per_gpu_batch} images per GPU\n")
  print(f"| options | all-reduce exposed / all | other collectives exposed / all | kernels | HBM GiB/step | compile s |")
  print("|---|---:|---:|---:|---:|---:|")
  default_options = gpu_plan.run_options
  for label, extra in CANDIDATES:
    gpu_plan.run_options = lambda: {**default_options(), **extra}
    start = time.time()
    exp, train, _ = gpu_plan.build(config, devices, eval_step=False)
    s = hlo.summary(gpu_plan.analyse_step(train, exp.abstract_state, args.per_gpu_batch))
    coll = s["collectives"]
    ar = coll.get("all-reduce", {"exposed": 0, "count": 0})
    other = [v for k, v in coll.items() if k != "all-reduce"]
    print(f"| {label} | {ar['exposed']} / {ar['count']} | {sum(v['exposed'] for v in other)} / "
          f"{sum(v['count'] for v in other)} | {s['kernels']} | {s['hbm_bytes'] / 2**30:.2f} | "
          f"{time.time() - start:.0f} |", flush=True)
  gpu_plan.run_options = default_options


if __name__ == "__main__":
  main()
