"""The one gate into a workdir (`Workdir`): every command that writes into a workdir (training,
an eval's record, a weights import) opens it here, which takes its lock and checks the saved
config before anything is written; no other module writes a workdir's files
(tests/test_layers.py lists the writers).

A resumed run must be the same experiment: its config is compared with the workdir's
config.json before anything is written (a deleted config.json is first restored from the
config the newest checkpoint carries). Keys that only change how the run is carried out
(RESUMABLE) may change and are recorded in config_history.jsonl; any other change stops
the run with a list of the changes. An eval is held to what it measures (EVAL_INPUTS): an
eval that differs there is refused, or, accepted, recorded apart, never over the run's record.
"""

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import shutil
import socket

import jax

from jaxnet.core import checkpoint as ckpt
from jaxnet.core import config as config_lib
from jaxnet.core import metrics as metrics_lib
from jaxnet.core import mlperf_log as mlperf_log_lib
from jaxnet.core import provenance
from jaxnet.core.checkpoint import newest_saved_config
from jaxnet.core.errors import UserError
from jaxnet.core.metrics import reporting_failed_writes, write_atomically

# What the person running this is told (progress, notes, warnings): shown by the shell
# (jaxnet.api.show_reports), and routable or silenced by whoever embeds the core.
_REPORT = logging.getLogger("jaxnet.report")

LOCK_FILE, CONFIG_FILE, HISTORY_FILE = "lock", "config.json", "config_history.jsonl"
EVALS_WITH_CHANGES_FILE = "evals_with_changes.jsonl"
# Each start writes these for itself; a resume keeps the previous start's copies in
# WORKDIR/starts/<the step it started at>/ (keep_start_records).
STARTS_DIR = "starts"
START_RECORDS = ("environment.json", provenance.CODE_DIFF_FILE, provenance.CONFIG_TEXT_FILE)
TRAIN, EVAL, IMPORT = "train", "eval", "import"  # why a workdir is opened
# A bundle's manifest and model card (jaxnet/tools/bundle.py): a folder with either is read,
# never written (an eval of it records nothing).
BUNDLE_FILES = ("bundle.json", "MODEL_CARD.md")


class WorkdirLockedError(UserError):
  pass


# What holds a lock, as the refused command is told it (the lock file's first word says which).
_HOLDERS = {"train": "another training run", "import": "a weights import",
            "eval": "an eval recording its metrics"}


def describe_holder(text: str) -> str:
  """The lock file's line ("train: host H, PID N, started T") as "another training run (host
  H, PID N, started T)"; a line without a purpose (jaxnet before 2026-11-29) is a training run."""
  purpose, _, rest = text.strip().partition(": ")
  if purpose not in _HOLDERS:
    purpose, rest = "train", text.strip()
  return f"{_HOLDERS[purpose]} ({rest or 'unknown process'})"


class Lock:
  """An exclusive OS lock (`fcntl.flock`) on WORKDIR/lock while a command writes into it (a
  context manager), for `purpose` (TRAIN, IMPORT, EVAL: written into the lock file, so a
  refused command is told what holds it). The OS drops it when the process ends, even on
  `kill -9`, so a lock is never stale; a second writer is refused at once, naming the holder."""

  def __init__(self, workdir: str, purpose: str = "train"):
    self.path = os.path.join(workdir, LOCK_FILE)
    self.purpose = purpose
    self._file = None

  def __enter__(self):
    try:
      f = open(self.path, "a+")
    except OSError as e:
      if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return self  # a read-only workdir: no writer can get in, so there is no one to lock out
      raise UserError(f"could not create the lock file {self.path} ({e.strerror}): "
                      f"free space on its disk or fix its permissions") from None
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.seek(0)
      holder = describe_holder(f.read())
      f.close()
      raise WorkdirLockedError(
          f"{os.path.dirname(self.path)} is in use by {holder}. Wait for "
          f"it to finish or stop it, or train in another --workdir.") from None
    except OSError as e:  # e.g. an NFS mount without lock support
      logging.getLogger(__name__).warning(
          "could not lock %s (%s): nothing stops a second run from using this workdir at the same "
          "time", self.path, e)
      f.close()
      return self
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    try:
      f.seek(0)
      f.truncate()
      f.write(f"{self.purpose}: host {socket.gethostname()}, PID {os.getpid()}, started {started}\n")
      f.flush()
    except OSError as e:  # a full disk: nothing else could be written either
      fcntl.flock(f, fcntl.LOCK_UN)
      with contextlib.suppress(OSError):  # the buffered line fails again as it closes
        f.close()
      raise UserError(f"could not write the lock file {self.path} ({e.strerror}): "
                      f"free space on its disk and run again") from None
    self._file = f
    return self

  def __exit__(self, *exc):
    if self._file is not None:
      fcntl.flock(self._file, fcntl.LOCK_UN)
      self._file.close()
      self._file = None


