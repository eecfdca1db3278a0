"""Orbax checkpoints of the train state, the data iterator's position and the config, verified.

One orbax CheckpointManager with four composite items per saved step, under
WORKDIR/checkpoints/<step>/:
  state/      the TrainState pytree (params, BN stats, optimizer, loss scale, EMA, RNG, step)
  data_iter/  the Grain iterator state, one JSON file per process (Grain's orbax handler);
              absent from a state made without data (weights imported with --no-data)
  config/     the resolved config as JSON, so a checkpoint says how it was made
  checksums/  a checksum of every array in state/, computed at save time, the number of
              processes that saved the data position, and the position's kind
              (`data_elements: batches`; none: record-level, position_elements)

Saves are asynchronous: the step's arrays are copied off the device, then written in a
background thread while training goes on. Orbax writes into a temporary directory and
renames it when complete, so a crash mid-save leaves the previous checkpoint as the latest.
What jaxnet adds to orbax:
- a state with any non-finite value is never written (NonFiniteError);
- every restore recomputes the checksums and compares them with the saved ones; a
  checkpoint that does not match, cannot be read or is incomplete is reported by step and
  reason, moved to WORKDIR/checkpoints_damaged/, and training falls back to the newest one
  that verifies;
- a checkpoint whose state verifies is never called damaged: a state of another model or
  optimizer, or a data position that does not fit this run's input pipeline (another data
  config, another process count), is a CheckpointMismatchError, and the checkpoint stays;
- a data position restores when the data has moved (another data.dir, accepted): Grain
  checks the position against repr(source), which names the files' absolute path
  (adapters/grain.py); the data itself was checked against data_identity.json before
  (jaxnet/core/workdir.py);
- a failed save (a full disk, a permission error) is one clear error naming the step, the
  path, the cause and the newest intact checkpoint, and its partial files are removed;
- rotation (keep_checkpoints) deletes only old checkpoints whose save is known to have
  completed, so the newest intact checkpoint is never deleted.
"""

import json
import logging
import os
import shutil
import time

import grain.python as grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from jaxnet.core import state as state_lib
from jaxnet.core.adapters import grain as grain_adapter
from jaxnet.core.adapters import orbax as orbax_adapter
from jaxnet.core.errors import DIVERGED_HINT, MissingFileError, NonFiniteError, UserError

# What the person running this is told (progress, notes, warnings): shown by the shell
# (jaxnet.api.show_reports), and routable or silenced by whoever embeds the core.
_REPORT = logging.getLogger("jaxnet.report")

CHECKPOINTS_DIR, DAMAGED_DIR = "checkpoints", "checkpoints_damaged"
STATE, DATA_ITER, CONFIG, CHECKSUMS = "state", "data_iter", "config", "checksums"
BATCHES, RECORDS = "batches", "records"  # the kinds of data position (position_elements)
CHECKSUM_ALGORITHM = "jaxnet-fmix32-sum-v1"


class CheckpointSaveError(UserError):
  """A save failed (full disk, permissions, ...); the previous checkpoint is intact."""

  # orbax's writer threads report the same failure again (tracebacks) as they wind down.
  noisy_teardown = True


_LISTING_TRIES = 3  # reads and listings of a workdir that a training run rotates under them


class DamagedCheckpointError(UserError):
  """A checkpoint failed verification, could not be read, or is incomplete."""

  def __init__(self, step, directory, reason):
    self.step, self.reason = step, reason
    super().__init__(f"checkpoint {step} in {directory} is damaged: {reason}")


class CheckpointMismatchError(UserError):
  """A checkpoint is intact but does not fit this run: another model or optimizer, or a data
  position saved for another input pipeline or process count."""


class IteratorPosition:
  """A frozen Grain iterator state, in the shape Grain's orbax handler saves.

  The loop prefetches batches ahead of the step that consumes them, so the live iterator
  is ahead of the model. We save the state recorded right after the last *consumed* batch
  was read instead.
  """

  def __init__(self, state: bytes):
    self._state = state

  def get_state(self) -> bytes:
    return self._state


