"""Where metrics go: WORKDIR/metrics.jsonl, TensorBoard events, and the console.

Only process 0 writes; the others get no-op writers, so multi-host runs
produce one log. Each metrics.jsonl line is one JSON object with "step" and
the metric names of the public contract (train/loss, eval/top1, ...).
"""

import json
import logging
import math
import os
import time

import numpy as np


class MetricWriter:
  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    self._jsonl = None
    self._tb = None
    if enabled:
      os.makedirs(workdir, exist_ok=True)
      # Line-buffered append: a crash loses at most the line being written, and a
      # resumed run continues the same file.
      self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", buffering=1)
      try:
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"), flush_secs=30)
      except ImportError:  # TensorBoard is optional; the JSONL log is the record
        logging.warning("tensorboardX is not installed: no TensorBoard events will be written")

  def write(self, step: int, metrics: dict) -> None:
    if not self.enabled:
      return
    clean = {k: _to_python(v) for k, v in metrics.items()}
    self._jsonl.write(json.dumps({"step": int(step), **clean}) + "\n")
    if self._tb is not None:
      for key, value in clean.items():
        if isinstance(value, (int, float)) and math.isfinite(value):
          self._tb.add_scalar(key, value, int(step))

  def close(self) -> None:
    if self._jsonl:
      self._jsonl.close()
    if self._tb is not None:
      self._tb.close()


def _to_python(value):
  value = np.asarray(value)
  return value.item() if value.size == 1 else value.tolist()


def read_jsonl(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


class Progress:
  """Measures images/s between log steps and prints step, loss, throughput, ETA."""

  def __init__(self, total_steps: int, batch_size: int, start_step: int, enabled: bool = True):
    self.total_steps, self.batch_size, self.enabled = total_steps, batch_size, enabled
    self._last_step, self._last_time = start_step, time.perf_counter()
    self._start_time = self._last_time

  def rate(self, step: int) -> float:
    """Images/s since the previous call (includes input pipeline and logging time)."""
    now = time.perf_counter()
    steps = step - self._last_step
    rate = steps * self.batch_size / max(now - self._last_time, 1e-9)
    self._last_step, self._last_time = step, now
    return rate

  def report(self, step: int, metrics: dict, images_per_sec: float) -> None:
    if not self.enabled:
      return
    eta = (self.total_steps - step) * self.batch_size / max(images_per_sec, 1e-9)
    print(f"step {step:>7}/{self.total_steps}  loss {metrics['train/loss']:.4f}  "
          f"acc {metrics['train/accuracy']:.3f}  lr {metrics['train/learning_rate']:.4g}  "
          f"{images_per_sec:,.0f} img/s  ETA {_fmt_time(eta)}", flush=True)

  def elapsed(self) -> float:
    return time.perf_counter() - self._start_time


def _fmt_time(seconds: float) -> str:
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
