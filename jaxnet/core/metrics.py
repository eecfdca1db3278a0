"""What a run records about itself: WORKDIR/metrics.jsonl, TensorBoard events, the
console's progress lines, and the run's environment (environment.json, classes.json).

Only process 0 writes; the others get no-op writers, so multi-host runs
produce one log. Each metrics.jsonl line is one JSON object with "step" and
the metric names of the public contract (train/loss, eval/top1, ...).
"""

import contextlib
import json
import logging
import math
import os
import time

import numpy as np

from jaxnet.core.errors import UserError, os_error_cause

# What the person running this is told (progress, notes, warnings): shown by the shell
# (jaxnet.api.show_reports), and routable or silenced by whoever embeds the core.
_REPORT = logging.getLogger("jaxnet.report")


class RunWriteError(UserError):
  """Writing one of the run's records (metrics, TensorBoard, config, run info) failed."""

  def __init__(self, path: str, error: OSError):
    self.path, self.cause = path, os_error_cause(error) or str(error)
    super().__init__(f"writing {path} FAILED ({self.cause})")

  def stopped_at(self, step, checkpoint_sentence: str) -> UserError:
    """The one line that ends the run: what failed, where training stopped, what to do."""
    where = f" at step {step}" if step is not None else ""
    fix = "Free space there, then" if self.cause == "no space left on device" else "Fix that, then"
    return UserError(f"{self}{where}; training stopped. {checkpoint_sentence} {fix} rerun the "
                     f"same command to resume.")


@contextlib.contextmanager
def reporting_failed_writes(path: str):
  """An OSError while writing `path` becomes RunWriteError naming it (no traceback chain)."""
  try:
    yield
  except OSError as e:
    raise RunWriteError(path, e) from None


class MetricWriter:
  """Appends one JSON line per step to metrics.jsonl (and scalars to TensorBoard).

  Writing a step that is already the file's last line (train metrics, then the
  eval of the same step) merges into that line, so each step has one line. A
  failed write (a full disk) raises RunWriteError; writing then stops for good.
  """

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    self._jsonl = None
    self._tb = None
    self._last = None  # (step, record, byte offset) of the file's last line
    self._failed = False
    self._path = os.path.join(workdir, "metrics.jsonl")
    if enabled:
      os.makedirs(workdir, exist_ok=True)
      with self._reporting(self._path):
        # Line-buffered append: a crash loses at most the line being written, and a
        # resumed run continues the same file.
        self._jsonl = open(self._path, "a+", buffering=1)
        self._last = _last_record(self._jsonl)
        _end_line(self._jsonl)
      tb_dir = os.path.join(workdir, "tensorboard")
      with self._reporting(tb_dir):
        self._tb = EventFile.create(tb_dir)

  @contextlib.contextmanager
  def _reporting(self, path):
    try:
      with reporting_failed_writes(path):
        yield
    except RunWriteError:
      self._failed = True
      raise

  def write(self, step: int, metrics: dict) -> None:
    if not self.enabled or self._failed:
      return
    clean = {k: _to_python(v) for k, v in metrics.items()}
    record = {"step": int(step), **clean}
    with self._reporting(self._path):
      if self._last is not None and self._last[0] == int(step):
        _, previous, offset = self._last
        record = {**previous, **record}
        self._jsonl.truncate(offset)
      offset = self._jsonl.seek(0, os.SEEK_END)
      self._jsonl.write(json.dumps(record) + "\n")
    self._last = (int(step), record, offset)
    if self._tb is not None:
      with self._reporting(self._tb.path):
        self._tb.add_scalars({k: v for k, v in clean.items()
                              if isinstance(v, (int, float)) and math.isfinite(v)}, int(step))

  def write_config(self, config_json: str) -> None:
    """The run's config as TensorBoard text (Text tab), so a curve says how it was made."""
    if self._tb is not None and not self._failed:
      with self._reporting(self._tb.path):
        self._tb.add_text("config", "```\n" + config_json + "\n```", 0)

  def close(self) -> None:
    """Closes the files; after a failed write, quietly (that failure was already raised)."""
    for f, path in ((self._jsonl, self._path), (self._tb, self._tb and self._tb.path)):
      if f is None:
        continue
      try:
        with reporting_failed_writes(path):
          f.close()
      except RunWriteError:
        if not self._failed:
          self._failed = True
          raise
    self._jsonl = self._tb = None


