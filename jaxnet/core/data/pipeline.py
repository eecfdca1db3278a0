"""Grain input pipelines: shard by process, shuffle by seed and epoch, decode and
augment in worker processes, batch per process; and the training loop's batches on the
devices (`DeviceBatches`).

Every batch is a dict of host numpy arrays for this process's share of the global
batch: `image` uint8 NHWC, `mask` bool (False for padding and for images that failed
to decode), `corrupt` int32 (1 where a JPEG was unreadable) and the fields the source's
records carry besides the image (the image sources' `label`, int32: transforms.carried);
a task may make other examples with a transform of its own (`transform=`: a detector's,
jaxnet/core/tasks/detection/coco.py, has boxes).
Normalisation and the cast to the compute dtype happen on the device, in the step.
"""

import collections
import contextlib
import math
import os
import sys
import time
from typing import Callable, Iterator

import grain.python as grain
import numpy as np

from jaxnet.core import sharding
from jaxnet.core.adapters import grain as grain_adapter
from jaxnet.core.errors import InvalidValueError


class ArrayToExample(grain.MapTransform):
  """Already-decoded images: add the `mask`/`corrupt` fields of the batch layout (the record's
  other fields carried, as the decoding transforms carry them: transforms.carried)."""

  def map(self, record):
    from jaxnet.core.data.transforms import carried
    return {"image": np.asarray(record["image"], np.uint8), **carried(record),
            "mask": np.bool_(True), "corrupt": np.int32(0)}


def _image_transform(source, image_size: int, train: bool, crop_fraction: float = 0.875,
                     interpolation: str = "bilinear", warn_corrupt: bool = True):
  """The pipeline's own examples of an image source's records: decoded and cropped (or taken as
  they are, when already decoded), the records' other fields carried."""
  from jaxnet.core.data import transforms
  if not source.encoded:
    return ArrayToExample()
  if train:
    return transforms.TrainDecodeCrop(image_size)
  return transforms.EvalDecodeCrop(image_size, crop_fraction, interpolation, warn=warn_corrupt)


def check_some_example_reads(source, split: str) -> None:
  """Raises, naming the first file and why, when not one record of an encoded `source` decodes.

  Unreadable images are masked and counted, so a set with none readable would train every
  step on nothing (loss 0.0000) and exit 0. Records are tried in order up to the first that
  decodes: one decode for a healthy set, each time a loader is made (before step 1).
  """
  if not getattr(source, "encoded", False):
    return
  from jaxnet.core.data import decode
  first = None
  for index in range(len(source)):
    record = source[index]
    try:
      decode.decode_record(record)
      return
    except decode.CorruptImageError as err:
      first = first or f"{record.get('path') or f'record {index}'}: {err}"
  keys = "data.dir" + (", data.eval_split" if split == "eval" else "")
  raise InvalidValueError(f"not one of the {len(source)} {split} examples of {source!r} can be read "
                          f"(the first, {first}); the run stops before its first step: check {keys} "
                          f"and the image files")


AUTO_WORKERS = -1  # data.workers: one per core this process may use, less one for the loop