def _handlers():
  return {STATE: orbax_adapter.state_handler(), DATA_ITER: grain.PyGrainCheckpointHandler(),
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
    # A reader's manager is not told read_only: orbax warns on every such manager, and this
    # object never asks a reader's manager to write, delete or clean up.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None,  # rotation is ours: see _rotate
        create=not read_only, enable_async_checkpointing=async_save,
        cleanup_tmp_directories=not read_only)
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=(STATE, DATA_ITER, CONFIG, CHECKSUMS),
                                         item_handlers=_handlers())
    self._pending = None           # step of a save that may still be in flight
    self._failed = set()           # steps whose partial directories close() removes again
    self._saved = set()            # steps whose save this object started
    self.newest_intact = None      # newest step known to be complete and verified

  def steps(self) -> list[int]:
    # A listing that races rotation (a step directory deleted while orbax looks into it) is
    # a FileNotFoundError: list again, the deleted step is then gone from the listing.
    for attempt in range(_LISTING_TRIES):
      try:
        return sorted(self.manager.all_steps())
      except FileNotFoundError:
        if attempt == _LISTING_TRIES - 1:
          raise
        self._reload()
    raise AssertionError("unreachable")

  def resolve_step(self, step: int | None = None) -> int:
    """`step` (default: the newest); MissingFileError, naming the fix, where there is none."""
    steps = self.steps()
    if not steps:
      raise self._no_checkpoint()
    if step is None:
      return steps[-1]
    if step not in steps:
      raise MissingFileError(f"no checkpoint of step {step} in {self.directory}; it has steps {steps}")
    return step

  def read_newest(self, read, step: int | None = None):
    """(read(s), s) for checkpoint `step`, or for the newest one when `step` is None. A reader
    beside a training run: a newest checkpoint that rotation deletes while it is read is gone,
    not damaged, so the then newest one is read instead (once)."""
    for attempt in range(_LISTING_TRIES):
      if attempt:
        self._reload()
      resolved = self.resolve_step(step)
      try:
        return read(resolved), resolved
      except (DamagedCheckpointError, FileNotFoundError) as e:
        if not self._rotated_away(resolved):
          if step is None and attempt < _LISTING_TRIES - 1 and self._newer_complete(resolved):
            continue  # a training saved a newer one while this was read (and rotates): read that
          if isinstance(e, FileNotFoundError):  # orbax's own, for a file of a step still listed
            raise DamagedCheckpointError(resolved, self.directory, f"a file of it is missing ({e})") from None
          raise
        if step is None and attempt < _LISTING_TRIES - 1:
          continue  # the then newest one
        self._reload()
        raise MissingFileError(
            f"checkpoint {resolved} in {self.directory} was deleted while it was read: the training "
            f"run writing this workdir rotated it away (keep_checkpoints), so it is not damaged. "
            f"Its checkpoints now: steps {self.steps()}; " + (
                "read one of those, or leave out the step to read the newest" if step is not None
                else "rerun to read the newest")) from None
    raise AssertionError("unreachable")

  def _reload(self) -> None:
    try:
      self.manager.reload()
    except FileNotFoundError:  # raced a deletion again: steps() lists once more
      pass

  def _rotated_away(self, step: int) -> bool:
    """Whether `step`, which failed to read, was being deleted by rotation: its directory is
    gone, or (a deletion still under way leaves the directory with some files gone) a newer
    checkpoint has completed since, which is when rotation deletes older ones."""
    step_dir = os.path.join(self.directory, str(step))
    if not os.path.isdir(step_dir):
      return True
    # Half-deleted: items of it gone (a damaged checkpoint keeps them all, its bytes wrong),
    # and a newer one complete (its checksums are written last; an empty directory is none).
    if all(os.path.exists(os.path.join(step_dir, item)) for item in (STATE, CHECKSUMS)):
      return False
    return self._newer_complete(step)

  def _newer_complete(self, step: int) -> bool:
    """Whether a checkpoint newer than `step` has completed (its checksums are written last;
    an empty directory is none), listed afresh."""
    self._reload()
    return any(s > step and os.path.isdir(os.path.join(self.directory, str(s), CHECKSUMS))
               for s in self.steps())

  def _no_checkpoint(self) -> MissingFileError:
    return MissingFileError(f"no checkpoint in {self.directory}: train first "
                            f"(jaxnet train --config=RECIPE --workdir={self.workdir})")

  # -- saving ---------------------------------------------------------------

  def save(self, step: int, state, iterator_state: bytes | None, config_dict: dict,
           data_elements: str = BATCHES) -> None:
    """Checks that `state` is finite, then starts an async save of `step`.

    `iterator_state` None: a state made without data (weights imported with --no-data), saved
    with no data position; its checksums say so (`data_position: false`), and a training
    that restores it starts its data order from the beginning.
    `data_elements`: the kind of loader the position is of (`position_elements`): a
    whole-batches one's is marked so in the checksums (`data_elements: batches`), a
    record-level one's is not, as jaxnet before 2026-11-29 saved it.
    Raises NonFiniteError (nothing is written) or CheckpointSaveError (this save
    or the previous one in flight failed; older checkpoints are intact).
    """
    self.wait()
    finite, checksums, bad = inspect(state)
    if not finite:
      raise NonFiniteError(
          f"training diverged: the train state at step {step} has non-finite values "
          f"({', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}); it was not saved. "
          f"{self.intact_sentence()} {DIVERGED_HINT}")
    items = {STATE: ocp.args.StandardSave(state), CONFIG: ocp.args.JsonSave(config_dict),
             CHECKSUMS: ocp.args.JsonSave({"algorithm": CHECKSUM_ALGORITHM, "leaves": checksums,
                                           "process_count": jax.process_count(),
                                           **_position_mark(iterator_state, data_elements)})}
    if iterator_state is not None:
      items[DATA_ITER] = grain.PyGrainCheckpointSave(IteratorPosition(iterator_state))
    try:
      self.manager.save(step, args=ocp.args.Composite(**items))
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
    were not yet waited for (a run stopped from another thread: the heartbeat's)."""
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
    remove_partials(self.directory, step)  # give the space back
    cause = orbax_adapter.save_failure_cause(error)
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

  def restore(self, step: int, abstract_state, iterator=None, data_change_accepted: bool = False):
    """The verified state of `step` (and `iterator` set to its data position).

    Raises DamagedCheckpointError when the checkpoint is damaged, CheckpointMismatchError
    when it is intact but holds a different model or optimizer than `abstract_state`, or a
    data position `iterator`'s pipeline cannot take.
    """
    step_dir = os.path.join(self.directory, str(step))
    target = _restore_target(self.saved_tree(step), abstract_state, step_dir)
    state, saved = self.read(step, target)
    verify(state, saved, step, self.directory)
    if iterator is not None and saved.get("data_position", True) is False:
      _REPORT.info(f"checkpoint {step} holds no data position (weights imported without data): the data order "
                   f"starts from its beginning")
    elif iterator is not None:
      try:
        self._restore_position(step, iterator, saved.get("process_count"))
      except CheckpointMismatchError:
        if not data_change_accepted:
          raise
        # Accepted other data (files added or removed): a position in the old data's order
        # means nothing in the new one.
        _REPORT.info(f"the data differs from step {step}'s (accepted), and the data position saved with it does not "
                     f"fit it: the data order starts again from its beginning")
    return state_lib.with_ema_as_kept(state, abstract_state.ema_params is not None)

  def saved_tree(self, step: int):
    """The train state's tree as `step` saved it (orbax's metadata: shapes, dtypes), no arrays
    read; DamagedCheckpointError where it does not read (a checkpoint being rotated away
    reads so too: read_newest tells which)."""
    try:
      saved_tree = self.manager.item_metadata(step)[STATE]
    except Exception as e:
      raise DamagedCheckpointError(step, self.directory,
                                   f"its metadata cannot be read ({orbax_adapter.first_line(e)})") from None
    if saved_tree is None:
      raise DamagedCheckpointError(step, self.directory, "it holds no train state (empty or incomplete)")
    return saved_tree

  def read(self, step: int, target=None):
    """(state, the saved checksums) of `step`, unverified; `target=None` gives numpy arrays."""
    try:
      restored = self.manager.restore(step, args=ocp.args.Composite(**{
          STATE: ocp.args.StandardRestore(target), CHECKSUMS: ocp.args.JsonRestore()}))
    except Exception as e:
      raise DamagedCheckpointError(
          step, self.directory, f"it cannot be read ({orbax_adapter.first_line(e)})") from e
    if restored[STATE] is None or restored[CHECKSUMS] is None:
      raise DamagedCheckpointError(step, self.directory, "it holds no train state or no checksums")
    return restored[STATE], restored[CHECKSUMS]

  def _restore_position(self, step: int, iterator, saved_processes) -> None:
    """Sets `iterator` to the data position saved with `step`, whose state has verified: a
    position that does not fit is a mismatch of this run, never damage."""
    where = os.path.join(self.directory, str(step), DATA_ITER)
    if saved_processes not in (None, jax.process_count()):
      raise CheckpointMismatchError(
          f"the data position in {where} was saved by {saved_processes} process(es), each in its "
          f"own shard of the data; this run has {jax.process_count()}. Resume with "
          f"{saved_processes} process(es) (any number of devices each), or start a new --workdir "
          f"from these weights with --config.init.weights={self.workdir}")
    # A whole-batches position is batch n for any worker count, so it moves to this loader's
    # count; a record-level one holds each worker's place in a record stream, and fits only its own.
    target = grain_adapter.restore_target(iterator, other_workers=position_elements(self.workdir, step) == BATCHES)
    try:
      self.manager.restore(step, args=ocp.args.Composite(**{DATA_ITER: grain.PyGrainCheckpointRestore(target)}))
    except Exception as e:
      saved_workers, workers = getattr(target, "refused", None) or (None, None)
      if saved_workers is not None:
        raise CheckpointMismatchError(
            f"the data position saved at step {step} in {where} is record-level (jaxnet before 2026-11-29) and "
            f"holds the places of {saved_workers} data workers; this run has {workers}. Resume with "
            f"--config.data.workers={saved_workers}") from e
      raise CheckpointMismatchError(
          f"the data position saved at step {step} in {where} does not fit this run's input "
          f"pipeline ({orbax_adapter.first_line(e)}). Resume with the same data.loader (grain or "
          f"dali: each saves its own kind of position), data.source, data.dir, "
          f"batch_size and seed as the run that wrote it, or use a new workdir.") from e

  def restore_newest(self, abstract_state, iterator=None, data_change_accepted: bool = False):
    """The newest checkpoint that verifies: (state, step), or (None, None) if there is none.

    Damaged checkpoints are reported and moved to WORKDIR/checkpoints_damaged/ (so a
    resumed run can save those steps again); the run goes on from the newest one that
    verifies. Raises if checkpoints exist but none verifies.
    """
    damaged = []
    for step in reversed(self.steps()):
      try:
        state = self.restore(step, abstract_state, iterator, data_change_accepted)
      except DamagedCheckpointError as e:
        _REPORT.info(f"warning: {e}; trying the previous checkpoint")
        damaged.append(step)
        continue
      self._set_aside(damaged)
      self.newest_intact = step
      return state, step
    if damaged:
      self._set_aside(damaged)
      raise DamagedCheckpointError(
          ", ".join(map(str, damaged)), self.directory,
          f"no checkpoint verifies; they were moved to {os.path.join(self.workdir, DAMAGED_DIR)}. "
          f"Rerun to start from scratch, or use a new --workdir")
    return None, None

  def _set_aside(self, steps) -> None:
    """Moves the checkpoints `steps` to WORKDIR/checkpoints_damaged/STEP-TIME, saying where."""
    if not steps or self.read_only or jax.process_index() != 0:
      return
    target = os.path.join(self.workdir, DAMAGED_DIR)
    os.makedirs(target, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for step in steps:
      destination = os.path.join(target, f"{step}-{stamp}")
      os.replace(os.path.join(self.directory, str(step)), destination)
      _REPORT.info(f"moved damaged checkpoint {step} to {destination}")
    self.manager.reload()

  def close(self) -> None:
    """Waits for a save in flight and closes the manager. Either failing (a full disk under
    orbax's last metadata write, say) is one CheckpointSaveError."""
    try:
      self.wait()
    finally:
      try:
        self.manager.close()
      except Exception as e:  # orbax raises many types; each becomes one clear message
        raise self._save_failed(self._pending or self.newest_intact or 0, e) from e
      finally:
        # The first failed write ends orbax's save, but tensorstore's writes of the other
        # arrays may still land afterwards and recreate the partial directory.
        for step in self._failed:
          remove_partials(self.directory, step, settle_sec=0.5)


def remove_partials(directory: str, step: int, settle_sec: float = 0.0) -> None:
  """Removes a failed save's temporary directories of `step` in `directory`. With
  `settle_sec`, keeps removing until they have stayed absent that long (at most 20 times
  as long)."""
  deadline, absent_since = time.monotonic() + 20 * settle_sec, None
  while True:
    partials = orbax_adapter.partial_saves(directory, step)
    for partial in partials:
      shutil.rmtree(partial, ignore_errors=True)
    now = time.monotonic()
    if partials or absent_since is None:
      absent_since = now
    if now - absent_since >= settle_sec or now > deadline:
      return
    time.sleep(settle_sec / 5)


def load_arrays(workdir: str, step: int | None = None):
  """The saved train state of WORKDIR as a tree of host numpy arrays, verified (no model
  needed): for predict/export, notebooks and tests. Returns (tree, step). Raises
  MissingFileError without checkpoints, DamagedCheckpointError when it does not verify.
  """
  checkpoints = Checkpoints(workdir, read_only=True)

  def read(step):
    tree, checksums = checkpoints.read(step, _on_one_device(checkpoints.saved_tree(step)))
    tree = jax.tree.map(np.asarray, tree)
    verify(tree, checksums, step, checkpoints.directory)
    return tree
  try:
    return checkpoints.read_newest(read, step)
  finally:
    checkpoints.close()


def _on_one_device(saved_tree):
  """The saved tree (orbax's metadata) as abstract arrays on this process's first device: read
  without a target, orbax places each array as it was saved, which fails where the devices
  differ (a run of 8 devices read on a machine with 1: "Topology mismatch")."""
  if saved_tree is None:
    return None
  one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=one), saved_tree)


