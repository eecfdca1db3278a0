"""ResNet-50's train step with each lever of issue 52 on and off, compiled on this CPU for GPU
targets (`jaxnet.cli.gpu_plan`'s compile; no GPU): kernels, HBM bytes, memory and the roofline
bound per setting, and the per-layer rows each lever changes.

    PYTHONPATH=.:PLUGIN_DIR python experiments/plan_levers.py [--targets h100,h200] [--batch 256]

The settings: the recipe as it is (`--config=resnet50`), then one lever changed at a time
(`--config.model.scatter_free_pool=false`, `--config.model.stem_conv=pad4|pad8|space_to_depth`).
A row of the per-layer table (jaxnet.tools.hlo.layer_table) is shown where its kernels or bytes
differ from the recipe's. The roofline is a bound, not a prediction: without a device XLA does
not autotune, and a lever whose gain is a faster kernel of the same bytes (the stem's channels)
cannot show here. Needs the CUDA plugin wheels (docs/gpu_plan.md).
"""

import argparse
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"  # compile on this CPU; never start a CUDA backend
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SETTINGS = {"recipe": {}, "pool: select-and-scatter": {"model.scatter_free_pool": False},
            "stem: pad4": {"model.stem_conv": "pad4"}, "stem: pad8": {"model.stem_conv": "pad8"},
            "stem: space_to_depth": {"model.stem_conv": "space_to_depth"}}
GIB = 2.0**30


def compile_setting(target: str, batch: int, overrides: dict):
  """(summary, layer rows, temporaries, roofline img/s) of the train step for one GPU of `target`."""
  from jaxnet.core import config as config_io
  from jaxnet.tools import gpu_plan, hlo
  _, text = gpu_plan.target_text(target)
  devices = gpu_plan.topology_devices(text, 1)
  config = gpu_plan.plan_config(config_io.load("resnet50", overrides), batch, 1)
  exp, train, _ = gpu_plan.build(config, devices, eval_step=False)
  analysis = gpu_plan.analyse_step(train, exp.abstract_state, batch)
  peaks, bandwidth = gpu_plan.PEAK_FLOPS[target], gpu_plan.bandwidth(text)
  seconds = analysis.roofline_seconds(peaks, bandwidth)
  return (hlo.summary(analysis), hlo.layer_table(analysis, peaks, bandwidth), train.temporaries,
          batch / seconds)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--targets", default="h100,h200")
  parser.add_argument("--batch", type=int, default=256, help="per-GPU batch")
  parser.add_argument("--settings", default=",".join(SETTINGS), help="which of: " + ", ".join(SETTINGS))
  args = parser.parse_args(argv)
  from jaxnet.tools import gpu_plan
  gpu_plan.check_plugin()
  for target in args.targets.split(","):
    results = {name: compile_setting(target, args.batch, SETTINGS[name]) for name in args.settings.split(",")}
    print(f"\nResNet-50 bf16 224px, {args.batch} per GPU, 1x {target} (compiled on a CPU, not run):")
    print(f"  {'setting':<24} {'kernels':>7} {'fusions':>7} {'HBM GiB':>8} {'temp GiB':>8} {'TFLOP':>6} "
          f"{'roofline img/s':>14}")
    for name, (s, _, temporaries, img_s) in results.items():
      print(f"  {name:<24} {s['kernels']:>7} {s['fusions']:>7} {s['hbm_bytes'] / GIB:>8.2f} "
            f"{temporaries / GIB:>8.2f} {s['flops'] / 1e12:>6.2f} {img_s:>14,.0f}")
    base = {(r["layer"], r["part"], r["pass"]): r for r in results.get("recipe", (None, []))[1]}
    for name, (_, rows, _, _) in results.items():
      if name == "recipe" or not base:
        continue
      keyed = {(r["layer"], r["part"], r["pass"]): r for r in rows}
      changed = [k for k in sorted(set(base) | set(keyed))
                 if (base.get(k, {}).get("kernels"), round(base.get(k, {}).get("bytes", 0)))
                 != (keyed.get(k, {}).get("kernels"), round(keyed.get(k, {}).get("bytes", 0)))]
      print(f"  rows that {name} changes (kernels, GiB, roofline ms: recipe -> {name}):")
      for k in changed:
        a, b = base.get(k, {}), keyed.get(k, {})
        print(f"    {' '.join(k):<34} {a.get('kernels', 0):>4} -> {b.get('kernels', 0):<4} "
              f"{a.get('bytes', 0) / GIB:6.3f} -> {b.get('bytes', 0) / GIB:6.3f}  "
              f"{a.get('ms', 0):6.3f} -> {b.get('ms', 0):6.3f}")


if __name__ == "__main__":
  main()