class EventFile:
  """TensorBoard scalars and text, written in the calling thread (flushed every
  FLUSH_SECS, and at close, as tensorboardX's writer does).

  tensorboardX's SummaryWriter writes from a background thread; when that thread
  dies (a full disk) the next add_* blocks forever on its full queue, and no signal
  can stop the run. Written here, a failed write is an OSError in the training
  loop, which stops the run with one line.
  """

  FLUSH_SECS = 30  # each flush is an fsync

  def __init__(self, logdir: str, tensorboardx):
    os.makedirs(logdir, exist_ok=True)
    self._summary, self._event_pb2 = tensorboardx
    from tensorboardX.event_file_writer import EventsWriter
    self._writer = EventsWriter(os.path.join(logdir, "events"))
    self.path = logdir
    self._flushed = 0.0

  def _flush_now_and_then(self) -> None:
    if time.monotonic() - self._flushed > self.FLUSH_SECS:
      self._writer.flush()
      self._flushed = time.monotonic()

  @classmethod
  def create(cls, logdir: str):
    """An EventFile in `logdir`, or None (with a warning) when tensorboardX is missing."""
    try:
      from tensorboardX import summary
      from tensorboardX.proto import event_pb2
    except ImportError:  # TensorBoard is optional; the JSONL log is the record
      logging.warning("tensorboardX is not installed: no TensorBoard events will be written")
      return None
    return cls(logdir, (summary, event_pb2))

  def _add(self, summary, step: int) -> None:
    self._writer.write_event(self._event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

  def add_scalars(self, values: dict, step: int) -> None:
    for key, value in values.items():
      self._add(self._summary.scalar(key, value), step)
    self._flush_now_and_then()

  def add_text(self, tag: str, text: str, step: int) -> None:
    self._add(self._summary.text(tag, text), step)
    self._flush_now_and_then()

  def close(self) -> None:
    self._writer.close()


def _to_python(value):
  value = np.asarray(value)
  return value.item() if value.size == 1 else value.tolist()


def _last_record(f):
  """(step, record, offset) of the last complete line of an open metrics file, or None."""
  f.seek(0)
  offset, last = 0, None
  for line in iter(f.readline, ""):
    if line.endswith("\n") and line.strip():
      try:
        record = json.loads(line)
        last = (record["step"], record, offset)
      except (ValueError, KeyError):
        last = None
    offset = f.tell()
  return last


def _end_line(f) -> None:
  """Ends a last line cut short (a kill during a write), so this writer's records start on
  a line of their own instead of joining it into one unreadable line; readers skip it."""
  end = f.seek(0, os.SEEK_END)
  if end:
    f.seek(end - 1)
    if f.read(1) != "\n":
      f.write("\n")


def replace_atomically(path: str, write) -> None:
  """Calls write(tmp) for a file beside `path` (so the rename is atomic), then renames it to
  `path`: `path` is whole or untouched. The writer creates the file, so it gets the usual
  permissions."""
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    write(tmp)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):  # a failed write (a full disk): give the space back
      os.remove(tmp)


def write_atomically(path: str, text: str) -> None:
  """Writes `path` whole or not at all; a failed write is RunWriteError naming it."""
  def write(tmp):
    with open(tmp, "w") as f:
      f.write(text)
  write_file_atomically(path, write)


def write_file_atomically(path: str, write) -> None:
  """replace_atomically, with a failed write (a full disk, a read-only folder) one
  RunWriteError naming `path` and the cause."""
  with reporting_failed_writes(path):
    replace_atomically(path, write)


def prepare_output(path: str) -> None:
  """Before the work that ends in writing `path` for a user (an export, a plot, a dump):
  `path` is no directory, and its folder exists (it is created) and takes files. A UserError
  naming the fix otherwise, so nothing expensive runs for an output that cannot be written."""
  path = os.path.abspath(path)
  if os.path.isdir(path):
    raise UserError(f"{path} is a directory: name the file to write (e.g. {os.path.join(path, 'model')}...)")
  folder = os.path.dirname(path)
  try:
    os.makedirs(folder, exist_ok=True)
    probe = os.path.join(folder, f".jaxnet-write-test-{os.getpid()}")
    with open(probe, "w"):
      pass
    os.remove(probe)
  except OSError as e:
    raise UserError(f"cannot write {path}: its folder {folder} does not take files "
                    f"({os_error_cause(e) or e}); choose another place") from None


