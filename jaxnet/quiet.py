"""Silence libraries where their output would only repeat (or contradict) what jaxnet
itself reports: one logger for a block, and, for the command-line tools only, the
tracebacks of failures already reported in one line."""

import contextlib
import logging
import os
import sys
import warnings


@contextlib.contextmanager
def quiet_logger(name: str, level: int = logging.ERROR):
  """Within the block, logger `name` passes only records of `level` and above."""
  logger = logging.getLogger(name)
  previous = logger.level
  logger.setLevel(level)
  try:
    yield
  finally:
    logger.setLevel(previous)


_READ_ERROR = "Encountered error while reading array index"  # orbax, for each unreadable array


class _DropSaveFailureNoise(logging.Filter):
  """Drops orbax's (and asyncio's) own tracebacks of a failed background save or read.

  Checkpoints reports each failed save once, as CheckpointSaveError, and each
  unreadable checkpoint once, as DamagedCheckpointError; orbax and asyncio would
  log the same failure from several threads or futures, 100+ lines each time.
  """

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.ERROR:
      return True
    message = record.getMessage()
    if record.name == "asyncio":  # "Task exception was never retrieved" of a failed write
      return not any(s in message for s in ("RESOURCE_EXHAUSTED", "No space left", "Errno", _READ_ERROR))
    if "orbax" not in record.pathname:
      return True
    return not (record.exc_info or "RESOURCE_EXHAUSTED" in message or "Errno" in message)


def _is_reported_noise(exc_type, exc) -> bool:
  """Tracebacks Python would print for failures Checkpoints already reported in one line.

  After a failed save, tensorstore's write callbacks land on orbax's closed event
  loop. After a failed read (a damaged checkpoint), the reads of the other arrays
  are coroutines that end with orbax's read error when they are collected, often
  at exit: thousands of lines, each saying nothing new.
  """
  return ((exc_type is RuntimeError and str(exc) == "Event loop is closed")
          or str(exc).startswith(_READ_ERROR))


def quiet_reported_failures() -> None:
  """Installs the filters above once per process (not with JAXNET_DEBUG=1). For the
  command-line tools only (errors.one_line_errors): a library must leave the process's
  hooks, loggers and warnings as it found them."""
  if os.environ.get("JAXNET_DEBUG") or getattr(quiet_reported_failures, "done", False):
    return
  quiet_reported_failures.done = True
  for name in ("absl", "asyncio"):
    logging.getLogger(name).addFilter(_DropSaveFailureNoise())
  warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
  previous_hook, previous_unraisable = sys.excepthook, sys.unraisablehook

  def excepthook(exc_type, exc, tb):
    if not _is_reported_noise(exc_type, exc):
      previous_hook(exc_type, exc, tb)

  def unraisablehook(unraisable):
    if not _is_reported_noise(unraisable.exc_type, unraisable.exc_value):
      previous_unraisable(unraisable)
  sys.excepthook, sys.unraisablehook = excepthook, unraisablehook
