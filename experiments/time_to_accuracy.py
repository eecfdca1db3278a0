"""Wall time for jaxnet to reach a target top-1, through its real command line.

    python experiments/time_to_accuracy.py --quick       # digits -> 97%, generated ImageFolder; < 3 min
    python experiments/time_to_accuracy.py --imagenet-dir $TFDS_DATA_DIR   # + ResNet-50 `fast` -> 75.9%

Each run is `python -m jaxnet.main --config=...` in a subprocess, evaluating
every `--eval-every-epochs`. This script watches WORKDIR/metrics.jsonl; at the
first eval with top-1 >= target it notes the time and sends SIGTERM, which
jaxnet treats as a preemption (checkpoint, clean exit). So jaxnet needs no
special option, and nothing after the target (the final checkpoint) is timed.

Times reported, both to the moment the target eval was written:
  from launch      process start: imports, data set-up, init, compiles, evals included
  from loop start  from the "training ..." line jaxnet prints just before its first
                   step: the train-step compile, the input pipeline and evals included
images/s is the median of jaxnet's logged train/images_per_sec (input pipeline included).
Each run's row is printed (and --json rewritten) as soon as the run ends, so a time
limit that stops this script keeps the rows of the runs before; all rows again at the end.
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
  parser.add_argument("--imagenet-dir", help="tfds data_dir (or ImageFolder root with --imagenet-source)")
  parser.add_argument("--imagenet-source", default="tfds", choices=["tfds", "imagefolder"])
  parser.add_argument("--imagenet-target", type=float, default=0.759, help="MLPerf ResNet-50 target")
  parser.add_argument("--workdir", help="keep run directories here (default: a temp dir)")
  parser.add_argument("--timeout", type=float, default=None, help="seconds per run")
  parser.add_argument("--warm-cache", action="store_true",
                      help="let jaxnet use its persistent XLA cache (default: an empty one per run)")
  parser.add_argument("--json", help="also write the results to this file")
  args = parser.parse_args(argv)
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
        "input pipeline and evals included); top-1: at the target eval (best seen when not reached)")
  print("data: " + "; ".join(f"{r['run']}: {r['data']}, precision {r['precision']}" for r in results))
  print(benchlib.load_line() + " at the end; CPU wall times on a shared machine are noisy")
  return 0 if results and all(r["reached"] for r in results) else 1


TABLE_HEADER = (f"{'run':>12} {'model':>12} {'target':>7} {'reached':>8} {'top-1':>7} {'step':>6} "
                f"{'epochs':>7} {'s launch':>9} {'s loop':>8} {'img/s':>8} {'evals':>5}")


def table_row(r: dict) -> str:
  """One run's line of the table (and its error, if it had one, on the next line)."""
  reached = "yes" if r["reached"] else "NO"
  top1 = r.get("top1") if r["reached"] else r.get("best_top1")
  line = (f"{r['run']:>12} {r['model'][:12]:>12} {r['target']:7.3f} {reached:>8} "
          f"{benchlib_fmt(top1, '7.4f')} {benchlib_fmt(r.get('step'), '6d')} "
          f"{benchlib_fmt(r.get('epochs'), '7.2f')} {benchlib_fmt(r.get('from_launch_s'), '9.1f')} "
          f"{benchlib_fmt(r.get('from_loop_s'), '8.1f')} {benchlib_fmt(r.get('images_per_sec'), '8.1f')} "
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
