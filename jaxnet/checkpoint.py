"""Orbax checkpoints of the train state, the data iterator's position and the config.

One composite checkpoint per saved step, under WORKDIR/checkpoints/<step>/:
  state/      the TrainState pytree (params, BN stats, optimizer, loss scale, EMA, RNG, step)
  data_iter/  the Grain iterator state, one JSON file per process (Grain's orbax handler)
  config/     the resolved config as JSON, so a checkpoint says how it was made
Saves are asynchronous: the step's arrays are copied off the device, then written
in a background thread while training goes on. Orbax writes into a temporary
directory and renames it when complete, so a crash or a full disk mid-save
leaves the previous checkpoint as the latest valid one.
"""

import logging
import os

import grain.python as grain
import jax
import orbax.checkpoint as ocp

STATE, DATA_ITER, CONFIG = "state", "data_iter", "config"


class IteratorPosition:
  """A frozen Grain iterator state, in the shape Grain's orbax handler saves.

  The loop prefetches batches ahead of the step that consumes them, so the live
  iterator is ahead of the model. We save the state recorded right after the
  last *consumed* batch was read instead.
  """

  def __init__(self, state: bytes):
    self._state = state

  def get_state(self) -> bytes:
    return self._state


def make_manager(workdir: str, keep: int, async_save: bool = True) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep or None, create=True, enable_async_checkpointing=async_save,
      cleanup_tmp_directories=True)
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), "checkpoints"), options=options,
      item_names=(STATE, DATA_ITER, CONFIG),
      item_handlers={STATE: ocp.StandardCheckpointHandler(), DATA_ITER: grain.PyGrainCheckpointHandler(),
                     CONFIG: ocp.JsonCheckpointHandler()})


def save(manager: ocp.CheckpointManager, step: int, state, iterator_state: bytes, config_dict: dict) -> bool:
  """Starts an async save of `step`. Returns False if a disk error stopped it.

  A failed save is reported, not raised: the previous checkpoint stays intact
  and training can go on (the next save may succeed once space is freed).
  """
  try:
    return manager.save(step, args=ocp.args.Composite(**{
        STATE: ocp.args.StandardSave(state),
        DATA_ITER: grain.PyGrainCheckpointSave(IteratorPosition(iterator_state)),
        CONFIG: ocp.args.JsonSave(config_dict),
    }))
  except OSError as e:
    logging.error("checkpoint at step %d FAILED (%s); the previous checkpoint (step %s) is intact. "
                  "Free disk space in %s.", step, e, manager.latest_step(), manager.directory)
    return False


def restore(manager: ocp.CheckpointManager, abstract_state, iterator, step: int | None = None):
  """Restores `step` (default: latest) into the given shapes/shardings and iterator.

  Returns (state, step), or (None, None) when there is no checkpoint.
  """
  step = manager.latest_step() if step is None else step
  if step is None:
    return None, None
  items = {STATE: ocp.args.StandardRestore(abstract_state)}
  if iterator is not None:
    items[DATA_ITER] = grain.PyGrainCheckpointRestore(iterator)
  try:
    restored = manager.restore(step, args=ocp.args.Composite(**items))
  except ValueError as e:
    if "in checkpoint does not match" not in str(e):
      raise
    raise ValueError(
        f"the data iterator saved at step {step} in {manager.directory} does not fit this run's "
        f"input pipeline ({str(e).splitlines()[0]}). Resume with the same data.source, data.dir, "
        f"data.workers, batch_size and seed as the run that wrote it, or use a new workdir.") from e
  return restored[STATE], step


def abstract(tree, shardings):
  """ShapeDtypeStructs with shardings: a restore target that allocates nothing."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def load_arrays(workdir: str, step: int | None = None):
  """The saved train state of WORKDIR as a tree of host numpy arrays (no model needed).

  For inspection, notebooks and tests. Returns (tree, step).
  """
  manager = ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), "checkpoints"),
      options=ocp.CheckpointManagerOptions(read_only=True), item_names=(STATE,),
      item_handlers={STATE: ocp.StandardCheckpointHandler()})
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {workdir}/checkpoints")
  tree = manager.restore(step, args=ocp.args.Composite(**{STATE: ocp.args.StandardRestore()}))[STATE]
  manager.close()
  return tree, step
