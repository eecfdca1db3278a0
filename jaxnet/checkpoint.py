"""Orbax checkpoints of the train state, the data iterator's position and the config, verified.

One composite checkpoint per saved step, under WORKDIR/checkpoints/<step>/:
  state/      the TrainState pytree (params, BN stats, optimizer, loss scale, EMA, RNG, step)
  data_iter/  the Grain iterator state, one JSON file per process (Grain's orbax handler)
  config/     the resolved config as JSON, so a checkpoint says how it was made
  checksums/  a checksum of every array in state/, computed on the device at save time

Saves are asynchronous: the step's arrays are copied off the device, then written
in a background thread while training goes on. Orbax writes into a temporary
directory and renames it when complete, so a crash mid-save leaves the previous
checkpoint as the latest. What this module adds to orbax:
- a state with any non-finite value is never written (NonFiniteError);
- every restore recomputes the checksums and compares them with the saved ones;
  a checkpoint that does not match, cannot be read or is incomplete is reported
  by step and reason, and training falls back to the newest one that verifies;
- a failed save (a full disk, a permission error) is one clear error naming the
  step, the path, the cause and the newest intact checkpoint;
- rotation (keep_checkpoints) deletes only old checkpoints whose save is known to
  have completed, so the newest intact checkpoint is never deleted.
The checksums and the finite check are jaxnet.integrity; whether a checkpoint fits this
run, jaxnet.checkpoint_fit; reading the saved config as a file, jaxnet.checkpoint_files;
removing a failed save's files and moving damaged checkpoints aside, jaxnet.checkpoint_cleanup.
"""

import logging
import os

import grain.python as grain
import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxnet import checkpoint_cleanup, checkpoint_fit, integrity
from jaxnet import state as state_lib
from jaxnet.checkpoint_files import CHECKPOINTS_DIR, CONFIG
from jaxnet.checkpoint_fit import CheckpointMismatchError
from jaxnet.errors import MissingFileError, UserError, describe_os_error, first_line
from jaxnet.integrity import DamagedCheckpointError  # noqa: F401 (a ckpt.* name)
from jaxnet.quiet import quiet_logger

STATE, DATA_ITER, CHECKSUMS = "state", "data_iter", "checksums"


class CheckpointSaveError(UserError):
  """A save failed (full disk, permissions, ...); the previous checkpoint is intact."""

  # orbax's writer threads report the same failure again (tracebacks) as they wind down.
  noisy_teardown = True


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


# ---------------------------------------------------------------------------
# The workdir's checkpoints.

def _handlers():
  return {STATE: ocp.StandardCheckpointHandler(), DATA_ITER: grain.PyGrainCheckpointHandler(),
          CONFIG: ocp.JsonCheckpointHandler(), CHECKSUMS: ocp.JsonCheckpointHandler()}