# --- a workdir's checkpoints as plain files ----------------------------------------

def has_checkpoints(workdir: str) -> bool:
  """Whether WORKDIR/checkpoints holds any step directory (intact or not), without opening it."""
  directory = os.path.join(workdir, CHECKPOINTS_DIR)
  return os.path.isdir(directory) and any(d.isdigit() for d in os.listdir(directory))


def saved_config(workdir: str, step: int) -> dict | None:
  """The config checkpoint `step` of WORKDIR was saved with, or None where it does not read
  (rotated away while read, incomplete, damaged). No orbax manager, nothing written."""
  try:
    config = orbax_adapter.read_json_item(os.path.join(workdir, CHECKPOINTS_DIR, str(step)), CONFIG)
  except (OSError, ValueError):
    return None
  return config if isinstance(config, dict) else None


def holds_data_position(workdir: str, step: int) -> bool:
  """Whether checkpoint `step` of WORKDIR was saved with a data position: False only for a
  state made without data (Checkpoints.save with no iterator state: weights imported with
  --no-data). Read as a file; a checkpoint whose checksums do not read counts as holding one
  (its restore reports it)."""
  checksums = _saved_checksums(workdir, step)
  return checksums is None or checksums.get("data_position", True) is not False


def _position_mark(iterator_state: bytes | None, data_elements: str) -> dict:
  if iterator_state is None:
    return {"data_position": False}
  if data_elements not in (BATCHES, RECORDS):
    raise ValueError(f"data_elements must be {BATCHES!r} or {RECORDS!r}, got {data_elements!r}")
  return {"data_elements": BATCHES} if data_elements == BATCHES else {}