def cores_available() -> int:
  """The cores this process may run on (its affinity mask: a container's or taskset's share)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # no affinity call (macOS)
    return os.cpu_count() or 1


def worker_count(configured: int) -> int:
  """data.workers as the loader runs it: AUTO_WORKERS (-1) leaves one core to the training
  loop and gives the others a worker each (at least one); >= 0 is taken as it is. With
  several training processes on one host, give each its share explicitly."""
  if configured >= 0:
    return configured
  return max(1, cores_available() - 1)


class InputWatch:
  """Whether the step waits on its input, from the time the loop spends getting batches
  (`waiting`) against the whole log window, and its one-line verdicts.

  The loop dispatches steps asynchronously and syncs with the device at log steps, so a
  device slower than the input shows as a backlog at the log step's sync (`synced`), even
  when the host, running ahead, also waited for batches; a window that waited on data and
  found the device with at most ~2 steps' work left at its sync had its devices idle for
  lack of input.
  """

  WAIT_WARN = 0.10   # waiting on data this fraction of a window (and the device idle): warn
  MIN_STEPS = 10     # fewer steps in a window say too little to warn on

  def __init__(self, batch_size: int, workers: int, warn: bool = True):
    """`warn=False`: the line but no warnings (a CPU backend, where the step and the input
    share the cores, so the step's wait on data is no idle accelerator)."""
    self.batch_size, self.workers, self.warn = batch_size, workers, warn
    self.wait = self.sync = 0.0
    self.start, self.windows, self.bound = time.perf_counter(), 0, False

  def restart(self) -> None:
    self.wait = self.sync = 0.0
    self.start = time.perf_counter()

  @contextlib.contextmanager
  def _timed(self, total: str):
    """Adds the time spent in the `with` block to the attribute `total`."""
    start = time.perf_counter()
    try:
      yield
    finally:
      setattr(self, total, getattr(self, total) + time.perf_counter() - start)

  def waiting(self):
    return self._timed("wait")

  def synced(self):
    return self._timed("sync")

  def window(self, steps: int) -> tuple[dict, list[str]]:
    """The window's metrics (`train/data_wait_fraction`) and the lines to show: on the second
    window (the first holds the step's compile), the input's rate against the step's; whenever
    the input becomes the bottleneck after that, a warning naming the levers. Starts the next
    window."""
    now = time.perf_counter()
    total = max(now - self.start, 1e-9)
    images = steps * self.batch_size
    wait_fraction = min(self.wait / total, 1.0)
    # The device idled if, at the log step, it had no more than ~2 steps' work left: a device
    # slower than the input has a backlog there (the host runs ahead), however long the host
    # waited for batches on the way.
    bound = wait_fraction > self.WAIT_WARN and self.sync < 2 * total / max(steps, 1)
    step_rate = images / max(total - self.wait, 1e-9)  # had no batch ever been waited for
    lines = []
    if self.windows == 0:  # a single-process run compiles its step in the first window: no verdict
      pass
    elif self.windows == 1:
      verdict = (f"the input is the bottleneck" if bound else
                 f"the input keeps up (it delivers at least the step's rate)")
      lines.append(f"input: {images / total:,.0f} img/s delivered over {steps} steps, the step's "
                   f"{step_rate:,.0f} img/s without waiting; waited on data {wait_fraction:.0%} of the "
                   f"time: {verdict} ({self.workers} data workers, {cores_available()} cores)")
    if bound and not self.bound and self.windows > 1 and self.warn and steps >= self.MIN_STEPS:
      lines.append(f"warning: the step waited on data {wait_fraction:.0%} of the last {steps} steps "
                   f"(the input delivered {images / total:,.0f} img/s, the step could take "
                   f"{step_rate:,.0f}): raise data.workers (now {self.workers}, {cores_available()} "
                   f"cores), read prepared shards (jaxnet prepare, data.source=prepared) or lower "
                   f"data.randaug_num_ops")
    self.bound, self.windows = bound, self.windows + 1
    self.restart()
    return {"train/data_wait_fraction": wait_fraction}, lines


def per_process_batch_size(global_batch_size: int, process_count: int) -> int:
  if global_batch_size % process_count:
    raise InvalidValueError(f"batch size {global_batch_size} does not divide over {process_count} processes")
  return global_batch_size // process_count


def train_loader(source, *, global_batch_size: int, image_size: int, seed: int, workers: int,
                 read_threads: int = 0, process_index: int = 0, process_count: int = 1,
                 worker_buffer_size: int = 2, randaug: tuple[int, int] = (0, 10),
                 transform=None, whole_batches: bool = True) -> grain.DataLoader:
  """An endless, shuffled, augmented stream of this process's batches.

  Each process reads a disjoint shard of the records (ShardOptions); the order is
  a function of (seed, epoch) only, so a restored iterator state replays exactly.
  Random augmentations (crop, flip, RandAugment with `randaug` = (ops, magnitude),
  off when ops is 0) draw from Grain's per-record generator, seeded by the seed
  and the record's position in the stream: they replay exactly too. `transform`: a
  task's own record -> example transform (default: decode and random-resized-crop an image).
  Batch n holds the records at positions n * batch ... (n + 1) * batch - 1 of the stream,
  whatever the number of workers (each worker makes whole batches: `TrainBatches`).
  `whole_batches=False`: Grain's elements are records, batched by grain.Batch (jaxnet before
  2026-11-29): the loader a data position saved by such a run resumes in (the two save
  positions of different kinds; with no workers their batches are the same).
  """
  check_some_example_reads(source, "train")
  shard = grain.ShardOptions(process_index, process_count, drop_remainder=True)
  sampler = grain.IndexSampler(len(source), shard, shuffle=True, num_epochs=None, seed=seed)
  batch = per_process_batch_size(global_batch_size, process_count)
  if workers:
    grain_adapter.ensure_absl_flags_parsed()
  operations = [transform or _image_transform(source, image_size, True)]
  if randaug[0]:
    from jaxnet.core.data.randaugment import RandAugment
    operations.append(RandAugment(*randaug))
  if whole_batches:
    source = TrainBatches(source, sampler, shard, operations, batch, read_threads)
    sampler = grain.IndexSampler(len(source), grain.NoSharding(), shuffle=False, num_epochs=1)
    # The records are read in TrainBatches; Grain reads a batch at a time, inline.
    operations, read_options = [], grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
  else:
    operations = operations + [grain.Batch(batch, drop_remainder=True)]
    # Reading a local JPEG takes ~30 us against ~1.5 ms to decode it, and read
    # threads cost CPU in every worker (2 workers: 863 img/s with none, 748 with
    # 16), so records are read inline unless storage is slow (read_threads).
    # Grain checks every buffered read on each record, so its default read-ahead
    # of 500 costs ~15% CPU; 32 is plenty.
    read_options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=32)
  return grain.DataLoader(data_source=source, sampler=sampler, operations=operations,
                          worker_count=workers, worker_buffer_size=worker_buffer_size,
                          read_options=read_options)


