"""Plots and a summary of one or more workdirs' metrics.jsonl
(`python -m jaxnet.cli.report WORKDIR [WORKDIR ...] [--out DIR]`).

Writes DIR/{loss,accuracy,learning_rate,throughput}.png (plus loss_scale.png
when a run used fp16), each with the metric against step (left) and against
wall time (right), all workdirs overlaid; and DIR/summary.txt / summary.json:
the final and the best eval top-1 (a detector's mAP), the wall time to reach the best, median
train images/s. The learning-rate plot draws the run's schedule (its config.json and length),
under the logged values, which are means over each log interval. DIR defaults
to WORKDIR/report for one workdir and ./jaxnet-report for several.
"""

import dataclasses
import json
import os

import numpy as np

from jaxnet.core.metrics import (prepare_output, read_jsonl_counted, write_atomically,
                                 write_file_atomically)

# figure name -> (y label, [(metric, line style, legend suffix)]): every run's; each task adds
# its own (Task.plots), drawn like loss_scale only when some run logged them.
PLOTS = {
    "loss": ("loss", [("train/loss", "-", "train"), ("eval/loss", "o--", "eval")]),
    "learning_rate": ("learning rate", [("train/learning_rate", "-", "")]),
    "throughput": ("train images/s", [("train/images_per_sec", "-", "")]),
    "loss_scale": ("fp16 loss scale", [("train/loss_scale", "-", "")]),
}
OPTIONAL = {"loss_scale"}


def figures() -> tuple[dict, set]:
  """PLOTS with every task's figures after the loss's, and the figures drawn only when logged."""
  from jaxnet.core import tasks
  own = {name: (ylabel, list(metrics)) for t in tasks.all_tasks() for name, ylabel, metrics in t.plots}
  first, *rest = PLOTS.items()
  return dict([first, *own.items(), *rest]), OPTIONAL | set(own)


def labels_for(workdirs: list[str]) -> list[str]:
  """Short legend names: the workdir's base name, or its full path where two names clash."""
  names = [os.path.basename(os.path.normpath(w)) for w in workdirs]
  return [n if names.count(n) == 1 else os.path.normpath(w) for n, w in zip(names, workdirs)]


