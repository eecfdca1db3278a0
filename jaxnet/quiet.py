"""Silence one library's logger for a block, where its warnings would only repeat (or
contradict) what jaxnet itself reports."""

import contextlib
import logging


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
