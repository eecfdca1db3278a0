"""The Grain pipeline: exact resume, disjoint process shards, eval covers every example once."""

import json
import threading

import numpy as np
import pytest

from jaxnet.core.data import pipeline, sources


@pytest.fixture(scope="module")
def digits():
  return sources.digits_source("train", 8)


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


@pytest.mark.parametrize("workers", [0, 2])
def test_restored_iterator_continues_the_exact_sequence(digits, workers):
  make = lambda: iter(pipeline.train_loader(digits, global_batch_size=32, image_size=8, seed=3,
                                            workers=workers))
  it = make()
  _take(it, 50)  # crosses an epoch boundary (44 batches per epoch)
  state = it.get_state()
  expected = _take(it, 6)
  restored = make()
  restored.set_state(state)
  for want, got in zip(expected, _take(restored, 6)):
    np.testing.assert_array_equal(want["label"], got["label"])
    np.testing.assert_array_equal(want["image"], got["image"])
  if workers:  # each worker makes whole batches: the batches are the same with none
    alone = _take(iter(pipeline.train_loader(digits, global_batch_size=32, image_size=8, seed=3, workers=0)), 56)
    for want, got in zip(alone[50:], expected):
      np.testing.assert_array_equal(want["image"], got["image"])


def test_batches_are_a_record_level_loaders(digits):
  """TrainBatches (whole batches as Grain's elements) gives the batches of Grain's record-level
  DataLoader over the same sharded sampler: the same records, order and augmentations."""
  import grain.python as grain
  from jaxnet.core.data.randaugment import RandAugment
  shard = grain.ShardOptions(1, 2, drop_remainder=True)
  records = grain.DataLoader(
      data_source=digits, sampler=grain.IndexSampler(len(digits), shard, shuffle=True, seed=4),
      operations=[pipeline.ArrayToExample(), RandAugment(2, 9), grain.Batch(16, drop_remainder=True)],
      worker_count=0)
  batches = pipeline.train_loader(digits, global_batch_size=32, image_size=8, seed=4, workers=0,
                                  process_index=1, process_count=2, randaug=(2, 9))
  for want, got in zip(_take(iter(records), 47), _take(iter(batches), 47)):  # past an epoch (44)
    assert want.keys() == got.keys()
    for key in want:
      assert want[key].dtype == got[key].dtype
      np.testing.assert_array_equal(want[key], got[key])


class _ReaderSpy:
  """A source that notes the name of every thread that reads a record from it."""
  encoded = False

  def __init__(self, source):
    self.source, self.threads = source, set()

  def __len__(self):
    return len(self.source)

  def __getitem__(self, index):
    self.threads.add(threading.current_thread().name)
    return self.source[index]

  def __repr__(self):
    return repr(self.source)


def test_read_threads_read_ahead_without_changing_the_batches(digits):
  """data.read_threads reads records in background threads; the example sequence stays a function of the seed."""
  def batches(read_threads):
    spy = _ReaderSpy(digits)
    loader = pipeline.train_loader(spy, global_batch_size=32, image_size=8, seed=3, workers=0,
                                   read_threads=read_threads)
    return _take(iter(loader), 5), spy.threads
  (inline, inline_readers), (threaded, threaded_readers) = batches(0), batches(4)
  assert inline_readers == {threading.current_thread().name}
  assert len(threaded_readers) > 1 and threading.current_thread().name not in threaded_readers
  for a, b in zip(inline, threaded):
    np.testing.assert_array_equal(a["label"], b["label"])
    np.testing.assert_array_equal(a["image"], b["image"])


def _rows(images):
  return [x.tobytes() for x in images.reshape(len(images), -1)]


def test_each_epoch_is_a_new_permutation_of_the_data(digits):
  n = len(digits)
  it = iter(pipeline.train_loader(digits, global_batch_size=2, image_size=8, seed=0, workers=0))
  images = np.concatenate([b["image"] for b in _take(it, n)])  # exactly two epochs
  epoch1, epoch2 = _rows(images[:n]), _rows(images[n:])
  assert sorted(epoch1) == sorted(_rows(digits.images)) == sorted(epoch2)
  assert epoch1 != epoch2                                     # reshuffled by epoch


