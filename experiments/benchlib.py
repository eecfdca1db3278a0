"""Helpers shared by the experiments/ benchmarks: what machine and versions a
table was measured with, and a median-of-repeats step timer.

Imports nothing heavy, so the orchestrating processes of the benchmarks can
print hardware and versions without starting a jax backend (on a GPU that
would reserve device memory the worker processes need).
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from importlib import metadata


def cpu_line() -> str:
  model = platform.processor() or "unknown CPU"
  try:
    with open("/proc/cpuinfo") as f:
      model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return f"CPU: {model}, {os.cpu_count()} logical cores ({usable} usable)"


def load_line() -> str:
  try:
    return "load average (1 min) %.2f on %d cores" % (os.getloadavg()[0], os.cpu_count())
  except OSError:
    return "load average unknown"


def dist_version(name: str) -> str:
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return "not installed"


def versions_line(*extra: str) -> str:
  names = ["jax", "jaxlib", "flax", "optax", *extra]
  return "versions: python " + platform.python_version() + ", " + ", ".join(
      f"{n} {dist_version(n)}" for n in names)


def date_line() -> str:
  return "date: " + datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")


def median_step_seconds(step, state, steps: int, repeats: int, sync) -> tuple[object, list[float]]:
  """Runs `state = step(state)` `repeats` times `steps` steps; returns (state, seconds per step of each repeat).

  `sync(state)` must wait for the device (jax.block_until_ready, torch.cuda.synchronize):
  without it the clock would stop when the work is queued, not when it is done.
  """
  times = []
  for _ in range(repeats):
    sync(state)
    start = time.perf_counter()
    for _ in range(steps):
      state = step(state)
    sync(state)
    times.append((time.perf_counter() - start) / steps)
  return state, times


NOT_RUN = "not run"  # the start of a cell's error when its time budget was spent before it began


def cell_failed(result: dict) -> bool:
  """A benchmark cell that ran and failed; a cell skipped for lack of time is not a failure."""
  return "error" in result and not str(result["error"]).startswith(NOT_RUN)


def median(values):
  return statistics.median(values) if values else float("nan")


def filled_state(abstract_state, seed: int = 0):
  """A host train state of `abstract_state`'s shapes with arbitrary finite values.

  Step time does not depend on the weights' values, so benchmarks fill the state
  instead of compiling the random init (which compiles slower than a small model's
  step). Scales and variances are 1, so BN and the loss scale are well defined.
  """
  import jax
  import numpy as np
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    name = jax.tree_util.keystr(path)
    if not np.issubdtype(leaf.dtype, np.floating):
      return np.zeros(leaf.shape, leaf.dtype)
    if "var" in name or "scale" in name:
      return np.ones(leaf.shape, leaf.dtype)
    return (0.05 * rng.standard_normal(leaf.shape)).astype(leaf.dtype)

  return jax.tree_util.tree_map_with_path(fill, abstract_state)


def synthetic_batch(exp, global_batch: int, seed: int = 0) -> dict:
  """A random uint8 batch for `exp` (a jaxnet Experiment), on its devices: the image, mask and
  corrupt fields every task has, then the task's own (`task.batch_fields`: a class label, a
  segmentation's label map): integers drawn below the class count, floats 1, flags set."""
  import jax
  import numpy as np
  rng = np.random.default_rng(seed)
  host = {"image": rng.integers(0, 256, (global_batch,) + exp.image_shape, dtype=np.uint8),
          "mask": np.ones((global_batch,), np.bool_), "corrupt": np.zeros((global_batch,), np.int32)}
  for name, (dims, dtype) in exp.task.batch_fields(exp.config).items():
    shape, dtype = (global_batch,) + tuple(dims), np.dtype(dtype)
    if dtype == np.bool_:
      host[name] = np.ones(shape, dtype)
    elif np.issubdtype(dtype, np.integer):
      host[name] = rng.integers(0, exp.num_classes, shape).astype(dtype)
    else:
      host[name] = np.ones(shape, dtype)
  return {k: jax.device_put(v, exp.batch_sharding) for k, v in host.items()}