def position_elements(workdir: str, step: int) -> str | None:
  """The kind of loader checkpoint `step`'s data position is of: "batches" (a loader whose
  Grain elements are whole batches, marked so at save), "records" (record-level Grain
  elements: a position saved without the mark, as jaxnet before 2026-11-29 saved every one),
  or None (no data position, or checksums that do not read: its restore reports those).
  A position's kind is jaxnet's own record, never read from Grain's state."""
  checksums = _saved_checksums(workdir, step)
  if checksums is None or checksums.get("data_position", True) is False:
    return None
  return BATCHES if checksums.get("data_elements") == BATCHES else RECORDS


def _saved_checksums(workdir: str, step: int) -> dict | None:
  """Checkpoint `step`'s checksums record, read as a file; None where it does not read."""
  try:
    checksums = orbax_adapter.read_json_item(os.path.join(workdir, CHECKPOINTS_DIR, str(step)), CHECKSUMS)
  except (OSError, ValueError):
    return None
  return checksums if isinstance(checksums, dict) else None


def newest_saved_config(workdir: str) -> tuple[int, dict] | tuple[None, None]:
  """(step, config dict) of the newest checkpoint whose saved config reads, or (None, None):
  every checkpoint carries the config that wrote it, so a workdir whose config.json was
  deleted still knows what run it holds. No orbax manager, no arrays, nothing written."""
  directory = os.path.join(workdir, CHECKPOINTS_DIR)
  if not os.path.isdir(directory):
    return None, None
  for step in sorted((int(d) for d in os.listdir(directory) if d.isdigit()), reverse=True):
    config = saved_config(workdir, step)
    if config is not None:  # else an incomplete or damaged checkpoint: an older one may still say
      return step, config
  return None, None