def plot(runs: dict[str, list[dict]], out_dir: str, schedules: dict | None = None) -> list[str]:
  """One PNG per metric group, runs overlaid; returns the paths written. `schedules`: {label:
  the run's learning rate at each step (a Series without times)}, drawn as a line under the
  logged values (each the mean over its log interval)."""
  schedules = schedules or {}
  import matplotlib.figure  # a Figure of its own: no pyplot state, no display needed
  os.makedirs(out_dir, exist_ok=True)
  written = []
  plots, optional = figures()
  for name, (ylabel, metrics) in plots.items():
    if name in optional and not any(m in r for recs in runs.values() for r in recs for m, _, _ in metrics):
      continue
    fig = matplotlib.figure.Figure(figsize=(11, 4))
    by_step, by_time = fig.subplots(1, 2)
    for i, (label, records) in enumerate(runs.items()):
      color = f"C{i % 10}"
      schedule = schedules.get(label) if name == "learning_rate" else None
      if schedule is not None:
        by_step.plot(schedule.steps, schedule.values, "-", color=color, label=f"{label} schedule")
      for metric, style, suffix in metrics:
        s = series(records, metric)
        if not len(s.steps):
          continue
        if schedule is not None:  # the schedule is the line; the logged means are points
          style, suffix = ".", "logged (mean over each log interval)"
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
    write_file_atomically(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    written.append(path)
  return written


def _best_key(metric: str) -> str:
  return "best_" + metric.replace("/", "_")  # best_eval_top1 | best_eval_mAP


def format_summary(label: str, s: dict) -> str:
  fmt = lambda v, spec: "n/a" if v is None else format(v, spec)
  metric, label_words = s["metric"].replace("/", "_"), s["headline"]
  return (f"{label}: final {label_words} {fmt(s['final_' + metric], '.4f')} at step "
          f"{fmt(s['final_eval_step'], 'd')}; best {label_words} {fmt(s['best_' + metric], '.4f')} at step "
          f"{fmt(s['best_eval_step'], 'd')} after {fmt(s['time_to_best_sec'], '.1f')} s; "
          f"median {fmt(s['median_images_per_sec'], ',.0f')} train images/s; "
          f"last step {s['final_step']}")


def report(workdirs: list[str], out_dir: str | None = None) -> dict:
  """Writes the plots and summaries; returns {label: summary dict}."""
  out_dir = out_dir or (os.path.join(workdirs[0], "report") if len(workdirs) == 1 else "jaxnet-report")
  prepare_output(os.path.join(out_dir, "summary.txt"))
  runs = {}
  for label, workdir in zip(labels_for(workdirs), workdirs):
    runs[label], skipped = read_jsonl_counted(workdir)
    if skipped:
      print(f"note: skipped {skipped} unreadable line{'s' if skipped > 1 else ''} of "
            f"{os.path.join(workdir, 'metrics.jsonl')} (a write cut short, e.g. by a kill)")
  plot(runs, out_dir, {label: learning_rate_schedule(workdir)
                       for label, workdir in zip(labels_for(workdirs), workdirs)})
  summaries = {label: summary(records) for label, records in runs.items()}
  text = "\n".join(format_summary(label, s) for label, s in summaries.items())
  write_atomically(os.path.join(out_dir, "summary.txt"), text + "\n")
  write_atomically(os.path.join(out_dir, "summary.json"), json.dumps(summaries, indent=2))
  print(text)
  print(f"plots and summary in {out_dir}")
  return summaries


# --- a workdir's metrics.jsonl as plottable series, across resumes ----------------------
# Each training process logs `time`, seconds since *it* started training, so a resumed run
# starts again near 0. A new process is recognised by time or step going backwards; its
# times are shifted to continue after the previous process's last record, which gives one
# wall-clock axis for the whole run. Records without `time` (from `--mode=eval`) keep their
# step but have no wall time, and do not replace a timed record of the same step.

@dataclasses.dataclass
class Series:
  steps: np.ndarray
  values: np.ndarray
  times: np.ndarray   # stitched wall seconds; nan where the record had none


def records_with_wall_time(records: list[dict]) -> list[dict]:
  """Copies of the records with `wall_time`: `time` made continuous across resumes."""
  out, offset, prev_time, prev_step, segment_end = [], 0.0, None, None, 0.0
  for record in records:
    record = dict(record)
    if "time" in record:
      t, step = float(record["time"]), record["step"]
      if prev_time is not None and (t < prev_time or step < prev_step):
        offset = segment_end  # a new process: continue the clock where the last one stopped
      record["wall_time"] = offset + t
      prev_time, prev_step, segment_end = t, step, offset + t
    out.append(record)
  return out


def series(records: list[dict], key: str) -> Series:
  """The values of `key` by step (last record per step wins), in step order."""
  by_step = {}
  for record in records_with_wall_time(records):
    if key not in record or record[key] is None:
      continue
    untimed = "wall_time" not in record
    if untimed and record["step"] in by_step:
      continue  # a later `--mode=eval` of a step training already evaluated: keep the timed one
    by_step[record["step"]] = (float(record[key]), record.get("wall_time", np.nan))
  steps = np.array(sorted(by_step), dtype=np.int64)
  values = np.array([by_step[s][0] for s in steps], dtype=np.float64)
  times = np.array([by_step[s][1] for s in steps], dtype=np.float64)
  return Series(steps, values, times)


def summary(records: list[dict]) -> dict:
  """The last and the best of the run's headline eval metric (its task's: a classifier's
  eval/top1, a detector's eval/mAP) with their steps, the best's wall time, median train
  throughput, last step."""
  from jaxnet.core import tasks
  task = tasks.for_records(records)
  metric, key = task.headline, _best_key(task.headline)
  evals = series(records, metric)
  rate = series(records, "train/images_per_sec")
  out = {"final_step": max((r["step"] for r in records), default=0),
         "metric": metric, "headline": task.headline_label,
         "final_" + metric.replace("/", "_"): None, "final_eval_step": None,
         key: None, "best_eval_step": None, "time_to_best_sec": None,
         "median_images_per_sec": float(np.median(rate.values)) if len(rate.values) else None}
  if len(evals.values):
    out["final_" + metric.replace("/", "_")] = float(evals.values[-1])
    out["final_eval_step"] = int(evals.steps[-1])
    # The best is a number: an eval whose metric is nan (a segmenter's mean IoU while a class is
    # in neither its truth nor its predictions) is no candidate; none when every eval is nan.
    numbers = np.flatnonzero(~np.isnan(evals.values))
    if len(numbers):
      best = int(numbers[np.argmax(evals.values[numbers])])  # the first step that reached the best value
      out[key] = float(evals.values[best])
      out["best_eval_step"] = int(evals.steps[best])
      if np.isfinite(evals.times[best]):
        out["time_to_best_sec"] = float(evals.times[best])
  return out


def learning_rate_schedule(workdir: str) -> Series | None:
  """The learning rate the run's optimizer used at each step, from its config.json and the
  run's length (environment.json: total steps, steps per epoch); None without them."""
  from jaxnet.core import config as config_lib
  from jaxnet.core import optim
  from jaxnet.core.errors import UserError
  try:
    with open(os.path.join(workdir, "environment.json")) as f:
      environment = json.load(f)
    config = config_lib.load(workdir)
    total, per_epoch = int(environment["total_steps"]), int(environment["steps_per_epoch"])
  except (OSError, KeyError, ValueError, TypeError, UserError):  # no run there (weights imported
    return None                  # without data: no length), or one this jaxnet cannot rebuild: its logged values only
  warmup = config_lib.duration_in_steps(config, "warmup", per_epoch)
  schedule = optim.learning_rate_schedule(config.optim, config.batch_size, total, warmup)
  # Each step, up to a few thousand points: the warmup's corner and the end included.
  steps = np.unique(np.concatenate([np.linspace(1, total, min(total, 2000)).astype(np.int64),
                                    [min(warmup, total), total]]))
  steps = steps[steps >= 1]
  # The update of step s (1-based, as metrics.jsonl counts) uses the schedule at s - 1.
  values = np.asarray(schedule(steps - 1), dtype=np.float64)
  return Series(steps, values, np.full(len(steps), np.nan))
