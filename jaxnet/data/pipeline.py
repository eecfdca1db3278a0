"""Grain input pipelines: shard by process, shuffle by seed and epoch, decode and
augment in worker processes, batch per process.

Every batch is a dict of host numpy arrays for this process's share of the global
batch: `image` uint8 NHWC, `label` int32, `mask` bool (False for padding and for
images that failed to decode) and `corrupt` int32 (1 where a JPEG was unreadable).
Normalisation and the cast to the compute dtype happen on the device, in the step.
"""

import math
from typing import Iterator

import grain.python as grain
import numpy as np


class ArrayToExample(grain.MapTransform):
  """Already-decoded images: add the `mask`/`corrupt` fields of the batch layout."""

  def map(self, record):
    return {"image": np.asarray(record["image"], np.uint8), "label": np.int32(record["label"]),
            "mask": np.bool_(True), "corrupt": np.int32(0)}


def _train_transform(source, image_size: int):
  if not source.encoded:
    return ArrayToExample()
  from jaxnet.data.transforms import TrainDecodeCrop
  return TrainDecodeCrop(image_size)


def _eval_transform(source, image_size: int, crop_fraction: float):
  if not source.encoded:
    return ArrayToExample()
  from jaxnet.data.transforms import EvalDecodeCrop
  return EvalDecodeCrop(image_size, crop_fraction)


def per_process_batch_size(global_batch_size: int, process_count: int) -> int:
  if global_batch_size % process_count:
    raise ValueError(f"batch size {global_batch_size} does not divide over {process_count} processes")
  return global_batch_size // process_count


def train_loader(source, *, global_batch_size: int, image_size: int, seed: int, workers: int,
                 process_index: int = 0, process_count: int = 1,
                 worker_buffer_size: int = 2) -> grain.DataLoader:
  """An endless, shuffled, augmented stream of this process's batches.

  Each process reads a disjoint shard of the records (ShardOptions); the order is
  a function of (seed, epoch) only, so a restored iterator state replays exactly.
  """
  shard = grain.ShardOptions(process_index, process_count, drop_remainder=True)
  sampler = grain.IndexSampler(len(source), shard, shuffle=True, num_epochs=None, seed=seed)
  batch = per_process_batch_size(global_batch_size, process_count)
  return grain.DataLoader(
      data_source=source, sampler=sampler,
      operations=[_train_transform(source, image_size), grain.Batch(batch, drop_remainder=True)],
      worker_count=workers, worker_buffer_size=worker_buffer_size)


def eval_batches(source, *, global_batch_size: int, image_size: int, workers: int = 0,
                 process_index: int = 0, process_count: int = 1,
                 crop_fraction: float = 0.875) -> Iterator[dict]:
  """Every example of `source` exactly once, in fixed-size batches.

  The last batch is padded (mask=False), and a process whose shard is shorter
  yields padding batches too, so every process yields the same number of batches
  (each global batch needs a piece from every process).
  """
  batch = per_process_batch_size(global_batch_size, process_count)
  # Contiguous ranges of ceil(n / processes) records, cut here rather than with
  # grain.ShardOptions: with drop_remainder=False and n not divisible by the
  # process count, grain's sampler skips records (359 records on 2 processes
  # gave 179 + 179, never record 179).
  per_process = math.ceil(len(source) / process_count)
  start = min(process_index * per_process, len(source))
  stop = min(start + per_process, len(source))
  loader = []
  if stop > start:
    sampler = grain.IndexSampler(stop - start, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0)
    loader = grain.DataLoader(
        data_source=_Range(source, start, stop), sampler=sampler,
        operations=[_eval_transform(source, image_size, crop_fraction),
                    grain.Batch(batch, drop_remainder=False)],
        worker_count=workers)
  num_batches = math.ceil(per_process / batch)
  example = None
  produced = 0
  for local in loader:
    example = example or {k: v[0] for k, v in local.items()}
    produced += 1
    yield _pad(local, batch)
  if example is None:  # this process's shard is empty: build the layout from one record
    example = next(iter(grain.DataLoader(
        data_source=source, sampler=grain.IndexSampler(1, grain.NoSharding(), num_epochs=1),
        operations=[_eval_transform(source, image_size, crop_fraction)])))
  for _ in range(num_batches - produced):
    yield _pad({k: np.asarray(v)[None][:0] for k, v in example.items()}, batch)


class _Range:
  """Records [start, stop) of a source, as a source."""

  def __init__(self, source, start: int, stop: int):
    self.source, self.start, self.stop = source, start, stop

  def __len__(self):
    return self.stop - self.start

  def __getitem__(self, index):
    return self.source[self.start + index]


def _pad(local: dict, size: int) -> dict:
  n = len(local["label"])
  if n == size:
    return local
  out = {}
  for key, value in local.items():
    pad = np.zeros((size - n,) + value.shape[1:], value.dtype)
    out[key] = np.concatenate([value, pad])
  return out
