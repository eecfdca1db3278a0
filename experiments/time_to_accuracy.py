"""Wall time for jaxnet to reach a target top-1, through its real command line.

    python experiments/time_to_accuracy.py --quick       # digits -> 97%, generated ImageFolder; < 3 min
    python experiments/time_to_accuracy.py --imagenet-dir $PREPARED   # + ResNet-50 `fast` -> 75.9%
        ($PREPARED: `jaxnet prepare`'s shards; --imagenet-source=tfds|imagefolder for others)

Each run is `python -m jaxnet.main --config=...` in a subprocess, evaluating
every `--eval-every-epochs`. This script watches WORKDIR/metrics.jsonl; at the
first eval with top-1 >= target it notes the time and sends SIGTERM, which
jaxnet treats as a preemption (checkpoint, clean exit). So jaxnet needs no
special option, and nothing after the target (the final checkpoint) is timed.

Times reported, both to the moment the target eval was written:
  from launch      process start: imports, data set-up, init, compiles, evals included
  from loop start  from the "training ..." line jaxnet prints just before its first
                   step: the train-step compile, the input pipeline and evals included
  MLPerf           from the run's WORKDIR/mlperf.log (jaxnet/core/mlperf_log.py): run_start to
                   the first eval_accuracy >= target, as MLPerf times a run (in a one-process
                   run the train step compiles in its first step, so inside this time)
images/s is the median of jaxnet's logged train/images_per_sec (input pipeline included).
Each run's row is printed (and --json rewritten) as soon as the run ends, so a time
limit that stops this script keeps the rows of the runs before; all rows again at the end.
The plan for 8 GPUs, on paper (nothing is run):
    python experiments/time_to_accuracy.py --plan [--gpu-plan-json h100.json ...]
        [--input-json bench_input.json] [--cores 112]
  prints the predicted time to 75.9% of the resnet50:fast recipe on 8 H100s and 8 H200s,
  each phase's step-bound and input-bound times, evals and compiles, and names the
  bottleneck (`plan` below says where every figure comes from).
Runs:
  digits       configs/digits.py (resnet_tiny, 16px, batch 64), target 0.97
  imagefolder  a generated 10-class JPEG folder (jaxnet.tools.make_imagefolder),
               configs/resnet50.py recipe with resnet_tiny at 32px; target --folder-target
  imagenet     with --imagenet-dir: configs/resnet50.py:fast (LARS, batch 2048,
               progressive resizing), the MLPerf target 0.759
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import benchlib  # noqa: E402


def run_to_target(name: str, config: str, overrides: list[str], workdir: str, target: float,
                  timeout: float, batch_size: int, warm_cache: bool = False) -> dict:
  """Runs jaxnet until an eval reaches `target` (then SIGTERM) or the run ends; returns the timings."""
  os.makedirs(workdir, exist_ok=True)
  cmd = [sys.executable, "-m", "jaxnet.main", f"--config={config}", f"--workdir={workdir}",
         *[f"--config.{o}" for o in overrides]]
  log_path, metrics_path = os.path.join(workdir, "stdout.log"), os.path.join(workdir, "metrics.jsonl")
  print(f"\n[{name}] {' '.join(cmd[1:])}", flush=True)
  env = {**os.environ, "PYTHONUNBUFFERED": "1"}
  if not warm_cache:
    # jaxnet.main keeps a persistent XLA cache; an empty one per run times the
    # compiles too, as a first run on a new machine would.
    env["JAXNET_COMPILATION_CACHE"] = os.path.join(workdir, "xla-cache")
  result = {"run": name, "target": target, "reached": False, "best_top1": None, "evals": 0}
  with open(log_path, "w") as log:
    launch = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), env=env)
    loop_start, log_pos, seen = None, 0, 0
    try:
      while True:
        done = proc.poll() is not None
        now = time.perf_counter()
        if loop_start is None:
          with open(log_path) as f:
            f.seek(log_pos)
            for line in f:
              if line.startswith("training "):
                loop_start = now
            log_pos = f.tell()
        records = _read_records(metrics_path)
        for r in records[seen:]:
          if "eval/top1" not in r:
            continue
          result["evals"] += 1
          result["best_top1"] = max(result["best_top1"] or 0.0, r["eval/top1"])
          if not result["reached"] and r["eval/top1"] >= target:
            result.update(reached=True, top1=r["eval/top1"], step=r["step"], from_launch_s=now - launch,
                          from_loop_s=now - loop_start if loop_start else None)
            print(f"[{name}] eval top-1 {r['eval/top1']:.4f} >= {target} at step {r['step']} "
                  f"after {now - launch:.1f} s: stopping the run", flush=True)
            proc.send_signal(signal.SIGTERM)  # jaxnet saves a checkpoint and exits
        seen = len(records)
        if done:
          break
        if now - launch > timeout:
          proc.kill()
          result["error"] = f"timed out after {timeout:.0f} s"
          break
        time.sleep(0.1)
      proc.wait(timeout=300)
    except BaseException:
      proc.kill()
      raise
  result["mlperf_s"] = mlperf_time_to_target(os.path.join(workdir, "mlperf.log"), target)
  records = _read_records(metrics_path)
  train = [r for r in records if "train/images_per_sec" in r]
  # The first logged rate includes the train step's compile: leave it out when there are more.
  rates = [r["train/images_per_sec"] for r in (train[1:] if len(train) > 1 else train)]
  result["images_per_sec"] = statistics.median(rates) if rates else None
  result["batch_size"] = batch_size
  if result["reached"] and train:
    result["epochs"] = result["step"] * train[0]["train/epoch"] / train[0]["step"]
  elif proc.returncode not in (0, None) and "error" not in result:
    with open(log_path) as f:
      result["error"] = f"exit {proc.returncode}: " + f.read()[-1500:]
  else:
    result["wall_s"] = time.perf_counter() - launch
  result["returncode"] = proc.returncode
  return result


def mlperf_time_to_target(path: str, target: float) -> float | None:
  """Seconds from MLPerf's run_start to the first eval_accuracy >= target in an MLPerf log;
  None without the log or the target."""
  from jaxnet.core import mlperf_log
  try:
    events = mlperf_log.read(path)
  except FileNotFoundError:
    return None
  start = next((e["time_ms"] for e in events if e["key"] == "run_start"), None)
  hit = next((e["time_ms"] for e in events if e["key"] == "eval_accuracy" and e["value"] >= target), None)
  return (hit - start) / 1000 if start is not None and hit is not None else None


# --- the 8-GPU plan on paper -----------------------------------------------------------------

IMAGENET_TRAIN, IMAGENET_EVAL = 1_281_167, 50_000
# Measured figures the plan starts from when not given others (experiments/RESULTS.md):
MEASURED_STEP_IMG_S = 6647   # jaxnet's ResNet-50 step, one H200, bf16, batch 256, 224 px (bench_train.py)
MEASURED_COMPILE_S = 18.4    # that step's train_step.lower().compile() on the H200
ROOFLINE = {"h100": 62_540, "h200": 84_314}  # jaxnet gpu_plan, resnet50:fast, 8 GPUs, img/s upper bounds


def plan(args) -> int:
  """Predicted time to 75.9% for the resnet50:fast recipe on 8 GPUs, term by term."""
  from jaxnet.core import config as config_lib
  config = config_lib.from_file("resnet50:fast")
  rooflines = dict(ROOFLINE)
  for path in args.gpu_plan_json or []:
    with open(path) as f:
      p = json.load(f)
    rooflines[p["target"]] = p["roofline"]["images_per_second"] * 8 / p["gpus"]
  rates, input_source = _input_rates(args)
  epochs, gpus = config.num_epochs, 8
  phases = _phases(config.progressive_resizing or ((0.0, config.image_size),))
  workers = max(args.cores - 1, 1) * args.hosts
  evals = int(epochs // config.eval_every_epochs)
  compiles = len(phases) + 1
  print("plan: the resnet50:fast recipe to 75.9% top-1 on 8 GPUs (MLPerf's target), on paper")
  print(f"  recipe: {epochs} epochs of {IMAGENET_TRAIN:,} images, batch {config.batch_size}, sizes "
        + ", ".join(f"{s}px for {f:.0%}" for s, f in phases) + f", an eval of {IMAGENET_EVAL:,} every "
        f"{config.eval_every_epochs:g} epochs ({evals}); epochs as the recipe states them (published "
        f"LARS runs), not measured")
  print(f"  step: {args.step_img_s:,.0f} img/s per GPU at 224px ({args.step_source}), capped by the "
        f"target's roofline; a smaller size scales it by (224/size)^2 (pixels; an upper bound on the gain)")
  print(f"  input: {input_source}; {workers} data workers ({args.cores} cores per host, one left to "
        f"the loop, {args.hosts} host(s))")
  print(f"  compile: {compiles} x {args.compile_s:g} s (a train step per size and the eval step; "
        f"{'measured on one H200' if args.compile_s == MEASURED_COMPILE_S else 'given'})")
  print(f"  eval: forward only, 3x the train step's rate (a forward pass is ~1/3 of a train step's FLOPs); "
        f"its input: every eval image decoded at full size ({args.eval_input_per_core:,.0f} img/s per core)")
  for target in ("h100", "h200"):
    device_224 = min(args.step_img_s * gpus, rooflines[target])
    cap = " (the roofline)" if device_224 < args.step_img_s * gpus else ""
    print(f"\n8x {target.upper()}: the step {device_224:,.0f} img/s at 224px{cap}")
    print(f"  {'phase':>8} {'images':>12} {'step img/s':>11} {'input img/s':>12} {'cores to feed':>13} "
          f"{'seconds':>8}  bound by")
    total, bounds = 0.0, {}
    for size, fraction in phases:
      images = epochs * IMAGENET_TRAIN * fraction
      step = device_224 * (224 / size) ** 2
      per_core = rates[size]
      feed = per_core * workers
      seconds = images / min(step, feed)
      bound = "input" if feed < step else "step"
      bounds[bound] = bounds.get(bound, 0.0) + seconds
      total += seconds
      print(f"  {f'{size}px':>8} {images:12,.0f} {step:11,.0f} {feed:12,.0f} {math.ceil(step / per_core):13d} "
            f"{seconds:8.1f}  {bound}")
    eval_step = 3 * device_224
    eval_feed = args.eval_input_per_core * workers
    eval_s = evals * IMAGENET_EVAL / min(eval_step, eval_feed)
    compile_s = compiles * args.compile_s
    print(f"  {'evals':>8} {evals * IMAGENET_EVAL:12,.0f} {eval_step:11,.0f} {eval_feed:12,.0f} "
          f"{math.ceil(eval_step / args.eval_input_per_core):13d} {eval_s:8.1f}  "
          f"{'input' if eval_feed < eval_step else 'step'}")
    print(f"  {'compile':>8} {'':>12} {'':>11} {'':>12} {'':>13} {compile_s:8.1f}")
    whole = total + eval_s + compile_s
    worst = max(bounds, key=bounds.get)
    print(f"  predicted time to 75.9%: {whole / 60:.1f} min ({total:.0f} s training, {eval_s:.0f} s evals, "
          f"{compile_s:.0f} s compiles); the bottleneck: the {worst} "
          f"({bounds[worst]:.0f} s of the training time)")
  print("\nThe input rates are one process's images per CPU-second; Grain's worker processes on the "
        "device machine's 16-core Xeon gave 0.56 of that per core at 16 workers (RESULTS.md), which "
        "this plan does not assume: scale --input-per-core by the host's own ratio.")
  print("Nothing here was run on a GPU or measured for accuracy: the epochs are the recipe's "
        "published figure, the step rate one measured H200 (or given), the input rate this "
        "machine's (or given).")
  return 0


def _phases(progressive) -> list[tuple[int, float]]:
  """[(size, fraction of the steps)] from config.progressive_resizing."""
  starts = [(f, s) for f, s in progressive]
  return [(size, (starts[i + 1][0] if i + 1 < len(starts) else 1.0) - start)
          for i, (start, size) in enumerate(starts)]


def _input_rates(args) -> tuple[dict, str]:
  """{size: images per core-second} of the train input, and where they come from."""
  if args.input_json:
    with open(args.input_json) as f:
      bench = json.load(f)
    # The shards `jaxnet prepare` makes by default, where the bench measured them.
    name = bench.get("default_prepared")
    if name not in bench["loader"]:
      name = next((n for n in bench["loader"] if n.startswith("prepared")), "full-size JPEGs")
    loader, transform = bench["loader"][name], bench["transform"][name]
    # The loader was measured at 224 and 160; 192 takes the transform's ratio to 224.
    rates = {int(k): v for k, v in loader.items()}
    rates.setdefault(192, rates[224] * transform["192"] / transform["224"])
    return rates, (f"{name}, jaxnet's Grain loader per core from {args.input_json} "
                   f"({bench['hardware']}, {bench['date']})")
  rate = args.input_per_core
  return {224: rate, 192: rate, 160: rate}, f"{rate:,.0f} img/s per core at every size (given)"


def _read_records(path: str) -> list[dict]:
  try:
    with open(path) as f:
      lines = f.readlines()
  except FileNotFoundError:
    return []
  out = []
  for line in lines:
    if line.endswith("\n"):  # a line still being written is read next time
      out.append(json.loads(line))
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true", help="digits + a small generated folder, < 3 min on CPU")
  parser.add_argument("--runs", default="digits,imagefolder", help="comma list of digits, imagefolder")
  parser.add_argument("--digits-target", type=float, default=0.97)
  parser.add_argument("--folder-target", type=float, default=0.9)
  parser.add_argument("--folder-classes", type=int, default=10)
  parser.add_argument("--folder-per-class", type=int, help="train JPEGs per class (quick: 40, else 200)")
  parser.add_argument("--folder-model", default="resnet_tiny")
  parser.add_argument("--folder-epochs", type=float, default=30)
  parser.add_argument("--precision", default="fp32", help="digits and folder runs (bf16 on GPUs)")
  parser.add_argument("--workers", type=int, default=0, help="data.workers for the folder run")
  parser.add_argument("--imagenet-dir", help="prepared shards (or a tfds data_dir / ImageFolder root with "
                      "--imagenet-source)")
  parser.add_argument("--imagenet-source", default="prepared", choices=["prepared", "tfds", "imagefolder"],
                      help="what --imagenet-dir holds (default: `jaxnet prepare`'s shards, as the recipe reads)")
  parser.add_argument("--imagenet-target", type=float, default=0.759, help="MLPerf ResNet-50 target")
  parser.add_argument("--workdir", help="keep run directories here (default: a temp dir)")
  parser.add_argument("--timeout", type=float, default=None, help="seconds per run")
  parser.add_argument("--warm-cache", action="store_true",
                      help="let jaxnet use its persistent XLA cache (default: an empty one per run)")
  parser.add_argument("--json", help="also write the results to this file")
  parser.add_argument("--plan", action="store_true", help="print the 8-GPU plan on paper; run nothing")
  parser.add_argument("--gpu-plan-json", action="append",
                      help="--plan: `jaxnet gpu_plan --config=resnet50:fast --gpus=8 --json` "
                           "output for a target (default: the H100 and H200 rooflines in RESULTS.md)")
  parser.add_argument("--step-img-s", type=float, default=MEASURED_STEP_IMG_S,
                      help="--plan: the train step's img/s per GPU at 224px (default: measured, one H200)")
  parser.add_argument("--input-json", help="--plan: `bench_input.py --json` output (per-core rates)")
  parser.add_argument("--input-per-core", type=float, default=1000.0,
                      help="--plan without --input-json: train input img/s per core")
  parser.add_argument("--eval-input-per-core", type=float, default=500.0,
                      help="--plan: eval input img/s per core (full-size decode; default 500)")
  parser.add_argument("--cores", type=int, default=112, help="--plan: cores per host")
  parser.add_argument("--hosts", type=int, default=1)
  parser.add_argument("--compile-s", type=float, default=MEASURED_COMPILE_S,
                      help="--plan: seconds per compile (default: measured, ResNet-50 on one H200)")
  args = parser.parse_args(argv)
  args.step_source = ("measured: jaxnet's ResNet-50 step on one H200, batch 256, bf16"
                      if args.step_img_s == MEASURED_STEP_IMG_S else "given")
  if args.plan:
    return plan(args)
  timeout = args.timeout or (600 if args.quick else 7 * 24 * 3600)
  command = "python experiments/time_to_accuracy.py " + " ".join(sys.argv[1:] if argv is None else argv)

  print("time_to_accuracy: wall time for jaxnet to reach a target eval top-1")
  print("command: " + command)
  print(benchlib.cpu_line())
  print(benchlib.versions_line())
  print(benchlib.date_line())
  print(benchlib.load_line() + " at start", flush=True)

  results = []

  def finished(result: dict, **details) -> None:
    # Each row is printed, and the JSON rewritten, as soon as its run ends, so a
    # time limit that stops this script later loses nothing already measured.
    result.update(details)
    results.append(result)
    print("\n" + TABLE_HEADER + "\n" + table_row(result), flush=True)
    if args.json:
      write_json(args.json, command, results)

  with tempfile.TemporaryDirectory() as tmp:
    root = args.workdir or tmp
    runs = args.runs.split(",")
    if "digits" in runs:
      # 1,438 train images / batch 64 = 22 steps per epoch: evaluate every epoch.
      finished(run_to_target(
          "digits", "configs/digits.py",
          ["eval_every_steps=22", "log_every_steps=11", "checkpoint_every_steps=0",
           f"precision={args.precision}"],
          os.path.join(root, "digits"), args.digits_target, timeout, batch_size=64, warm_cache=args.warm_cache),
          data="digits 16px (1,438 train / 359 test)", model="resnet_tiny", precision=args.precision)
    if "imagefolder" in runs:
      from jaxnet.tools.make_imagefolder import make_imagefolder
      per_class = args.folder_per_class or (40 if args.quick else 200)
      folder = os.path.join(root, "folder")
      start = time.perf_counter()
      make_imagefolder(folder, classes=args.folder_classes, per_class=per_class, val_per_class=10,
                       verbose=False)
      print(f"\ngenerated {args.folder_classes} classes x {per_class} train + 10 val JPEGs in "
            f"{time.perf_counter() - start:.1f} s", flush=True)
      batch = 32
      steps_per_epoch = max(args.folder_classes * per_class // batch, 1)
      finished(run_to_target(
          "imagefolder", "configs/resnet50.py",
          ["data.source=imagefolder", f"data.dir={folder}", "data.eval_split=val",
           f"data.workers={args.workers}", f"model.name={args.folder_model}", "image_size=32",
           f"batch_size={batch}", f"precision={args.precision}", f"num_epochs={args.folder_epochs}",
           "optim.learning_rate=0.8", "optim.warmup_epochs=1",  # 0.1 at batch 32
           f"eval_every_steps={steps_per_epoch}", f"log_every_steps={max(steps_per_epoch // 2, 1)}",
           "checkpoint_every_steps=0", "checkpoint_every_epochs=0"],
          os.path.join(root, "imagefolder"), args.folder_target, timeout, batch_size=batch,
          warm_cache=args.warm_cache),
          data=f"generated ImageFolder, {args.folder_classes} classes x {per_class}, 32px",
          model=args.folder_model, precision=args.precision)
    if args.imagenet_dir:
      overrides = [f"data.dir={args.imagenet_dir}"]
      if args.imagenet_source == "tfds":
        overrides += ["data.source=tfds"]
      if args.imagenet_source == "imagefolder":
        overrides += ["data.source=imagefolder", "data.eval_split=val"]
      finished(run_to_target(
          "imagenet", "configs/resnet50.py:fast", overrides, os.path.join(root, "imagenet"),
          args.imagenet_target, timeout, batch_size=2048, warm_cache=args.warm_cache),
          data=f"ImageNet ({args.imagenet_source})", model="resnet50 (fast recipe)", precision="bf16")

  print("\nall runs:\n" + TABLE_HEADER)
  for r in results:
    print(table_row(r))
  print("s launch: process start to the target eval; s loop: from the first training step (compile, "
        "input pipeline and evals included); s MLPerf: run_start to the target's eval_accuracy in "
        "WORKDIR/mlperf.log; top-1: at the target eval (best seen when not reached)")
  print("data: " + "; ".join(f"{r['run']}: {r['data']}, precision {r['precision']}" for r in results))
  print(benchlib.load_line() + " at the end; CPU wall times on a shared machine are noisy")
  return 0 if results and all(r["reached"] for r in results) else 1


TABLE_HEADER = (f"{'run':>12} {'model':>12} {'target':>7} {'reached':>8} {'top-1':>7} {'step':>6} "
                f"{'epochs':>7} {'s launch':>9} {'s loop':>8} {'s MLPerf':>8} {'img/s':>8} {'evals':>5}")


def table_row(r: dict) -> str:
  """One run's line of the table (and its error, if it had one, on the next line)."""
  reached = "yes" if r["reached"] else "NO"
  top1 = r.get("top1") if r["reached"] else r.get("best_top1")
  line = (f"{r['run']:>12} {r['model'][:12]:>12} {r['target']:7.3f} {reached:>8} "
          f"{benchlib_fmt(top1, '7.4f')} {benchlib_fmt(r.get('step'), '6d')} "
          f"{benchlib_fmt(r.get('epochs'), '7.2f')} {benchlib_fmt(r.get('from_launch_s'), '9.1f')} "
          f"{benchlib_fmt(r.get('from_loop_s'), '8.1f')} {benchlib_fmt(r.get('mlperf_s'), '8.1f')} "
          f"{benchlib_fmt(r.get('images_per_sec'), '8.1f')} "
          f"{r['evals']:5d}")
  if r.get("error"):
    line += f"\n{'':>12} error: {r['error'][-600:]}"
  return line


def write_json(path: str, command: str, results: list[dict]) -> None:
  with open(path, "w") as f:
    json.dump({"command": command, "cpu": benchlib.cpu_line(), "versions": benchlib.versions_line(),
               "date": benchlib.date_line(), "results": results}, f, indent=1)


def benchlib_fmt(value, spec):
  width = int("".join(ch for ch in spec.split(".")[0] if ch.isdigit()) or 0)
  return format(value, spec) if value is not None else "-".rjust(width)


if __name__ == "__main__":
  sys.exit(main())