def held_by(workdir: str) -> str | None:
  """What holds WORKDIR's lock (the holder its lock file names), or None: found without
  taking the lock, so a reader (verify, eval, predict) never keeps a training out. Linux's
  /proc/locks lists the flock locks held; elsewhere a shared lock is tried for an instant."""
  path = os.path.join(workdir, LOCK_FILE)
  try:
    inode = os.stat(path).st_ino
  except OSError:
    return None
  try:
    with open("/proc/locks") as f:  # "1: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE 0 EOF"
      held = any(len(fields) > 5 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode)
                 for fields in (line.split() for line in f))
  except OSError:
    held = _held_elsewhere(path)
  if not held:
    return None
  return describe_holder(_read_text_or_none(path) or "")


def _held_elsewhere(path: str) -> bool:
  try:
    with open(path) as f:
      try:
        fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
      except BlockingIOError:
        return True
      fcntl.flock(f, fcntl.LOCK_UN)
  except OSError:
    pass
  return False


class Workdir:
  """A workdir opened for writing (`Workdir.open`): the lock held, and, once `check` has passed,
  the only object that writes its files: config.json and its history, environment.json and
  classes.json, the earlier starts' records (starts/), metrics.jsonl, the checkpoints, an
  eval's record, the preprocessing record.
  Every process of a run opens it; process 0 holds the lock and writes the records."""

  def __init__(self, path: str, purpose: str):
    self.path, self.purpose = path, purpose
    self.changes = None    # the accepted config changes, once checked
    self.moved = {}        # changes of MOVED_KEYS not accepted by name: check_data decides them
    # The data's identity per split, once checked (check_data); an import reads no data: {}.
    self.data_identity = {} if purpose == IMPORT else None
    self.data_changes = {}     # its accepted changes from the recorded one (process 0's)
    self.data_change_accepted = False  # a change of the data may be taken (every process knows)
    self.locked = False    # process 0 holds the lock (every process agrees on it)
    self.chief = jax.process_index() == 0

  @classmethod
  @contextlib.contextmanager
  def open(cls, path: str, purpose: str):
    """Opens `path` for `purpose` (TRAIN, EVAL or IMPORT). Training and imports create it and
    must get the lock (a second writer is refused in one line); an eval is a reader: it takes
    no lock while it reads (a training may start beside it), only for the moment it records
    (record_eval), and records nothing where a training holds the workdir. A workdir this
    call created and nothing was written into is removed again if the command fails."""
    check_path(path)
    bundle = next((n for n in BUNDLE_FILES if os.path.isfile(os.path.join(path, n))), None)
    if bundle and purpose != EVAL:
      raise UserError(f"{path} is a bundle (it has {bundle}): nothing is written into a bundle. Train in a "
                      f"new --workdir, with --config.init.weights={path} to start from its weights")
    created = not os.path.exists(path)
    if purpose != EVAL:
      os.makedirs(path, exist_ok=True)
    gate = cls(path, purpose)
    try:
      with contextlib.ExitStack() as stack:
        if purpose != EVAL:
          gate._lock(stack)
        yield gate
    except BaseException:
      if created:  # refused before writing anything (a bad model name, too few devices, ...)
        remove_if_unused(path)
      raise

  def _lock(self, stack: contextlib.ExitStack) -> None:
    from jaxnet.core import sharding
    error = None
    if self.chief:
      try:
        stack.enter_context(Lock(self.path, self.purpose))
      except UserError as e:  # held by another writer, or the lock file could not be written
        error = e
    if sharding.any_process(error is not None):
      raise error or WorkdirLockedError(f"process 0 could not lock {self.path}")
    self.locked = True

  def check(self, config_dict: dict, accept: tuple = ()) -> dict:
    """Compares `config_dict` with the config the workdir was made with, before anything is
    written, by the purpose's rule: training, every key but the RESUMABLE ones (once it has
    checkpoints); an eval, what it measures (EVAL_INPUTS); an import needs a workdir without
    checkpoints. Returns the accepted changes; raises ConfigChangedError for the others."""
    if self.purpose == IMPORT and ckpt.has_checkpoints(self.path):
      raise UserError(f"{self.path} already holds checkpoints: import into a new --workdir")
    # Where the data is (MOVED_KEYS) is left to check_data: the same data moved is no change.
    with_moves = tuple(accept) + MOVED_KEYS
    if self.purpose == EVAL:
      changes = check_config(self.path, config_dict, with_moves, changes_what_eval_sees)
      unused = unused_by_eval(config_dict)
      self.changes = {k: v for k, v in changes.items() if changes_what_eval_sees(k) and k not in unused}
    elif self.purpose == TRAIN and ckpt.has_checkpoints(self.path):
      self.changes = check_config(self.path, config_dict, with_moves)
    else:
      self.changes = {}
    self.moved = {k: v for k, v in self.changes.items()
                  if k in MOVED_KEYS and k not in accept and "all" not in accept}
    return self.changes

  def check_data(self, sources: dict, accept: tuple = (), kind: str = "listing") -> dict:
    """Compares the data's identity ({split: source.identity()} of `sources`, {split: source},
    provenance.data_identity) with the one recorded at the run's start (data_identity.json),
    as `check` does the config: a resume, every split; an eval, the split it reads. A change is
    refused in one line unless accepted (provenance.ACCEPT_DATA, or "all"; or it follows from
    an accepted change of a key the sources are made from, provenance.SOURCE_KEYS); an
    accepted eval is then recorded apart, as one with config changes.
    Only process 0 computes the identity (which may list or hash a whole folder) and decides;
    every process then refuses, or none does.
    Also warns of a jaxlib (or CUDA plugin) or device kind that differs from the recorded.
    `kind` (config.data.identity) is how a new record is taken; a recorded split is compared
    by the kind it was recorded with."""
    recorded, problem = self.recorded_data_identity() if self.chief else (None, "")
    self.data_identity = provenance.data_identity(sources, kind, recorded) if self.chief else None
    checked = self.purpose == EVAL or (self.purpose == TRAIN and ckpt.has_checkpoints(self.path))
    if not checked:
      return {}
    # Another data.dir, accepted or not, never accepts other data by itself: it says where the
    # data is, and the identity says whether it is the same.
    source_keys_changed = any(provenance.makes_the_sources(k) for k in self.changes or {}
                              if k not in MOVED_KEYS and not resumable(k))
    accept = tuple(accept) + ((provenance.ACCEPT_DATA,) if source_keys_changed else ())
    # Known to every process (the same command line), unlike the changes process 0 finds.
    self.data_change_accepted = provenance.ACCEPT_DATA in accept or "all" in accept
    refused = None
    if self.chief:
      try:
        if problem:  # never rewritten from this data unasked: it is what the data is checked against
          self.data_changes = provenance.check_record(self.path, problem, accept)
        elif recorded is None and self.moved:
          raise provenance.DataChangedError(
              f"{self.path} has no record of its data's identity to check the data at the new "
              f"{_moves(self.moved)} against: accept it with --accept_config_changes={','.join(self.moved)}")
        else:
          self.data_changes = provenance.check_identity(self.path, recorded, self.data_identity, accept)
      except provenance.DataChangedError as e:
        refused = e
    self._refuse_on_every_process(refused)
    if self.purpose == EVAL and self.moved and not self.data_changes:  # the same data, moved
      self.changes = {k: v for k, v in self.changes.items() if k not in self.moved}
    if self.chief and self.moved and not self.data_changes and recorded:  # an import's {} saw no data
      _REPORT.info(f"the data moved ({_moves(self.moved)}): its identity is the recorded one")
    # Its numbers describe other data: recorded apart, with what changed (where no accepted
    # config change, recorded already, made the data change).
    if self.purpose == EVAL and self.data_changes and not source_keys_changed:
      self.changes = {**(self.changes or {}), **{f"{provenance.ACCEPT_DATA}.{k}": v
                                                 for k, v in self.data_changes.items()}}
    if self.chief:
      for line in provenance.environment_warnings(self.recorded_environment(), provenance.environment()):
        _REPORT.warning(f"warning: {line}: its numbers may differ in the last digits")
    return self.data_changes

  def _refuse_on_every_process(self, refused: Exception | None) -> None:
    """Process 0's verdict on the data, on every process: the others computed no identity,
    and a refusal on one process alone would leave the others waiting in a collective."""
    from jaxnet.core import sharding
    if sharding.any_process(refused is not None):
      raise refused or provenance.DataChangedError(
          f"the data differs from the data {self.path} was made with (process 0 names the changes): "
          f"use that data, or accept the change with --accept_config_changes={provenance.ACCEPT_DATA}")

  def recorded_data_identity(self) -> tuple[dict | None, str]:
    """(data_identity.json's content, ""), or (None, why it is not there: "missing" where the
    run wrote one, "unreadable (...)"); (None, "") for a workdir older than the record (its
    environment.json lists no packages, recorded with it since 2026-11-27)."""
    path = os.path.join(self.path, provenance.DATA_IDENTITY_FILE)
    if not os.path.exists(path):
      environment = self.recorded_environment() or {}
      return None, "missing" if "packages" in environment else ""
    content = _read_json_or_none(path)
    return (content, "") if isinstance(content, dict) else (None, "unreadable")

  def recorded_environment(self) -> dict | None:
    return _read_json_or_none(os.path.join(self.path, "environment.json"))

  def _writable(self) -> None:
    if self.changes is None:
      raise RuntimeError(f"{self.path}: Workdir.check must pass before anything is written")
    if not self.locked and self.purpose != EVAL:
      raise WorkdirLockedError(f"{self.path} is not locked: nothing was written into it")

  # --- the writers ------------------------------------------------------------------------

  def record_config(self, config_json: str, step: int | None, report=None) -> None:
    self._writable()
    if self.chief:
      record_config(self.path, config_json, self.changes, step, report)

  def keep_previous_start(self) -> str | None:
    """Before a training start rewrites its own records (START_RECORDS), keeps the previous
    start's copies in WORKDIR/starts/<step>/; returns that folder, or None (nothing to keep)."""
    self._writable()
    if not self.chief or self.purpose != TRAIN:
      return None
    return keep_start_records(self.path)

  def write_run_info(self, **info) -> None:
    self._writable()
    if self.chief:
      metrics_lib.write_run_info(self.path, **info)

  def drop_records_after(self, step: int) -> None:
    """Records past a restored step describe a model that no longer exists."""
    self._writable()
    if self.chief:
      metrics_lib.drop_records_after(self.path, step)

  def metric_writer(self) -> metrics_lib.MetricWriter:
    self._writable()
    return metrics_lib.MetricWriter(self.path, enabled=self.chief)

  def mlperf_log(self, fresh: bool) -> mlperf_log_lib.MlperfLog:
    """WORKDIR/mlperf.log (MLPerf's log format), new for a run from step 0, appended on resume."""
    self._writable()
    return mlperf_log_lib.MlperfLog(self.path, enabled=self.chief, fresh=fresh)

  def checkpoints(self, keep: int | None = None, async_save: bool = True) -> ckpt.Checkpoints:
    self._writable()
    return ckpt.Checkpoints(self.path, keep, async_save)

  def write_json(self, name: str, content: dict | str) -> None:
    """A record of the run's own, e.g. the preprocessing its init weights expect (a dict,
    written as JSON), or the config file's text (a str, written as it is)."""
    self._writable()
    if self.chief:
      text = content if isinstance(content, str) else json.dumps(content, indent=2)
      write_atomically(os.path.join(self.path, name), text)

  def record_data_identity(self, step: int | None) -> None:
    """data_identity.json: the identity check_data saw; accepted changes of it go to
    config_history.jsonl, with the step the run resumed from."""
    self._writable()
    if not self.chief or self.data_identity is None:
      return
    if self.data_changes:
      record_data_changes(self.path, self.data_changes, step)
      _REPORT.info(f"data changes accepted on resume: {provenance.describe_changes(self.data_changes)}")
    write_atomically(os.path.join(self.path, provenance.DATA_IDENTITY_FILE),
                     json.dumps(self.data_identity, indent=2))

  def record_eval(self, step: int, metrics: dict) -> str:
    """An eval's numbers, by process 0: in metrics.jsonl when it measured what the run
    measures, else (with accepted changes) apart, in evals_with_changes.jsonl. Returns where.
    The lock is taken for the moment of the write: where a training (or an import) holds the
    workdir, nothing is written (WorkdirLockedError names the holder)."""
    self._writable()
    if not self.chief:
      return ""
    with Lock(self.path, EVAL):
      return self._write_eval(step, metrics)

  def _write_eval(self, step: int, metrics: dict) -> str:
    if self.changes:
      record_eval_with_changes(self.path, step, metrics, self.changes)
      return EVALS_WITH_CHANGES_FILE
    writer = metrics_lib.MetricWriter(self.path)
    try:
      writer.write(step, metrics)
    finally:
      writer.close()
    return "metrics.jsonl"