class TrainBatches:
  """The train stream as a Grain data source whose element n is this process's batch n: the
  records `sampler` (a record-level, shuffling IndexSampler sharded by `shard`) gives for this
  process's positions n * batch_size ... (n + 1) * batch_size - 1, each through `operations`
  with its position's generator, stacked.

  Why batches, not records, as Grain's elements: Grain's DataLoader costs ~40 us of its own
  per element (its per-record iterators, statistics and batching), a third of a prepared
  image's whole transform; as a batch, it is paid once per 100+ images. The records, their
  order and their generators are those a record-level DataLoader over `sampler` gives
  (with no workers, the same batches), so augmentations replay exactly from a position.

  `read_threads` > 0 reads a batch's records in that many threads (slow storage), in order.
  """

  ENDLESS = 2**40  # batches: Grain's sampler needs a length; no run comes near it

  def __init__(self, source, sampler, shard: grain.ShardOptions, operations, batch_size: int,
               read_threads: int = 0):
    for op in operations:
      if not isinstance(op, (grain.MapTransform, grain.RandomMapTransform)):
        raise TypeError(f"a train transform must be a grain MapTransform or RandomMapTransform, "
                        f"got {type(op).__name__}")
    self.source, self.sampler, self.operations = source, sampler, list(operations)
    self.batch_size, self.read_threads = batch_size, read_threads
    self._shard_index, self._shard_count = shard.shard_index, shard.shard_count  # the sampler's
    self._pool, self._arrays = None, BatchArrays()

  def __len__(self) -> int:
    return self.ENDLESS

  def __getitem__(self, batch: int) -> dict:
    positions = range(batch * self.batch_size, (batch + 1) * self.batch_size)
    # A process's position p is the sampler's index p * shard_count + shard_index (as Grain's
    # DataLoader indexes a sharded sampler).
    records = [self.sampler[p * self._shard_count + self._shard_index] for p in positions]
    examples = [self._example(record, data) for record, data in
                zip(records, self._read([r.record_key for r in records]))]
    if self._arrays is None:  # in a worker process (unpickled): hand batches over in kept shared memory
      self._arrays = grain_adapter.SharedBatchArrays() if grain_adapter.can_hand_over() else BatchArrays()
    return {key: self._arrays.stack([e[key] for e in examples]) for key in examples[0]}

  def _example(self, record, data):
    for op in self.operations:
      data = op.random_map(data, record.rng) if isinstance(op, grain.RandomMapTransform) else op.map(data)
    return data

  def _read(self, keys):
    """The records of `keys`, lazily in order: inline, or in read_threads threads."""
    if not self.read_threads:
      return (self.source[k] for k in keys)
    if self._pool is None:  # made where it is used: a worker process gets its own
      from concurrent import futures
      self._pool = futures.ThreadPoolExecutor(self.read_threads, thread_name_prefix="jaxnet-read")
    return self._pool.map(self.source.__getitem__, keys)

  def __getstate__(self):  # to a worker process: without the threads and arrays
    return {**self.__dict__, "_pool": None, "_arrays": None}

  def __repr__(self) -> str:
    # What a saved position is checked against (Grain compares reprs): the records, their
    # order and the batch size, not the transforms (progressive resizing sets a position
    # taken at one image size on the loader of the next).
    return f"TrainBatches({self.source!r}, {self.sampler!r}, batch_size={self.batch_size})"


