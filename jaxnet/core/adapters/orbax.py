"""Orbax (and the tensorstore under it): how its failures read, the few names of its
on-disk layout that jaxnet reads as plain files, and the train state's handler."""

import glob
import logging
import os

from jaxnet.core.errors import os_error_cause

# A failed save leaves its arrays' temporary directory STEP.orbax-checkpoint-tmp-*.
PARTIAL_SAVE_GLOB = "{step}.orbax-checkpoint-tmp*"
# The file in which orbax's JsonCheckpointHandler keeps an item (STEP/ITEM/metadata).
JSON_ITEM_FILE = "metadata"
# What orbax logs for each array it cannot read in a damaged checkpoint.
READ_ERROR = "Encountered error while reading array index"


# Orbax writes a replicated array from all its replicas at once, each replica a slice that a
# jitted op cuts out, compiled once per slice shape and device in each process. For a train
# state's many small arrays that is hundreds of compiles at a process's first save, and nothing
# gained: 5 s of a 14 s digits run on 8 CPU devices, a minute for 80 small arrays. Slices of at
# least this many bytes (arrays of 8 MiB and more on 8 devices) are still written in parallel.
REPLICA_SLICE_MIN_BYTES = 1 << 20


def state_handler():
  """Orbax's StandardCheckpointHandler (same files, same restore), writing only large replicated
  arrays replica-parallel. It takes no type handler registry, so the PyTree handler under it
  (`_impl`, pinned by tests/test_adapters.py) is replaced by one built with ours."""
  import jax
  import orbax.checkpoint as ocp
  types = ocp.type_handlers
  arrays = types.ArrayHandler(min_slice_bytes_for_replica_parallel=REPLICA_SLICE_MIN_BYTES)
  registry = types.create_type_handler_registry(
      *[(t, arrays if issubclass(t, jax.Array) else types.get_type_handler(t)) for t in types.supported_types()])
  handler = ocp.StandardCheckpointHandler()
  handler._impl = ocp.PyTreeCheckpointHandler(type_handler_registry=registry)
  return handler


def partial_saves(directory: str, step: int) -> list[str]:
  """The temporary directories a failed save of `step` left in `directory`."""
  return glob.glob(os.path.join(directory, PARTIAL_SAVE_GLOB.format(step=step)))


def read_json_item(step_dir: str, item: str):
  """The JSON an orbax JsonSave wrote as `item` of the checkpoint in `step_dir` (read as a
  file: no manager, nothing written). OSError or ValueError when it is missing or torn."""
  import json
  with open(os.path.join(step_dir, item, JSON_ITEM_FILE)) as f:
    return json.load(f)


def first_line(error: BaseException) -> str:
  """An orbax/tensorstore error's first line, without the store's repr that follows it."""
  text = str(error).strip()
  line = text.splitlines()[0] if text else type(error).__name__
  return line.split(" See full TensorStore details")[0][:300]


def save_failure_cause(error: BaseException) -> str:
  """Why a save failed, in words: 'no space left on device', 'permission denied', ...
  Tensorstore reports a full disk as RESOURCE_EXHAUSTED text, without an errno."""
  cause = os_error_cause(error)
  if cause:
    return cause
  seen, last = set(), error
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    text = str(error)
    if "RESOURCE_EXHAUSTED" in text or "No space left" in text:
      return "no space left on device"
    if "already exists" in text:
      return "a checkpoint of this step already exists (is another run using this workdir?)"
    last, error = error, error.__cause__ or error.__context__
  return first_line(last)


def is_reported_noise(record: logging.LogRecord) -> bool:
  """Whether a log record only repeats a failed save or read that jaxnet reports itself:
  orbax's (and asyncio's) tracebacks from the threads and futures of that one operation."""
  if record.levelno < logging.ERROR:
    return False
  message = record.getMessage()
  if record.name == "asyncio":  # "Task exception was never retrieved" of a failed write
    return any(s in message for s in ("RESOURCE_EXHAUSTED", "No space left", "Errno", READ_ERROR))
  if "orbax" not in record.pathname:
    return False
  return bool(record.exc_info or "RESOURCE_EXHAUSTED" in message or "Errno" in message)


def is_reported_exception(exc_type, exc) -> bool:
  """Whether an uncaught or unraisable exception only repeats a failure jaxnet reported: after
  a failed save, tensorstore's write callbacks land on orbax's closed event loop; after a
  failed read, the reads of the other arrays end with orbax's read error when collected."""
  return ((exc_type is RuntimeError and str(exc) == "Event loop is closed")
          or str(exc).startswith(READ_ERROR))
