"""The training loop's input: global batches on the devices, read ahead, each with the
iterator position after it, at the image size the step asks for."""

from __future__ import annotations

import collections
from typing import Callable

from jaxnet import parallel
from jaxnet.data import pipeline


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
      self._ahead.append((parallel.to_global(local, self._sharding), self.iterator.get_state()))

  def close(self) -> None:
    # Batches from data.workers sit in /dev/shm while anything refers to them.
    self._ahead.clear()
    pipeline.close_iterator(self.iterator, self._workers)

  def __enter__(self):
    return self

  def __exit__(self, *exc) -> None:
    self.close()
