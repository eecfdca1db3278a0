"""Grain: the absl flags its worker processes read, freeing the batches they leave in
shared memory, a worker's batches handed over in kept shared memory, and a saved position: its
data source, which names where the data lay, and its format, which holds each worker's place."""

import gc
import json
import multiprocessing.util
import os
import re
from multiprocessing import shared_memory

import numpy as np

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


_SHM_DIR = "/dev/shm"  # where Linux's shm_open keeps a segment's name


def _handover_metadata():
  """Grain's description of a batch array in shared memory, which a worker sends in place of
  the array (private in grain 0.2: `SharedMemoryArrayMetadata`); None if it moved."""
  try:
    from grain._src.python.ipc.shared_memory_array import SharedMemoryArrayMetadata
  except ImportError:
    return None
  return SharedMemoryArrayMetadata


def can_hand_over() -> bool:
  """Whether a batch made here goes to Grain's consumer in SharedBatchArrays: this process is a
  worker another started (not the consumer itself, nor a copy of a source in it), on Linux's
  /dev/shm, and Grain's hand-over is as pinned."""
  return (multiprocessing.parent_process() is not None and os.path.isdir(_SHM_DIR)
          and _handover_metadata() is not None)


class SharedBatchArrays:
  """In a Grain worker process: stacks a batch's arrays into shared-memory segments the worker
  keeps, and hands each over under a new name of its own (a hard link), which the consumer
  unlinks when it drops the batch.

  Why: Grain hands a worker's batch over in a new segment every batch (grain 0.2's
  `copy_to_shm` in the worker, `open_from_shm` in the consumer, which unlinks it when the
  array dies). A new tmpfs segment costs its pages' allocation, zeroing and freeing: ~19 ms
  of the worker's and the consumer's CPU for a batch of 128 images at 224 px (19 MB), against
  1.5 ms to write and read kept pages (experiments/RESULTS.md). Given Grain's own description
  of a segment (`SharedMemoryArrayMetadata`) as the element, the worker copies nothing more
  and the consumer maps it as it maps Grain's.

  A kept segment is written again only when its link count is back to 1: the consumer
  unlinks the hand-over name after closing its mapping (Grain's deleter closes, then
  unlinks), so a batch the consumer, or a device array aliasing it, still holds is never
  overwritten. Names still linked when the worker stops are unlinked by Grain's consumer
  (the queued batches) or by whoever holds the batch; the kept names are unlinked when the
  worker process exits (multiprocessing's exit finalizers, which a worker runs).
  """

  KEEP = 16  # segments kept per array shape, at most (each one a batch in flight); beyond, Grain copies

  def __init__(self):
    self._kept: dict[tuple, list] = {}
    self._segments: list = []  # every kept segment: unlinked at exit
    self._handed = 0
    self._metadata = _handover_metadata()
    # Run when the worker process exits (multiprocessing's exit finalizers), or by close().
    self.close = multiprocessing.util.Finalize(self, _unlink_segments, args=(self._segments,),
                                               exitpriority=0)

  def stack(self, values):
    """The values stacked: Grain's metadata of a kept segment holding them, or an array (which
    Grain copies into a new segment of its own) when none is free."""
    first = np.asarray(values[0])
    if first.dtype.kind not in "biuf" or first.nbytes == 0:
      return np.stack(values)
    shape = (len(values),) + first.shape
    segment = self._free_segment(shape, first.dtype)
    if segment is None:
      return np.stack(values)
    shm, array = segment
    np.stack(values, out=array)
    self._handed += 1
    name = f"{shm.name}h{self._handed}"
    os.link(os.path.join(_SHM_DIR, shm.name), os.path.join(_SHM_DIR, name))
    return self._metadata(name=name, shape=shape, dtype=first.dtype)

  def _free_segment(self, shape, dtype):
    kept = self._kept.setdefault((shape, dtype.str), [])
    for shm, array in kept:
      try:
        if os.stat(os.path.join(_SHM_DIR, shm.name)).st_nlink == 1:  # no hand-over name left
          return shm, array
      except FileNotFoundError:  # removed from /dev/shm by someone else: never written again
        continue
    if len(kept) >= self.KEEP:
      return None
    shm = shared_memory.SharedMemory(create=True, size=max(1, int(np.prod(shape)) * dtype.itemsize))
    self._segments.append(shm)
    kept.append((shm, np.ndarray(shape, dtype, buffer=shm.buf)))
    return kept[-1]


def _unlink_segments(segments: list) -> None:
  for shm in segments:
    try:
      shm.unlink()
    except FileNotFoundError:
      pass


