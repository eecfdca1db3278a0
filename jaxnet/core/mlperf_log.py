"""A run's events in MLPerf Training's log format, beside metrics.jsonl: WORKDIR/mlperf.log.

The format is mlperf-logging's `mllog` (mlcommons/logging): one line per event,
`:::MLLOG {"namespace", "time_ms", "event_type", "key", "value", "metadata"}`, with the
keys MLPerf's compliance checker reads (mlperf_logging/compliance_checker, ResNet's rules):
the run's settings, init_start/init_stop (set-up and compiles), run_start, a block per eval
interval (block_start/block_stop by samples), eval_start/eval_stop/eval_accuracy, and
run_stop with a status: "success" once an eval reached config.target_accuracy (with none
set: the run completed), "aborted" otherwise. jaxnet writes the format itself (no
dependency); `python experiments/time_to_accuracy.py` reads it back, and tests run the
checker on a short run's log where the package is installed.

A jaxnet run is no MLPerf submission: submission_* say so (organisation "jaxnet (not a
submission)", division "open", status "research"), and cache_clear is logged False (jaxnet
drops no caches before a run).
"""

from __future__ import annotations

import json
import os
import time

FILE = "mlperf.log"
PREFIX = ":::MLLOG "


def now_ms() -> int:
  return int(time.time() * 1000)


class MlperfLog:
  """Appends MLPerf log events to WORKDIR/mlperf.log (only on the chief process)."""

  def __init__(self, workdir: str, enabled: bool = True, fresh: bool = True):
    """`fresh`: a run from step 0 starts the file anew; a resumed run appends its events."""
    self._file = open(os.path.join(workdir, FILE), "w" if fresh else "a", buffering=1) if enabled else None
    self.status = "aborted"

  def event(self, key: str, value=None, metadata: dict | None = None, event_type: str = "POINT_IN_TIME",
            time_ms: int | None = None):
    if self._file is None:
      return
    line = {"namespace": "", "time_ms": time_ms or now_ms(), "event_type": event_type, "key": key,
            "value": value, "metadata": {"file": "jaxnet/core/train.py", "lineno": 0, **(metadata or {})}}
    try:
      self._file.write(PREFIX + json.dumps(line) + "\n")
    except OSError:  # a full disk: metrics.jsonl's writer says so; this log stops
      self.close()

  def start(self, key: str, value=None, metadata: dict | None = None, time_ms: int | None = None):
    self.event(key, value, metadata, "INTERVAL_START", time_ms)

  def end(self, key: str, value=None, metadata: dict | None = None, time_ms: int | None = None):
    self.event(key, value, metadata, "INTERVAL_END", time_ms)

  def settings(self, config, *, devices: str, train_samples: int, eval_samples: int) -> None:
    """The submission_* and hyperparameter events, MLPerf's names for the config's values."""
    o = config.optim
    from jaxnet.core import models
    for key, value in (("submission_benchmark", models.declared(config.model.name, "MLPERF_BENCHMARK",
                                                                config.model.name)),
                       ("submission_org", "jaxnet (not a submission)"), ("submission_division", "open"),
                       ("submission_status", "research"), ("submission_platform", devices),
                       ("cache_clear", False), ("seed", config.seed),
                       ("global_batch_size", config.batch_size),
                       ("gradient_accumulation_steps", config.grad_accum_steps),
                       ("train_samples", train_samples), ("eval_samples", eval_samples),
                       ("opt_name", o.name)):
      self.event(key, value)
    if o.name == "lars":
      lr = o.learning_rate * config.batch_size / o.base_batch_size
      for key, value in (("lars_opt_base_learning_rate", lr),
                         ("lars_opt_end_learning_rate", lr * o.end_lr_fraction),
                         ("lars_opt_learning_rate_decay_poly_power", 2 if o.schedule == "poly2" else o.schedule),
                         ("lars_opt_learning_rate_warmup_epochs", o.warmup_epochs),
                         ("lars_epsilon", 0.0), ("lars_opt_momentum", o.momentum),
                         ("lars_opt_weight_decay", o.weight_decay)):
        self.event(key, value)
    elif o.name == "sgd":
      lr = o.learning_rate * config.batch_size / o.base_batch_size
      for key, value in (("opt_base_learning_rate", lr), ("opt_learning_rate_warmup_epochs", o.warmup_epochs),
                         ("opt_momentum", o.momentum), ("opt_weight_decay", o.weight_decay)):
        self.event(key, value)

  def eval(self, accuracy: float | None, step: int, samples: int, epoch: float, target: float) -> None:
    """An eval's accuracy (the task's headline metric, a classifier's eval/top1; None: the
    eval gave none); "success" from the first one at or past `target`."""
    if accuracy is None:
      return
    where = {"epoch_num": round(epoch, 4), "samples_count": samples, "step": step}
    self.event("eval_accuracy", float(accuracy), where)
    if target and accuracy >= target:
      self.status = "success"

  def close(self) -> None:
    if self._file is not None:
      try:
        self._file.close()
      except OSError:
        pass
      self._file = None


def read(path: str) -> list[dict]:
  """The events of an MLPerf log (lines that are not events are skipped)."""
  events = []
  with open(path) as f:
    for line in f:
      if line.startswith(PREFIX):
        try:
          events.append(json.loads(line[len(PREFIX):]))
        except ValueError:  # a line cut by a crash
          pass
  return events
