"""What a training run checks before it writes to its workdir, and the records of its config.

A resumed run must be the same experiment: its config is compared with the workdir's
config.json before anything is written (a deleted config.json is first restored from the
config the newest checkpoint carries). Keys that only change how the run is carried out
(RESUMABLE) may change and are recorded in config_history.jsonl; any other change stops
the run with a list of the changes. (One training run per workdir is the command line's
lock: jaxnet/cli/process.py.)
"""

import datetime
import json
import os

import jax

from jaxnet.core import config as config_lib
from jaxnet.core.checkpoint import newest_saved_config
from jaxnet.core.errors import UserError
from jaxnet.core.metrics import reporting_failed_writes, write_atomically

LOCK_FILE, CONFIG_FILE, HISTORY_FILE = "lock", "config.json", "config_history.jsonl"  # the lock: the CLI's
EVALS_WITH_CHANGES_FILE = "evals_with_changes.jsonl"
ABSENT = object()  # a key one of two configs does not have

# Keys that may change between a run and its resume: cadence, length, input
# throughput, checkpoint handling and the device mesh (a checkpoint restores onto any
# device count and FSDP layout). They change neither what a step computes nor
# which examples it sees (a mesh only changes the order of float sums). data.workers is
# not among them: Grain batches inside each worker, so the worker count decides which
# examples share a batch, and the saved iterator position only fits the same count.
RESUMABLE = (
    "log_every_steps", "eval_every_steps", "checkpoint_every_steps", "eval_every_epochs",
    "checkpoint_every_epochs", "total_steps", "num_epochs",
    "keep_checkpoints", "async_checkpointing", "data.read_threads", "data.prefetch",
    "data.eval_batch_size", "profile_steps", "distributed.*", "mesh.*",
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
  old = config_lib.upgrade_saved(old)
  # Keys a newer jaxnet added, at their defaults (the model's options among them), are no change.
  base = config_lib.base_config()
  base.model.name = config_dict["model"]["name"]
  defaults = json.loads(config_lib.with_model_options(base).to_json_best_effort())
  changes = config_changes(old, config_dict, config_lib.flatten(defaults))
  refused = {k: v for k, v in changes.items()
             if matters(k) and "all" not in accept and k not in accept}
  if refused:
    lines = "\n".join(f"  {k}: {_show(a)} -> {_show(b)}" for k, (a, b) in refused.items())
    raise ConfigChangedError(
        f"this config differs from the one {workdir} was trained with:\n{lines}\n"
        f"Use a new --workdir, or accept the changes for this workdir with "
        f"--accept_config_changes={','.join(refused)}")
  return changes


# What an eval measures: the model (its options, precision, EMA) and the eval data the way
# it sees it. A change to one of these makes another experiment's number.
EVAL_INPUTS = ("model.", "image_size", "precision", "ema_decay", "data.source", "data.name",
               "data.eval_split", "data.eval_crop_fraction", "data.eval_interpolation", "data.mean",
               "data.std", "data.num_classes", "data.synthetic_size", "init.preprocessing")


def changes_what_eval_sees(key: str) -> bool:
  return any(key == k or (k.endswith(".") and key.startswith(k)) for k in EVAL_INPUTS)


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
    print(f"{path} was missing: restored it from the config saved with checkpoint {step}", flush=True)
  return config


def record_config(workdir: str, config_json: str, changes: dict, step: int | None) -> None:
  """Writes config.json (atomically) and appends accepted changes to config_history.jsonl."""
  if changes:
    entry = {"time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
             "resumed_from_step": step, "changes": {k: [None if a is ABSENT else a, b] for k, (a, b) in changes.items()}}
    path = os.path.join(workdir, HISTORY_FILE)
    with reporting_failed_writes(path), open(path, "a") as f:
      f.write(json.dumps(entry) + "\n")
    print("config changes accepted on resume: " +
          ", ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in changes.items()), flush=True)
  write_atomically(os.path.join(workdir, CONFIG_FILE), config_json)


def _show(value) -> str:
  if value is ABSENT:
    return "(absent)"
  return repr(value) if isinstance(value, str) else json.dumps(value)


def record_eval_with_changes(workdir: str, step: int, metrics: dict, changes: dict) -> None:
  """Appends an eval made with accepted config changes to WORKDIR/evals_with_changes.jsonl:
  its numbers describe another input than the run's, so they never enter metrics.jsonl."""
  path = os.path.join(workdir, EVALS_WITH_CHANGES_FILE)
  entry = {"step": step, "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
           "changes": {k: [None if a is ABSENT else a, b] for k, (a, b) in changes.items()}, **metrics}
  with reporting_failed_writes(path), open(path, "a") as f:
    f.write(json.dumps(entry) + "\n")
