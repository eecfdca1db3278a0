"""A workdir's metrics.jsonl as plottable series, across resumes.

Each training process logs `time`, seconds since *it* started training, so a
resumed run starts again near 0. A new process is recognised by time or step
going backwards; its times are shifted to continue after the previous
process's last record, which gives one wall-clock axis for the whole run.
A resumed run drops the records past the step it resumed from, so each step
has one line; where an older jaxnet's log holds a step twice, the later record
wins (it is the one the final model descends from). Records without `time` (from `--mode=eval`) keep their
step but have no wall time, and do not replace a timed record of the same step.
"""

import dataclasses

import numpy as np


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
  """Best eval top-1 (its step and wall time), median train throughput, last step."""
  top1 = series(records, "eval/top1")
  rate = series(records, "train/images_per_sec")
  out = {"final_step": max((r["step"] for r in records), default=0),
         "best_eval_top1": None, "best_eval_step": None, "time_to_best_sec": None,
         "median_images_per_sec": float(np.median(rate.values)) if len(rate.values) else None}
  if len(top1.values):
    best = int(np.argmax(top1.values))  # the first step that reached the best value
    out["best_eval_top1"] = float(top1.values[best])
    out["best_eval_step"] = int(top1.steps[best])
    if np.isfinite(top1.times[best]):
      out["time_to_best_sec"] = float(top1.times[best])
  return out