ABSENT = object()  # a key one of two configs does not have

# Keys that say where the data is, not what it is: a change of one is accepted without being
# named where the data's identity (data_identity.json) is unchanged, e.g. a folder moved.
MOVED_KEYS = ("data.dir",)


def _moves(moved: dict) -> str:
  return ", ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in moved.items())


# Keys that may change between a run and its resume: cadence, length, input
# throughput, checkpoint handling and the device mesh (a checkpoint restores onto any
# device count and FSDP layout). They change neither what a step computes nor
# which examples it sees (a mesh only changes the order of float sums). data.workers is
# not among them: Grain batches inside each worker, so the worker count decides which
# examples share a batch, and the saved iterator position only fits the same count.
RESUMABLE = (
    "log_every_steps", "eval_every_steps", "checkpoint_every_steps", "eval_every_epochs",
    "checkpoint_every_epochs", "total_steps", "num_epochs",
    "keep_checkpoints", "async_checkpointing", "data.workers", "data.read_threads", "data.prefetch",
    "data.eval_batch_size", "data.identity", "profile_steps", "distributed.*", "mesh.*", "target_accuracy",
)


class ConfigChangedError(UserError):
  pass


def check_path(workdir: str) -> None:
  """A --workdir that exists must be a directory (a missing one is created)."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise UserError(f"--workdir {workdir} is a file, not a directory: give a directory "
                    f"(it is created if missing)")


def remove_if_unused(workdir: str) -> None:
  """Removes a workdir this run created if it holds nothing but the lock: a run refused
  before it wrote anything leaves no directory behind."""
  try:
    if set(os.listdir(workdir)) <= {LOCK_FILE}:
      if os.path.exists(os.path.join(workdir, LOCK_FILE)):
        os.remove(os.path.join(workdir, LOCK_FILE))
      os.rmdir(workdir)
  except OSError:  # another process of the run removed it first, or wrote into it
    pass


def resumable(key: str) -> bool:
  """Whether `key` may change between a run and its resume (RESUMABLE)."""
  return any(key == k or (k.endswith(".*") and key.startswith(k[:-1])) for k in RESUMABLE)


def config_changes(old: dict, new: dict, defaults: dict | None = None) -> dict:
  """{key: (old, new)} for every flattened key whose value differs.

  Keys that only one side has are changes too, except where a newer jaxnet added
  a key at its default (`defaults`, flattened) or dropped one.
  """
  flatten = config_lib.flatten
  a, b, defaults = flatten(old), flatten(new), defaults or {}
  changes = {}
  for k in sorted(set(a) | set(b)):
    if k not in b or (k not in a and k in defaults and b[k] == defaults[k]):
      continue
    if a.get(k, ABSENT) != b[k]:
      changes[k] = (a.get(k, ABSENT), b[k])
  return changes


def check_config(workdir: str, config_dict: dict, accept: tuple[str, ...] = (),
                 matters=None) -> dict:
  """Compares a config with the one WORKDIR was trained with; returns the accepted changes.

  Raises ConfigChangedError listing every change whose key `matters` (default: a resume's
  rule, every key but the RESUMABLE ones) and that is not named in `accept` (keys, or
  "all"). Writes nothing, except that a missing config.json is put back from the
  checkpoints (saved_config).
  """
  matters = matters or (lambda key: not resumable(key))
  old = saved_config(workdir)
  if old is None:
    return {}
  changes = saved_config_changes(old, config_dict)
  unused = unused_by_eval(config_dict)
  refused = {k: v for k, v in changes.items()
             if matters(k) and k not in unused and "all" not in accept and k not in accept}
  if refused:
    lines = "\n".join(f"  {k}: {_show(a)} -> {_show(b)}" for k, (a, b) in refused.items())
    raise ConfigChangedError(
        f"this config differs from the one {workdir} was trained with:\n{lines}\n"
        f"Use a new --workdir, or accept the changes for this workdir with "
        f"--accept_config_changes={','.join(refused)}")
  return changes


def saved_config_changes(saved: dict, config_dict: dict) -> dict:
  """config_changes from a saved config (config.json, a checkpoint's) to `config_dict`; keys a
  newer jaxnet added, at their defaults (the model's options among them), are no change."""
  base = config_lib.base_config()
  base.model.name = config_dict["model"]["name"]
  defaults = json.loads(config_lib.with_model_options(base).to_json_best_effort())
  return config_changes(config_lib.upgrade_saved(saved), config_dict, config_lib.flatten(defaults))


# Sources that store whole images already at image_size: their eval crops nothing, so the eval
# crop keys change none of a run's numbers (jaxnet/configs/digits.py records 1.0 since 2026-11-27, the
# resize a predicted file gets; its older workdirs recorded 0.875 and resume all the same).
ARRAY_SOURCES = ("digits", "synthetic")


def unused_by_eval(config_dict: dict) -> set:
  """Keys whose change alters neither training nor the eval of this config's data."""
  if config_dict.get("data", {}).get("source") in ARRAY_SOURCES:
    return {"data.eval_crop_fraction", "data.eval_interpolation"}
  return set()


# What an eval measures: the model (its options, precision, EMA) and the eval data the way
# it sees it. A change to one of these makes another experiment's number.
EVAL_INPUTS = ("model.", "image_size", "precision", "ema_decay", "data.source", "data.name", "data.dir",
               "data.eval_split", "data.eval_crop_fraction", "data.eval_interpolation", "data.mean",
               "data.std", "data.num_classes", "data.synthetic_size", "init.preprocessing")


def changes_what_eval_sees(key: str) -> bool:
  """Whether `key` is one of EVAL_INPUTS or of a task's (Task.eval_keys: detection.*)."""
  from jaxnet.core import tasks
  inputs = EVAL_INPUTS + tuple(k for task in tasks.all_tasks() for k in task.eval_keys)
  return any(key == k or (k.endswith(".") and key.startswith(k)) for k in inputs)


def saved_config(workdir: str) -> dict | None:
  """The config WORKDIR was trained with: its config.json, or, where that was deleted,
  the config saved with the newest checkpoint that has one (config.json is then
  restored from it, by process 0). None for a workdir without either.

  An unreadable config.json is an error naming it: guessing would defeat the check.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if os.path.exists(path):
    return config_lib.read_json(path)
  step, config = newest_saved_config(workdir)
  if config is None:
    return None
  if jax.process_index() == 0:
    write_atomically(path, json.dumps(config, indent=2))
    _REPORT.info(f"{path} was missing: restored it from the config saved with checkpoint {step}")
  return config


def record_config(workdir: str, config_json: str, changes: dict, step: int | None, report=None) -> None:
  """Writes config.json (atomically) and appends accepted changes to config_history.jsonl."""
  if changes:
    entry = {"time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
             "resumed_from_step": step, "changes": {k: [None if a is ABSENT else a, b] for k, (a, b) in changes.items()}}
    path = os.path.join(workdir, HISTORY_FILE)
    with reporting_failed_writes(path), open(path, "a") as f:
      f.write(json.dumps(entry) + "\n")
    (report or _REPORT.info)("config changes accepted on resume: " +
           ", ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in changes.items()))
  write_atomically(os.path.join(workdir, CONFIG_FILE), config_json)


def keep_start_records(workdir: str) -> str | None:
  """Copies the START_RECORDS the workdir holds to WORKDIR/starts/<N>/, N the step they
  were written at (environment.json's `started_at_step`; "unknown" for a record older than
  it); `-2`, `-3` are added for later starts at the same step. None where no start recorded
  its environment. The same records kept already (a start that stopped before writing its
  own) are not kept twice."""
  environment_text = _read_text_or_none(os.path.join(workdir, "environment.json"))
  if environment_text is None:
    return None
  try:
    step = json.loads(environment_text).get("started_at_step")
  except ValueError:  # unreadable: kept all the same, as it is
    step = None
  base = os.path.join(workdir, STARTS_DIR, str(step) if isinstance(step, int) else "unknown")
  target, n = base, 2
  while os.path.exists(target):
    if _read_text_or_none(os.path.join(target, "environment.json")) == environment_text:
      return target
    target, n = f"{base}-{n}", n + 1
  staging = target + ".partial"  # a crash mid-copy leaves no half-kept start
  shutil.rmtree(staging, ignore_errors=True)
  with reporting_failed_writes(target):
    os.makedirs(staging)
    for name in START_RECORDS:
      if os.path.isfile(os.path.join(workdir, name)):
        shutil.copyfile(os.path.join(workdir, name), os.path.join(staging, name))
    os.rename(staging, target)
  return target


def _read_text_or_none(path: str) -> str | None:
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return None


def _show(value) -> str:
  if value is ABSENT:
    return "(absent)"
  return repr(value) if isinstance(value, str) else json.dumps(value)


def _read_json_or_none(path: str) -> dict | None:
  """A record's content; None where it is missing or unreadable (a workdir older than it)."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def record_data_changes(workdir: str, changes: dict, step: int | None) -> None:
  """Appends accepted changes of the data's identity to config_history.jsonl."""
  entry = {"time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
           "resumed_from_step": step, "data_changes": {k: [a, b] for k, (a, b) in changes.items()}}
  path = os.path.join(workdir, HISTORY_FILE)
  with reporting_failed_writes(path), open(path, "a") as f:
    f.write(json.dumps(entry) + "\n")


def record_eval_with_changes(workdir: str, step: int, metrics: dict, changes: dict) -> None:
  """Appends an eval made with accepted config changes to WORKDIR/evals_with_changes.jsonl:
  its numbers describe another input than the run's, so they never enter metrics.jsonl."""
  path = os.path.join(workdir, EVALS_WITH_CHANGES_FILE)
  entry = {"step": step, "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
           "changes": {k: [None if a is ABSENT else a, b] for k, (a, b) in changes.items()}, **metrics}
  with reporting_failed_writes(path), open(path, "a") as f:
    f.write(json.dumps(entry) + "\n")