class Checkpoints:
  """WORKDIR/checkpoints: verified saves and restores, failure reporting, rotation.

  `read_only` (eval, predict, export) never creates, moves or deletes anything.
  """

  def __init__(self, workdir: str, keep: int = 0, async_save: bool = True, read_only: bool = False):
    self.workdir = os.path.abspath(workdir)
    self.directory = os.path.join(self.workdir, CHECKPOINTS_DIR)
    self.keep, self.read_only = keep, read_only
    if read_only and not os.path.isdir(self.directory):
      raise self._no_checkpoint()
    with quiet_logger("absl"):  # orbax warns that a read-only manager is read-only
      options = ocp.CheckpointManagerOptions(
          max_to_keep=None,  # rotation is ours: see _rotate
          create=not read_only, read_only=read_only, enable_async_checkpointing=async_save,
          cleanup_tmp_directories=not read_only)
      self.manager = ocp.CheckpointManager(self.directory, options=options,
                                           item_names=(STATE, DATA_ITER, CONFIG, CHECKSUMS),
                                           item_handlers=_handlers())
    self._pending = None           # step of a save that may still be in flight
    self._failed = set()           # steps whose partial directories close() removes again
    self._saved = set()            # steps whose save this object started
    self.newest_intact = None      # newest step known to be complete and verified

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def resolve_step(self, step: int | None = None) -> int:
    """`step` (default: the newest); FileNotFoundError, naming the fix, where there is none."""
    steps = self.steps()
    if not steps:
      raise self._no_checkpoint()
    if step is None:
      return steps[-1]
    if step not in steps:
      raise MissingFileError(f"no checkpoint of step {step} in {self.directory}; it has steps {steps}")
    return step

  def _no_checkpoint(self) -> FileNotFoundError:
    return MissingFileError(f"no checkpoint in {self.directory}: train first "
                            f"(python -m jaxnet.main --config=... --workdir={self.workdir})")

  # -- saving ---------------------------------------------------------------

  def save(self, step: int, state, iterator_state: bytes, config_dict: dict) -> None:
    """Checks that `state` is finite, then starts an async save of `step`.

    Raises NonFiniteError (nothing is written) or CheckpointSaveError (this save
    or the previous one in flight failed; older checkpoints are intact).
    """
    self.wait()
    checksums = integrity.check_finite_state(state, step, self.intact_sentence())
    try:
      self.manager.save(step, args=ocp.args.Composite(**{
          STATE: ocp.args.StandardSave(state),
          DATA_ITER: grain.PyGrainCheckpointSave(IteratorPosition(iterator_state)),
          CONFIG: ocp.args.JsonSave(config_dict),
          CHECKSUMS: ocp.args.JsonSave({"algorithm": integrity.CHECKSUM_ALGORITHM, "leaves": checksums}),
      }))
    except Exception as e:  # orbax raises many types; each becomes one clear message
      raise self._save_failed(step, e) from e
    self._pending = step
    self._saved.add(step)

  def wait(self) -> None:
    """Waits for a save in flight; raises CheckpointSaveError if it failed. Then rotates."""
    if self._pending is None:
      return
    step, self._pending = self._pending, None
    try:
      self.manager.wait_until_finished()
      self.manager.check_for_errors()
    except Exception as e:
      raise self._save_failed(step, e) from e
    if step not in self.manager.all_steps():  # orbax swallowed the failure
      raise self._save_failed(step, RuntimeError("the checkpoint directory was not finalized"))
    self.newest_intact = step
    self._rotate()

  def complete_sentence(self) -> str:
    """intact_sentence, counting also the saves of this run that have completed on disk but
    were not yet waited for (a run stopped from another thread, see peers.py)."""
    try:
      on_disk = {int(d) for d in os.listdir(self.directory) if d.isdigit()}
    except OSError:
      on_disk = set()
    newest = max(on_disk & self._saved | {self.newest_intact} - {None}, default=None)
    if newest is None:
      return self.intact_sentence()
    return f"The newest intact checkpoint is step {newest}."

  def intact_sentence(self) -> str:
    if self.newest_intact is None:
      return "There is no intact checkpoint in this workdir yet."
    return f"The newest intact checkpoint is step {self.newest_intact}."

  def _save_failed(self, step: int, error: BaseException) -> CheckpointSaveError:
    path = os.path.join(self.directory, str(step))
    self._failed.add(step)
    checkpoint_cleanup.remove_partials(self.directory, step)  # give the space back
    cause = describe_os_error(error)
    fix = "Free space there, then" if cause == "no space left on device" else "Fix that, then"
    return CheckpointSaveError(f"checkpoint at step {step} FAILED ({cause}) writing {path}. "
                               f"{self.intact_sentence()} {fix} rerun the same command to resume.")

  def _rotate(self) -> None:
    if not self.keep:
      return
    # Called only once a save has completed, so the newest checkpoint kept is that
    # (intact) one: a save that fails later never costs the last good checkpoint.
    for step in self.steps()[:-self.keep]:
      self.manager.delete(step)

  # -- restoring ------------------------------------------------------------

  def restore(self, step: int, abstract_state, iterator=None):
    """The verified state of `step` (and the iterator set to its position).

    Raises CheckpointMismatchError when the checkpoint holds a different model or
    optimizer than `abstract_state`, DamagedCheckpointError when it is damaged.
    """
    step_dir = os.path.join(self.directory, str(step))
    try:
      with quiet_logger("absl"):  # orbax warns about items a checkpoint does not have
        metadata = self.manager.item_metadata(step)
      saved_tree = metadata[STATE]
    except Exception as e:
      raise DamagedCheckpointError(step, self.directory, f"its metadata cannot be read ({first_line(e)})")
    if saved_tree is None:
      raise DamagedCheckpointError(step, self.directory, "it holds no train state (empty or incomplete)")
    target = checkpoint_fit.restore_target(saved_tree, abstract_state, step_dir)
    state, checksums = self.read(step, target, iterator)
    if checksums is not None:
      integrity.verify(state, checksums, step, self.directory)
    else:
      logging.warning("checkpoint %d in %s has no checksums (written by jaxnet before they were "
                      "added): restored without verification", step, self.directory)
    return state_lib.with_ema_as_kept(state, abstract_state.ema_params is not None)

  def read(self, step: int, target=None, iterator=None):
    """(state, saved checksums or None) of `step`, unverified; `target=None` gives numpy arrays."""
    items = {STATE: ocp.args.StandardRestore(target)}
    if iterator is not None:
      checkpoint_fit.check_iterator_processes(os.path.join(self.directory, str(step), DATA_ITER),
                                              jax.process_count(), self.workdir)
      items[DATA_ITER] = grain.PyGrainCheckpointRestore(iterator)
    has_checksums = os.path.isdir(os.path.join(self.directory, str(step), CHECKSUMS))
    if has_checksums:
      items[CHECKSUMS] = ocp.args.JsonRestore()
    try:
      with quiet_logger("absl"):
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:
      if "in checkpoint does not match" in str(e):  # Grain: another pipeline's iterator
        raise CheckpointMismatchError(
            f"the data iterator saved at step {step} in {self.directory} does not fit this run's "
            f"input pipeline ({first_line(e)}). Resume with the same data.source, data.dir, "
            f"data.workers, batch_size and seed as the run that wrote it, or use a new workdir.") from e
      raise DamagedCheckpointError(step, self.directory, f"it cannot be read ({first_line(e)})") from e
    if restored[STATE] is None:
      raise DamagedCheckpointError(step, self.directory, "it holds no train state")
    return restored[STATE], restored[CHECKSUMS] if has_checksums else None

  def restore_newest(self, abstract_state, iterator=None):
    """The newest checkpoint that verifies: (state, step), or (None, None) if there is none.

    Damaged checkpoints are reported and moved to WORKDIR/checkpoints_damaged/
    (so a resumed run can save those steps again); the run goes on from the
    newest one that verifies. Raises if checkpoints exist but none verifies.
    """
    damaged = []
    for step in reversed(self.steps()):
      try:
        state = self.restore(step, abstract_state, iterator)
      except DamagedCheckpointError as e:
        print(f"warning: {e}; trying the previous checkpoint", flush=True)
        damaged.append(step)
        continue
      self._set_aside(damaged)
      self.newest_intact = step
      return state, step
    if damaged:
      self._set_aside(damaged)
      raise DamagedCheckpointError(
          ", ".join(map(str, damaged)), self.directory,
          f"no checkpoint verifies; they were moved to "
          f"{os.path.join(self.workdir, checkpoint_cleanup.DAMAGED_DIR)}. "
          f"Rerun to start from scratch, or use a new --workdir")
    return None, None

  def _set_aside(self, steps) -> None:
    if not steps or self.read_only or jax.process_index() != 0:
      return
    checkpoint_cleanup.set_aside(self.workdir, self.directory, steps)
    self.manager.reload()

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self.manager.close()
      for step in self._failed:
        checkpoint_cleanup.remove_partials(self.directory, step, settle_sec=0.5)


def load_arrays(workdir: str, step: int | None = None):
  """The saved train state of WORKDIR as a tree of host numpy arrays, verified (no model needed).

  For inspection, predict/export, notebooks and tests. Returns (tree, step).
  Raises FileNotFoundError without checkpoints, DamagedCheckpointError when the
  checkpoint does not verify.
  """
  checkpoints = Checkpoints(workdir, read_only=True)
  try:
    step = checkpoints.resolve_step(step)
    tree, checksums = checkpoints.read(step)
    tree = jax.tree.map(np.asarray, tree)
    if checksums is not None:
      integrity.verify(tree, checksums, step, checkpoints.directory)
    return tree, step
  finally:
    checkpoints.close()