class BatchArrays:
  """Stacks examples' fields into batch arrays, reusing an earlier batch's array once nothing
  else refers to it.

  Why: a new batch of 128 images of 224 px (19 MB) comes from the kernel untouched, and its
  first write faults in every page: ~36 page faults an image, ~40% of the loader's CPU time on
  prepared shards (experiments/RESULTS.md; at 160 px malloc reused the freed memory and there
  were none). An array is reused only when this object holds its only reference (CPython's
  reference count): the batch it went out in is gone and no device array aliases it.
  """

  KEEP = 8  # arrays kept for reuse, at most

  def __init__(self):
    self._kept = []

  def stack(self, values) -> np.ndarray:
    first = np.asarray(values[0])
    if first.dtype.kind not in "biuf":  # strings, objects: as np.stack gives them
      return np.stack(values)
    shape = (len(values),) + first.shape
    for i in range(len(self._kept)):
      # 2 references: the list's and getrefcount's argument.
      if sys.getrefcount(self._kept[i]) == 2 and self._kept[i].shape == shape and self._kept[i].dtype == first.dtype:
        return np.stack(values, out=self._kept[i])
    out = np.stack(values)
    if len(self._kept) < self.KEEP:
      self._kept.append(out)
    return out


def eval_batches(source, *, global_batch_size: int, image_size: int, workers: int = 0,
                 process_index: int = 0, process_count: int = 1,
                 crop_fraction: float = 0.875, interpolation: str = "bilinear",
                 warn_corrupt: bool = True, transform=None) -> Iterator[dict]:
  """Every example of `source` exactly once, in fixed-size batches. `transform`: a task's
  own record -> example transform (default: decode, resize and center-crop an image).

  The last batch is padded (mask=False), and a process whose shard is shorter
  yields padding batches too, so every process yields the same number of batches
  (each global batch needs a piece from every process).
  """
  batch = per_process_batch_size(global_batch_size, process_count)
  # Grain's own sharding drops the remainder (len // process_count each); eval
  # must see every example, so each process reads a contiguous slice instead.
  start, end = shard_bounds(len(source), process_index, process_count)
  shard = _Slice(source, start, end)
  if workers:
    grain_adapter.ensure_absl_flags_parsed()
  transform = transform or _image_transform(source, image_size, False, crop_fraction, interpolation, warn_corrupt)
  loader = []  # a process with no records (more processes than records) yields only padding
  if len(shard):
    loader = grain.DataLoader(
        data_source=shard,
        sampler=grain.IndexSampler(len(shard), grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
        operations=[transform, grain.Batch(batch, drop_remainder=False)],
        worker_count=workers)
  num_batches = math.ceil(shard_bounds(len(source), 0, process_count)[1] / batch)
  example = None
  produced = 0
  batches = iter(loader)
  try:
    for local in batches:
      example = example or {k: v[0] for k, v in local.items()}
      produced += 1
      yield _pad(local, batch)
  finally:  # also when the caller stops early (an error, Ctrl-C): free the workers' batches
    grain_adapter.close_iterator(batches, workers)
  if example is None:  # this process's shard is empty: take the layout from one record
    example = transform.map(source[0])
  for _ in range(num_batches - produced):
    yield _pad({k: np.asarray(v)[None][:0] for k, v in example.items()}, batch)


def shard_bounds(n: int, index: int, count: int) -> tuple[int, int]:
  """Contiguous split of n examples over count processes; the first n % count get one more."""
  base, extra = divmod(n, count)
  start = index * base + min(index, extra)
  return start, start + base + (index < extra)


class _Slice:
  """Records [start, end) of a source, as a source."""

  def __init__(self, source, start: int, end: int):
    self.source, self.start, self.end = source, start, end

  def __len__(self):
    return self.end - self.start

  def __getitem__(self, index):
    return self.source[self.start + index]

  def __repr__(self):
    return f"{self.source!r}[{self.start}:{self.end}]"


def _pad(local: dict, size: int) -> dict:
  n = len(local["mask"])
  if n == size:
    return local
  out = {}
  for key, value in local.items():
    pad = np.zeros((size - n,) + value.shape[1:], value.dtype)
    out[key] = np.concatenate([value, pad])
  return out


class DeviceBatches:
  """Train batches as global device arrays, `depth` ahead of the step that uses them
  (host-to-device transfers are asynchronous, so the next batches travel while a step runs).

  `position` is the Grain iterator state right after the last batch taken: what a
  checkpoint saves, because the model has consumed that batch and not the ones read
  ahead. A new image size (progressive resizing) rebuilds the loader at `position`
  and drops the batches read ahead at the old size. `close()` (or leaving the `with`
  block) stops the loader's workers and frees the batches they left in shared memory.
  """

  def __init__(self, make_loader: Callable, sharding, image_size: int, depth: int, workers: int):
    self._make_loader, self._sharding = make_loader, sharding
    self._depth, self._workers = max(depth, 1), workers
    self.image_size = image_size
    self.iterator = iter(make_loader(image_size))  # a checkpoint restore sets its state
    self._ahead = collections.deque()
    self.position = self.iterator.get_state()

  def restored(self) -> None:
    """Call after a checkpoint restore has set `iterator`'s state."""
    self._ahead.clear()
    self.position = self.iterator.get_state()

  def peek(self):
    """The next batch, without taking it (to compile the step with its shapes)."""
    self._fill()
    return self._ahead[0][0]

  def next(self, image_size: int):
    """The next batch at `image_size`; `position` moves past it."""
    if image_size != self.image_size:
      self.close()
      self.image_size = image_size
      self.iterator = iter(self._make_loader(image_size))
      self.iterator.set_state(self.position)
    self._fill()
    batch, self.position = self._ahead.popleft()
    return batch

  def _fill(self) -> None:
    while len(self._ahead) < self._depth:
      local = next(self.iterator)
      self._ahead.append((sharding.to_global(local, self._sharding), self.iterator.get_state()))

  def close(self) -> None:
    # Batches from data.workers sit in /dev/shm while anything refers to them.
    self._ahead.clear()
    grain_adapter.close_iterator(self.iterator, self._workers)

  def __enter__(self):
    return self

  def __exit__(self, *exc) -> None:
    self.close()