# --- does a checkpoint fit this run ------------------------------------------------

def _shapes(tree) -> dict:
  return {leaf_name(p): tuple(x.shape) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _restore_target(saved_tree, abstract_state, step_dir: str):
  """The abstract state to read a checkpoint whose saved tree (orbax's metadata) is
  `saved_tree` into: this run's, with the EMA field as the checkpoint has it.
  CheckpointMismatchError names the arrays whose names or shapes differ."""
  saved_has_ema = any(n.startswith("ema_params/") for n in _shapes(saved_tree))
  target = state_lib.restore_target(abstract_state, saved_has_ema)
  saved, wanted = _shapes(saved_tree), _shapes(target)
  if saved == wanted:
    return target
  diffs = [f"{k}: {saved.get(k, 'absent')} in the checkpoint, {wanted.get(k, 'absent')} in this run"
           for k in sorted(set(saved) | set(wanted)) if saved.get(k) != wanted.get(k)]
  more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
  raise CheckpointMismatchError(
      f"the checkpoint in {step_dir} holds a different model or optimizer than this config builds "
      f"({'; '.join(diffs[:3])}{more}). Use the config it was trained with (its config.json), "
      f"or a new --workdir.")


# --- checksums and the finite check --------------------------------------------------
# A checkpoint carries a checksum of each array, computed at save time in the same pass that
# checks the state is finite; a restore recomputes them. Arrays in host memory (a CPU run, a
# restore read into numpy) are hashed there, from their bytes, in numpy: no compile, no copy.
# Arrays on an accelerator (or spread over processes) are hashed where they are, in one jitted
# pass. Both compute the same function of the bits (one CHECKSUM_ALGORITHM), pinned by a test.

def leaf_name(path) -> str:
  """'params/stem_conv/kernel' for a pytree path, whether the node is a dict or a dataclass."""
  parts = []
  for key in path:
    for attr in ("key", "name", "idx"):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
    else:
      parts.append(str(key))
  return "/".join(parts)
def _words(x):
  """The array's bits as uint32 words (16- and 8-bit types widened), flattened."""
  x = jnp.asarray(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32).ravel()
  bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
  return jax.lax.bitcast_convert_type(x, bits).astype(jnp.uint32).ravel()


def _fmix32(h):
  # MurmurHash3's finalizer: every input bit affects every output bit.
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _checksum(x):
  # A sum (mod 2**32) of position-salted hashes: any changed word changes the
  # sum except with probability 2**-32, and the sum is order-free, so XLA can
  # compute it as one parallel reduction.
  words = _words(x)
  salt = jnp.arange(words.size, dtype=jnp.uint32) * jnp.uint32(0x9E3779B9)
  return jnp.sum(_fmix32(words ^ salt), dtype=jnp.uint32)


@jax.jit
def _inspect_on_device(tree):
  leaves = jax.tree.leaves(tree)
  finite = [jnp.all(jnp.isfinite(x)) for x in leaves if jnp.issubdtype(x.dtype, jnp.inexact)]
  all_finite = jnp.all(jnp.stack(finite)) if finite else jnp.bool_(True)
  return all_finite, jnp.stack([_checksum(x) for x in leaves])


_HOST_CHUNK = 1 << 16  # words hashed at a time: a chunk's temporaries stay in the CPU's cache


def _host_words(x) -> np.ndarray:
  """_words in numpy: the array's bits as uint32 words, as the device computes them (its
  dtype as jax holds it: no 64-bit types unless jax_enable_x64)."""
  a = np.asarray(x)
  if a.dtype == np.bool_:
    return a.astype(np.uint32).ravel()
  a = np.ascontiguousarray(a, jax.dtypes.canonicalize_dtype(a.dtype))
  bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
  return a.view(bits).astype(np.uint32, copy=False).ravel()


def _host_checksum(x) -> int:
  """_checksum in numpy, a chunk at a time (uint32 arithmetic wraps as XLA's does)."""
  words, total = _host_words(x), 0
  for start in range(0, words.size, _HOST_CHUNK):
    h = np.arange(start, min(start + _HOST_CHUNK, words.size), dtype=np.uint32)
    h *= np.uint32(0x9E3779B9)
    h ^= words[start:start + h.size]
    h ^= h >> 16
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> 13
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> 16
    total += int(h.sum(dtype=np.uint32))
  return total & 0xFFFFFFFF


def _in_host_memory(x) -> bool:
  """Whether numpy can read `x`'s bytes where they are: a numpy value, or a jax array on CPU
  devices of this process."""
  if not isinstance(x, jax.Array):
    return True
  return x.is_fully_addressable and all(d.platform == "cpu" for d in x.sharding.device_set)


def _inspect_on_host(leaves) -> tuple[bool, list[int]]:
  arrays = [np.asarray(x) for x in leaves]
  finite = all(bool(np.isfinite(a).all()) for a in arrays if jnp.issubdtype(a.dtype, jnp.inexact))
  return finite, [_host_checksum(a) for a in arrays]


def inspect(tree) -> tuple[bool, dict, list[str]]:
  """(all floats finite, {leaf name: checksum}, names of non-finite leaves) of a pytree."""
  with_paths = jax.tree_util.tree_flatten_with_path(tree)[0]
  paths, leaves = [leaf_name(p) for p, _ in with_paths], [x for _, x in with_paths]
  if all(_in_host_memory(x) for x in leaves):
    all_finite, sums = _inspect_on_host(leaves)
  else:
    all_finite, sums = jax.device_get(_inspect_on_device(tree))
  checksums = {name: f"{int(s):08x}" for name, s in zip(paths, sums)}
  bad = []
  if not all_finite:  # rare: worth a second pass to say where
    bad = [name for name, x in zip(paths, leaves)
           if jnp.issubdtype(x.dtype, jnp.inexact) and not bool(jnp.all(jnp.isfinite(x)))]
  return bool(all_finite), checksums, bad


def verify(tree, saved: dict, step, directory) -> None:
  """Raises DamagedCheckpointError unless `tree`'s checksums equal those saved with it."""
  if saved.get("algorithm") != CHECKSUM_ALGORITHM:
    raise DamagedCheckpointError(step, directory, f"unknown checksum algorithm {saved.get('algorithm')!r}")
  _, actual, _ = inspect(tree)
  expected = saved["leaves"]
  wrong = sorted(k for k in set(actual) | set(expected) if actual.get(k) != expected.get(k))
  if wrong:
    more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
    raise DamagedCheckpointError(step, directory, f"checksum mismatch in {', '.join(wrong[:3])}{more}")


