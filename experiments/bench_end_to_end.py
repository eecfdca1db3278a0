"""Training images/s end to end, as a user runs it: `python -m jaxnet.main` on a folder of
ImageNet-sized JPEGs (Grain workers, or DALI), against the same command on synthetic data.

    python experiments/bench_end_to_end.py --dir DIR --workers 16 --rows synthetic,grain,prepared,dali
    python experiments/bench_end_to_end.py --quick      # CPU dry run: resnet_tiny, 32px, batch 8

Each row is one `python -m jaxnet.main` run (its own process, its own temporary workdir, the
persistent compile cache shared, so the rows after the first skip the compile): the config,
`--batch` images per step, `--steps` steps logged every `--log-every`. The rate is the median
of the `train/images_per_sec` records of metrics.jsonl after the first two windows (the first
holds the compile, the second the pipeline filling up). Rows:

  synthetic      data.source=synthetic: random uint8 images made in the same Grain workers,
                 the same step and host->device copies, no decoding: the ceiling for the others.
  grain          data.source=imagefolder, data.workers=--workers: JPEG decode, random-resized
                 crop and flip in Grain worker processes (jaxnet/core/data/pipeline.py).
  prepared       data.source=prepared: `jaxnet prepare`'s shards of the same folder (its
                 defaults: shorter side 256, 3/4 of the images as raw pixels), --prepared or
                 made here with --workers processes, read by the same Grain workers.
  dali           data.loader=dali: decode and augmentation by NVIDIA DALI, nvJPEG on the GPU
                 (device="mixed") where jax computes on one; "not run" without DALI.

Without --dir a folder of --classes x --per-class ImageNet-sized JPEGs is generated
(jaxnet.tools.make_imagefolder). Prints a table; --json writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import benchlib  # noqa: E402


def rate_from_metrics(path: str, skip: int = 2) -> tuple[float | None, list[float]]:
  """(median images/s of the log windows after the first `skip`, every window's rate)."""
  rates = []
  with open(path) as f:
    for line in f:
      record = json.loads(line)
      if "train/images_per_sec" in record:
        rates.append(float(record["train/images_per_sec"]))
  kept = rates[skip:] or rates[-1:]
  return (statistics.median(kept) if kept else None), rates


def run_row(name: str, args, overrides: list[str], deadline: float) -> dict:
  row = {"row": name}
  left = deadline - time.time()
  if left < 20:
    return {**row, "error": f"not run: {max(left, 0):.0f}s left"}
  with tempfile.TemporaryDirectory(prefix=f"jaxnet-e2e-{name}-") as workdir:
    cmd = [sys.executable, "-m", "jaxnet.main", f"--config={args.config}", f"--workdir={workdir}",
           f"--config.batch_size={args.batch}", f"--config.total_steps={args.steps}",
           f"--config.log_every_steps={args.log_every}", f"--config.eval_every_steps={args.steps * 10}",
           f"--config.checkpoint_every_steps={args.steps * 10}", f"--config.precision={args.precision}",
           "--config.optim.warmup_steps=1", *args.set, *overrides]
    start = time.time()
    try:
      done = subprocess.run(cmd, capture_output=True, text=True, timeout=left, cwd=str(ROOT))
      rc, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
      rc, output = -1, f"stopped after {left:.0f}s\n" + (e.stdout or b"").decode(errors="replace")[-800:]
    row["wall_s"] = time.time() - start
    print(f"--- {name}: {' '.join(cmd[3:])}\n" + "\n".join(output.strip().splitlines()[-25:]), flush=True)
    metrics = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(metrics):
      row["img_s"], row["window_rates"] = rate_from_metrics(metrics)
    if rc != 0 or not row.get("img_s"):
      row["error"] = f"exit {rc}: " + " | ".join(output.strip().splitlines()[-4:])[-600:]
  return row


def prepare(folder: str, out: str, workers: int, deadline: float):
  """`jaxnet prepare`'s shards of `folder` (its defaults) in `out`, or a row saying why not."""
  left = deadline - time.time()
  if left < 40:
    return {"row": "prepared", "error": f"not run: {max(left, 0):.0f}s left"}
  start = time.time()
  cmd = [sys.executable, "-m", "jaxnet.cli.prepare", f"--dir={folder}", f"--out={out}",
         f"--workers={max(workers, 1)}"]
  try:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=left - 30, cwd=str(ROOT))
  except subprocess.TimeoutExpired:
    return {"row": "prepared", "error": f"not run: jaxnet prepare took over {left - 30:.0f}s"}
  if done.returncode != 0:
    return {"row": "prepared", "error": f"jaxnet prepare exit {done.returncode}: "
                                        + (done.stdout + done.stderr).strip()[-400:]}
  print(f"prepared the folder's shards in {time.time() - start:.1f}s: "
        + (done.stdout + done.stderr).strip().splitlines()[-1][-200:], flush=True)
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="configs/resnet50.py")
  parser.add_argument("--dir", help="image folder root (train/, val/); generated if omitted")
  parser.add_argument("--classes", type=int, default=10)
  parser.add_argument("--per-class", type=int, default=256)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--precision", default="bf16")
  parser.add_argument("--steps", type=int, default=60)
  parser.add_argument("--log-every", type=int, default=10)
  parser.add_argument("--workers", type=int, default=16, help="Grain workers (DALI threads)")
  parser.add_argument("--rows", default="synthetic,grain,prepared,dali",
                      help="comma list of synthetic, grain, prepared, dali")
  parser.add_argument("--prepared", help="jaxnet prepare's shards of --dir (made here if omitted)")
  parser.add_argument("--synthetic-img-s", type=float, default=0,
                      help="the synthetic rate to compare with, when --rows leaves that row out")
  parser.add_argument("--set", action="append", default=[], help="more --config.KEY=VALUE")
  parser.add_argument("--max-seconds", type=float, default=3600)
  parser.add_argument("--json", help="also write the rows here")
  parser.add_argument("--quick", action="store_true", help="CPU dry run: resnet_tiny, 32px, batch 8")
  args = parser.parse_args(argv)
  if args.quick:
    args.set = ["--config.model.name=resnet_tiny", "--config.image_size=32", *args.set]
    args.batch, args.steps, args.log_every, args.classes, args.per_class = 8, 12, 3, 4, 8
    args.workers = min(args.workers, 2)
  deadline = time.time() + args.max_seconds

  print(f"bench_end_to_end: {args.config} {' '.join(args.set)}, batch {args.batch}, {args.precision}, "
        f"{args.steps} steps logged every {args.log_every}")
  print(benchlib.cpu_line())
  print(benchlib.versions_line("grain", "nvidia-dali-cuda130", "nvidia-dali-cuda120"))
  print(benchlib.date_line())
  print(benchlib.load_line(), flush=True)

  with tempfile.TemporaryDirectory(prefix="jaxnet-e2e-folder-") as scratch:
    folder = args.dir
    if not folder:
      from jaxnet.tools.make_imagefolder import make_imagefolder
      start = time.time()
      folder = make_imagefolder(os.path.join(scratch, "folder"), classes=args.classes,
                                per_class=args.per_class, val_per_class=1, verbose=False)
      print(f"generated {args.classes * args.per_class} ImageNet-sized train JPEGs in {time.time() - start:.1f}s")
    folder_args = [f"--config.data.dir={folder}", "--config.data.source=imagefolder",
                   "--config.data.eval_split=val"]
    rows = []
    if "synthetic" in args.rows.split(","):
      rows.append(run_row("synthetic", args, ["--config.data.source=synthetic",
                                        f"--config.data.num_classes={args.classes}",
                                          f"--config.data.synthetic_size={args.batch * args.steps}",
                                          f"--config.data.workers={args.workers}"], deadline))
    for loader in [r for r in args.rows.split(",") if r != "synthetic"]:
      if loader == "prepared":
        shards = args.prepared or prepare(folder, os.path.join(scratch, "prepared"), args.workers, deadline)
        if isinstance(shards, dict):
          rows.append(shards)
          continue
        rows.append(run_row("prepared", args, [f"--config.data.dir={shards}", "--config.data.source=prepared",
                                               "--config.data.eval_split=val",
                                               f"--config.data.workers={args.workers}"], deadline))
        continue
      if loader == "dali":
        try:
          import nvidia.dali  # noqa: F401
        except ImportError:
          rows.append({"row": "dali", "error": "not run: NVIDIA DALI is not installed"})
          continue
      rows.append(run_row(loader, args, [*folder_args, f"--config.data.loader={loader}",
                                         f"--config.data.workers={args.workers}"], deadline))

  synthetic = next((r.get("img_s") for r in rows if r["row"] == "synthetic"), None) or args.synthetic_img_s
  print(f"\n{'row':<10} {'img/s':>9} {'of synthetic':>12} {'wall s':>7}  windows (img/s) / error")
  for r in rows:
    share = f"{r['img_s'] / synthetic:.1%}" if r.get("img_s") and synthetic else "-"
    detail = r.get("error") or ", ".join(f"{x:,.0f}" for x in r.get("window_rates", []))
    print(f"{r['row']:<10} {r.get('img_s') or 0:>9,.0f} {share:>12} {r.get('wall_s', 0):>7.1f}  {detail}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"rows": rows, "workers": args.workers, "batch": args.batch}, f, indent=1)
  return 1 if any(benchlib.cell_failed(r) for r in rows) else 0


if __name__ == "__main__":
  sys.exit(main())
