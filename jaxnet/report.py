"""Plots and a summary of one or more workdirs' metrics.jsonl.

  python -m jaxnet.report WORKDIR [WORKDIR ...] [--out DIR]

Writes DIR/{loss,accuracy,learning_rate,throughput}.png (plus loss_scale.png
when a run used fp16), each with the metric against step (left) and against
wall time (right), all workdirs overlaid; and DIR/summary.txt / summary.json:
best eval top-1, the wall time to reach it, median train images/s. DIR defaults
to WORKDIR/report for one workdir and ./jaxnet-report for several.
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only: no display needed (servers, CI, notebooks' kernels)
import matplotlib.pyplot as plt  # noqa: E402

from jaxnet import runlog  # noqa: E402
from jaxnet.metrics import read_jsonl_counted  # noqa: E402

# figure name -> (y label, [(metric, line style, legend suffix)])
PLOTS = {
    "loss": ("loss", [("train/loss", "-", "train"), ("eval/loss", "o--", "eval")]),
    "accuracy": ("accuracy", [("train/accuracy", "-", "train"), ("eval/top1", "o--", "eval top-1")]),
    "learning_rate": ("learning rate", [("train/learning_rate", "-", "")]),
    "throughput": ("train images/s", [("train/images_per_sec", "-", "")]),
    "loss_scale": ("fp16 loss scale", [("train/loss_scale", "-", "")]),
}
OPTIONAL = {"loss_scale"}  # only drawn when some run logged it


def labels_for(workdirs: list[str]) -> list[str]:
  """Short legend names: the workdir's base name, or its full path where two names clash."""
  names = [os.path.basename(os.path.normpath(w)) for w in workdirs]
  return [n if names.count(n) == 1 else os.path.normpath(w) for n, w in zip(names, workdirs)]


def plot(runs: dict[str, list[dict]], out_dir: str) -> list[str]:
  """One PNG per metric group, runs overlaid; returns the paths written."""
  os.makedirs(out_dir, exist_ok=True)
  written = []
  for name, (ylabel, metrics) in PLOTS.items():
    if name in OPTIONAL and not any(m in r for recs in runs.values() for r in recs for m, _, _ in metrics):
      continue
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (label, records) in enumerate(runs.items()):
      color = f"C{i % 10}"
      for metric, style, suffix in metrics:
        s = runlog.series(records, metric)
        if not len(s.steps):
          continue
        legend = f"{label} {suffix}".strip()
        by_step.plot(s.steps, s.values, style, color=color, label=legend, markersize=4)
        timed = s.times == s.times  # not nan: records that carry a wall time
        by_time.plot(s.times[timed], s.values[timed], style, color=color, label=legend, markersize=4)
    by_step.set_xlabel("step")
    by_time.set_xlabel("wall time (s)")
    for ax in (by_step, by_time):
      ax.set_ylabel(ylabel)
      ax.grid(alpha=0.3)
      if name in ("loss", "loss_scale"):
        ax.set_yscale("log")
    handles, legends = by_step.get_legend_handles_labels()
    if handles:
      by_step.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, f"{name}.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
  return written


def format_summary(label: str, s: dict) -> str:
  fmt = lambda v, spec: "n/a" if v is None else format(v, spec)
  return (f"{label}: best eval top-1 {fmt(s['best_eval_top1'], '.4f')} at step "
          f"{fmt(s['best_eval_step'], 'd')} after {fmt(s['time_to_best_sec'], '.1f')} s; "
          f"median {fmt(s['median_images_per_sec'], ',.0f')} train images/s; "
          f"last step {s['final_step']}")


def report(workdirs: list[str], out_dir: str | None = None) -> dict:
  """Writes the plots and summaries; returns {label: summary dict}."""
  out_dir = out_dir or (os.path.join(workdirs[0], "report") if len(workdirs) == 1 else "jaxnet-report")
  runs = {}
  for label, workdir in zip(labels_for(workdirs), workdirs):
    runs[label], skipped = read_jsonl_counted(workdir)
    if skipped:
      print(f"note: skipped {skipped} unreadable line{'s' if skipped > 1 else ''} of "
            f"{os.path.join(workdir, 'metrics.jsonl')} (a write cut short, e.g. by a kill)")
  plot(runs, out_dir)
  summaries = {label: runlog.summary(records) for label, records in runs.items()}
  text = "\n".join(format_summary(label, s) for label, s in summaries.items())
  with open(os.path.join(out_dir, "summary.txt"), "w") as f:
    f.write(text + "\n")
  with open(os.path.join(out_dir, "summary.json"), "w") as f:
    json.dump(summaries, f, indent=2)
  print(text)
  print(f"plots and summary in {out_dir}")
  return summaries


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m jaxnet.report", description=__doc__.split("\n\n")[0])
  parser.add_argument("workdirs", nargs="+", metavar="WORKDIR")
  parser.add_argument("--out", default=None, help="output directory for PNGs and summary")
  args = parser.parse_args(argv)
  missing = [w for w in args.workdirs if not os.path.exists(os.path.join(w, "metrics.jsonl"))]
  if missing:
    print(f"error: no metrics.jsonl in {', '.join(missing)}", file=sys.stderr)
    return 2
  report(args.workdirs, args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