def test_process_shards_are_disjoint_and_cover_the_data(digits):
  def one_epoch(process_index):
    loader = pipeline.train_loader(digits, global_batch_size=2, image_size=8, seed=1, workers=0,
                                   process_index=process_index, process_count=2)
    return _rows(np.concatenate([b["image"] for b in _take(iter(loader), len(digits) // 2)]))
  a, b = one_epoch(0), one_epoch(1)
  assert not set(a) & set(b)
  assert sorted(a + b) == sorted(_rows(digits.images))        # 1438 is even: nothing dropped


@pytest.mark.parametrize("process_count", [1, 2, 3])
def test_eval_covers_every_example_once(process_count):
  test = sources.digits_source("test", 8)   # 359 examples: the last batch is partial
  seen = []
  num_batches = set()
  for p in range(process_count):
    batches = list(pipeline.eval_batches(test, global_batch_size=48, image_size=8,
                                         process_index=p, process_count=process_count))
    num_batches.add(len(batches))
    for b in batches:
      assert b["image"].shape == (48 // process_count, 8, 8, 1)
      seen.extend(map(bytes, b["image"][b["mask"]].reshape(-1, 64)))
  assert len(num_batches) == 1                    # every process yields the same number of batches
  assert sorted(seen) == sorted(map(bytes, test.images.reshape(-1, 64)))


def test_batch_arrays_reuse_only_an_array_nothing_else_holds():
  """BatchArrays writes a new batch into an earlier one's array only once that batch is gone:
  a batch still held (by the loop, or a device array aliasing it) is never overwritten."""
  arrays = pipeline.BatchArrays()
  images = lambda v: [np.full((4, 4, 3), v, np.uint8)] * 2
  first = arrays.stack(images(1))
  second = arrays.stack(images(2))
  assert (first == 1).all() and (second == 2).all()     # the first, still held, kept its values
  address = first.__array_interface__["data"][0]
  del first
  third = arrays.stack(images(3))
  assert third.__array_interface__["data"][0] == address and (third == 3).all() and (second == 2).all()
  view = third[1:]                                      # a view holds the array too
  del third
  assert (arrays.stack(images(4)) == 4).all() and (view == 3).all()
  assert arrays.stack(["a", "bc"]).tolist() == ["a", "bc"]  # strings: np.stack's own arrays


# --- a data position and the worker count (jaxnet/core/adapters/grain.py) ------------------

def _loader(digits, workers, whole_batches=True):
  return iter(pipeline.train_loader(digits, global_batch_size=32, image_size=8, seed=5, workers=workers,
                                    whole_batches=whole_batches))


def _save_position(workdir, iterator, elements):
  from jaxnet.core import checkpoint as ckpt
  checkpoints = ckpt.Checkpoints(str(workdir), async_save=False)
  checkpoints.save(3, {"w": np.zeros(1, np.float32)}, iterator.get_state(), {}, data_elements=elements)
  checkpoints.wait()
  return checkpoints


@pytest.mark.parametrize("saved_workers, workers", [(1, 2), (2, 0)])
def test_a_whole_batches_position_resumes_at_the_next_batch_with_another_worker_count(
    digits, tmp_path, saved_workers, workers):
  """data.workers=-1 is one worker per core: a run resumed where the core count differs
  restores a position saved by another worker count. It continues at the next batch: the
  batches an uninterrupted run gives (Grain alone refused the position)."""
  from jaxnet.core.adapters import grain as grain_adapter
  straight = _take(_loader(digits, 0), 6)
  run = _loader(digits, saved_workers)
  _take(run, 3)  # an odd count: the next batch is another worker's than the first
  checkpoints = _save_position(tmp_path, run, "batches")
  resumed = _loader(digits, workers)
  try:
    checkpoints._restore_position(3, resumed, saved_processes=None)
  finally:
    checkpoints.close()
  assert grain_adapter.worker_count_of(json.loads(resumed.get_state())) == workers
  for want, got in zip(straight[3:], _take(resumed, 3)):
    np.testing.assert_array_equal(want["label"], got["label"])
    np.testing.assert_array_equal(want["image"], got["image"])
  for iterator in (run, resumed):
    grain_adapter.close_iterator(iterator, workers=1)


def test_a_record_level_position_of_another_worker_count_is_one_line_naming_the_count(digits, tmp_path):
  """A record-level position (jaxnet before 2026-11-29) holds each worker's place in a record
  stream: it fits only its own worker count, and says which."""
  from jaxnet.core import checkpoint as ckpt
  from jaxnet.core.adapters import grain as grain_adapter
  run = _loader(digits, 0, whole_batches=False)
  _take(run, 2)
  checkpoints = _save_position(tmp_path, run, "records")
  resumed = _loader(digits, 1, whole_batches=False)
  try:
    with pytest.raises(ckpt.CheckpointMismatchError) as e:
      checkpoints._restore_position(3, resumed, saved_processes=None)
  finally:
    checkpoints.close()
    grain_adapter.close_iterator(resumed, workers=1)
  message = str(e.value)
  assert "\n" not in message and "Traceback" not in message
  assert message.endswith("is record-level (jaxnet before 2026-11-29) and holds the places of 0 data workers; "
                          "this run has 1. Resume with --config.data.workers=0"), message