# A quoted absolute path in a data source's repr (CocoSource's annotation file, ImageFolderSource's
# root): where the data lies, which a moved copy of the same data changes.
_PATH_IN_REPR = re.compile(r"""(['"])/[^'"]*\1""")


def _without_paths(source_repr: str) -> str:
  return _PATH_IN_REPR.sub("PATH", source_repr)


# Grain 0.2's DataLoader position (the JSON object of its iterator's get_state, format version 2):
# its sampler's indices are dealt round-robin over its W workers (worker i takes i, i + W, ...;
# W = 0: one stream, read as one worker), and the position holds W ("worker_count"), the index each
# worker gave last ("last_seen_indices", keyed "0", "1", ...; i - W before its first) and the worker
# whose element came last ("last_worker_index"; -1 at the start of a round). Read here for a
# loader whose sampler is not sharded (jaxnet's whole-batches loader: one element a batch).
_WORKERS, _LAST_SEEN, _LAST_WORKER, _VERSION = "worker_count", "last_seen_indices", "last_worker_index", "version"
POSITION_VERSION = 2


def worker_count_of(position: dict) -> int:
  """The worker count of the loader that saved `position`."""
  return int(position[_WORKERS])


def next_index(position: dict) -> int:
  """The sampler index of the element that comes next after `position`: the one after the
  last seen by the worker whose turn it is."""
  _check_version(position)
  lanes = max(worker_count_of(position), 1)
  turn = (int(position[_LAST_WORKER]) + 1) % lanes
  return int(position[_LAST_SEEN][str(turn)]) + lanes


def position_at(position: dict, index: int, workers: int) -> dict:
  """`position` (its sampler and data source) moved to sampler index `index` next, in a loader of
  `workers` workers: what that loader's own position reads after it gave elements 0 .. index - 1."""
  _check_version(position)
  lanes = max(workers, 1)
  # Worker i has given the indices i, i + lanes, ... below `index`: ceil((index - i) / lanes) of them.
  last_seen = {str(i): i + ((index - i + lanes - 1) // lanes - 1) * lanes for i in range(lanes)}
  return {**position, _WORKERS: workers, _LAST_SEEN: last_seen, _LAST_WORKER: index % lanes - 1}


def _check_version(position: dict) -> None:
  if position.get(_VERSION) != POSITION_VERSION:
    raise ValueError(f"a Grain data position of version {position.get(_VERSION)!r}: jaxnet reads version "
                     f"{POSITION_VERSION} (grain 0.2)")


class _RestoredPosition:
  """A Grain loader's iterator as Grain's restore handler sees it, taking a saved position
  whose data source differs from this run's only in the paths its repr names. Grain refuses
  any other repr; the run checked before that its data is the data the position was saved
  with (data_identity.json, which holds no path), so a moved dataset (a workdir restored on
  another machine, a regenerated copy) resumes where it was.
  A position of another worker count is moved to this loader's count where `other_workers`
  (its elements are whole batches: the same element n for any count); otherwise it is
  refused, and `refused` holds (saved count, this loader's count)."""

  def __init__(self, iterator, other_workers: bool):
    self.iterator, self.other_workers, self.refused = iterator, other_workers, None

  def set_state(self, state: bytes) -> None:
    saved, now = json.loads(state), json.loads(self.iterator.get_state())
    old, new = saved.get("data_source"), now.get("data_source")
    if isinstance(old, str) and isinstance(new, str) and old != new and _without_paths(old) == _without_paths(new):
      saved = {**saved, "data_source": new}
    if _WORKERS in saved and _WORKERS in now and worker_count_of(saved) != worker_count_of(now):
      if not self.other_workers:
        self.refused = (worker_count_of(saved), worker_count_of(now))
        raise ValueError(f"a data position of {self.refused[0]} workers, in a loader of {self.refused[1]}")
      saved = position_at(saved, next_index(saved), worker_count_of(now))
    self.iterator.set_state(json.dumps(saved).encode())

  def start_prefetch(self) -> None:
    self.iterator.start_prefetch()


def restore_target(iterator, other_workers: bool = False):
  """`iterator` for Grain's restore handler (PyGrainCheckpointRestore): a DataLoader's wrapped
  (_RestoredPosition: a moved data source, and with `other_workers` another worker count); a
  dataset iterator (its state a dict) or DALI's (no data_source in its state) as it is."""
  if isinstance(iterator, grain.DatasetIterator) or not hasattr(iterator, "start_prefetch"):
    return iterator
  state = iterator.get_state()
  try:
    has_source = "data_source" in json.loads(state)
  except (TypeError, ValueError):
    has_source = False
  return _RestoredPosition(iterator, other_workers) if has_source else iterator