def drop_records_after(workdir: str, step: int) -> int:
  """Removes metrics.jsonl records of steps after `step` (a resumed run redoes them).

  Returns how many were dropped. The file is replaced atomically.
  """
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    lines = f.readlines()
  keep = []
  for line in lines:
    try:
      if json.loads(line)["step"] <= step:
        keep.append(line)
    except (ValueError, KeyError, TypeError):
      pass  # a line cut short by a crash
  if len(keep) != len(lines):
    write_atomically(path, "".join(keep))
  return len(lines) - len(keep)


def write_run_info(workdir: str, *, total_steps: int, steps_per_epoch: int, num_classes: int,
                   class_names, started_at_step: int = 0) -> None:
  """environment.json (versions, XLA flags, devices, the code: how the numbers were made;
  jaxnet/core/provenance.py), code.diff (the uncommitted changes, where there are any) and
  classes.json (what predict/export need to rebuild the model without the dataset)."""
  import flax
  import jax
  import optax
  from jaxnet.core import provenance
  code = provenance.code_state()
  revision, diff = code["git_revision"], code["diff"]
  classes = json.dumps({"num_classes": num_classes, "class_names": class_names}, indent=2)
  environment = {
      **provenance.environment(),
      "jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__,
      "git_revision": revision,
      "jaxnet": code["jaxnet"], "code_diff_sha256": provenance.text_sha256(diff) if diff else "",
      "total_steps": total_steps, "steps_per_epoch": steps_per_epoch,
      # Which start wrote this: a resume keeps the previous start's records under this step
      # (jaxnet/core/workdir.py, keep_start_records).
      "started_at_step": started_at_step,
      # The records that decide what the model is, as written (verify compares them).
      "records_sha256": provenance.records_sha256(workdir, {"classes.json": classes})}
  write_atomically(os.path.join(workdir, "classes.json"), classes)
  write_atomically(os.path.join(workdir, "environment.json"), json.dumps(environment, indent=2))
  # The diff of this start's code: a clean tree leaves none (a resumed run's last start wins,
  # as in environment.json).
  diff_path = os.path.join(workdir, provenance.CODE_DIFF_FILE)
  if diff:
    write_atomically(diff_path, diff)
  elif os.path.exists(diff_path):
    os.remove(diff_path)


def read_jsonl(workdir: str) -> list[dict]:
  """The records of WORKDIR/metrics.jsonl; lines that are not records are skipped
  (read_jsonl_counted says how many)."""
  return read_jsonl_counted(workdir)[0]


def read_jsonl_counted(workdir: str) -> tuple[list[dict], int]:
  """(records, how many lines were skipped): a line cut short by a kill during a write
  is not a record, and one torn line must not make the whole log unreadable."""
  records, skipped = [], 0
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError:
        record = None
      if isinstance(record, dict) and "step" in record:
        records.append(record)
      else:
        skipped += 1
  return records, skipped


class Progress:
  """Measures images/s between log steps and prints step, loss, throughput, ETA."""

  def __init__(self, total_steps: int, batch_size: int, start_step: int, enabled: bool = True,
               describe=lambda metrics: ""):
    """`describe(metrics)`: the task's train metrics in a few words (Task.describe_train)."""
    self.total_steps, self.batch_size, self.enabled = total_steps, batch_size, enabled
    self.describe = describe
    self._last_step, self._last_time = start_step, time.perf_counter()
    self._start_time = self._last_time

  def rate(self, step: int) -> float:
    """Images/s since the previous call (includes input pipeline and logging time)."""
    now = time.perf_counter()
    steps = step - self._last_step
    rate = steps * self.batch_size / max(now - self._last_time, 1e-9)
    self._last_step, self._last_time = step, now
    return rate

  def report(self, step: int, metrics: dict, images_per_sec: float, window: int = 0) -> None:
    """Prints one progress line; notes when the averages cover fewer steps than `window`."""
    if not self.enabled:
      return
    eta = (self.total_steps - step) * self.batch_size / max(images_per_sec, 1e-9)
    steps = metrics.get("train/window_steps", window)
    note = f"  (mean of {steps} steps)" if window and steps < window else ""
    own = self.describe(metrics)  # the task's: a classifier's accuracy
    _REPORT.info(f"step {step:>7}/{self.total_steps}  loss {metrics['train/loss']:.4f}  "
                 f"{own + '  ' if own else ''}lr {metrics['train/learning_rate']:.4g}  "
                 f"{images_per_sec:,.0f} img/s  ETA {_fmt_time(eta)}{note}")

  def elapsed(self) -> float:
    return time.perf_counter() - self._start_time


def _fmt_time(seconds: float) -> str:
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
