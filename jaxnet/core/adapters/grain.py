"""Grain: the absl flags its worker processes read, freeing the batches they leave in
shared memory, and a saved position's data source, which names where the data lay."""

import gc
import json
import re

import grain.python as grain


def ensure_absl_flags_parsed() -> None:
  """Grain 0.2 reads absl flags (grain_*) when it starts worker processes, and fails unless
  flags were parsed. Outside an absl app (notebooks, tests, the Python API) nothing parsed them, so
  they are marked parsed, at their defaults: the one process-wide effect of jaxnet's core,
  made here only because Grain needs it (an absl app's own parsing is left alone)."""
  from absl import flags
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def close_iterator(iterator, workers: int) -> None:
  """Stops a DataLoader iterator's worker processes and frees its batches in shared memory.

  Workers hand batches over in /dev/shm; a batch's segment is freed when the main process
  drops its last reference to it, and the batches still queued when the iterator is
  closed. Grain closes an iterator only when it is collected, and both the iterator and
  batches already taken end up in reference cycles (Grain keeps a worker's last batch in
  the traceback of its StopIteration, for one), which only the cycle collector frees; a
  process at exit does not wait for it, so every run with workers left batches behind. So:
  close, collect once, and wait for the unlinks that frees. Idempotent.
  """
  # grain 0.2's DataLoaderIterator has no close() of its own: close the dataset iterator
  # it wraps (private `_iterator`, whose close() is public and idempotent).
  close = getattr(iterator, "close", None) or getattr(getattr(iterator, "_iterator", None), "close", None)
  if close is not None:
    close()
  if workers:
    gc.collect()
    wait_for_unlinks()


def wait_for_unlinks() -> None:
  """Returns once Grain has unlinked the shared-memory segments of the batches freed so far.

  Grain unlinks a freed batch's segments on its one deleter thread (the private
  `SharedMemoryArray._del_thread_pool`), in order; a no-op queued behind them returns when
  they are done. Without this wait a process that ends right after a run leaves the last
  few to Python's resource_tracker (and its warning), and /dev/shm still holds them.
  """
  pool = getattr(grain.SharedMemoryArray, "_del_thread_pool", None)
  if pool is not None:
    pool.apply(int)


# A quoted absolute path in a data source's repr (CocoSource's annotation file, ImageFolderSource's
# root): where the data lies, which a moved copy of the same data changes.
_PATH_IN_REPR = re.compile(r"""(['"])/[^'"]*\1""")


def _without_paths(source_repr: str) -> str:
  return _PATH_IN_REPR.sub("PATH", source_repr)


class _MovedDataPosition:
  """A Grain loader's iterator as Grain's restore handler sees it, taking a saved position
  whose data source differs from this run's only in the paths its repr names. Grain refuses
  any other repr; the run checked before that its data is the data the position was saved
  with (data_identity.json, which holds no path), so a moved dataset (a workdir restored on
  another machine, a regenerated copy) resumes where it was."""

  def __init__(self, iterator):
    self.iterator = iterator

  def set_state(self, state: bytes) -> None:
    saved, now = json.loads(state), json.loads(self.iterator.get_state())
    old, new = saved.get("data_source"), now.get("data_source")
    if isinstance(old, str) and isinstance(new, str) and old != new and _without_paths(old) == _without_paths(new):
      state = json.dumps({**saved, "data_source": new}).encode()
    self.iterator.set_state(state)

  def start_prefetch(self) -> None:
    self.iterator.start_prefetch()


def position_of_moved_data(iterator):
  """`iterator` for Grain's restore handler (PyGrainCheckpointRestore): a DataLoader's wrapped (_MovedDataPosition); a
  dataset iterator (its state a dict) or DALI's (no data_source in its state) as it is."""
  if isinstance(iterator, grain.DatasetIterator) or not hasattr(iterator, "start_prefetch"):
    return iterator
  state = iterator.get_state()
  try:
    has_source = "data_source" in json.loads(state)
  except (TypeError, ValueError):
    has_source = False
  return _MovedDataPosition(iterator) if has_source else iterator
