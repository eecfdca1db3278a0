"""Whether a checkpoint fits this run: the tree its train state is read into, and a clear
error naming the arrays that differ when it holds another model or optimizer, or a data
position saved by another number of processes."""

import glob
import os
import re

import jax

from jaxnet import state as state_lib
from jaxnet.errors import UserError
from jaxnet.integrity import leaf_name


class CheckpointMismatchError(UserError):
  """A checkpoint is intact but holds a different model or optimizer than this run builds."""


def _shapes(tree) -> dict:
  return {leaf_name(p): tuple(x.shape) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def restore_target(saved_tree, abstract_state, step_dir: str):
  """The abstract state to read the checkpoint whose saved tree (orbax's metadata) is
  `saved_tree` into: this run's, with the EMA field as the checkpoint has it.

  Raises CheckpointMismatchError naming the arrays whose names or shapes differ.
  """
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


def check_iterator_processes(iterator_dir: str, process_count: int, workdir: str) -> None:
  """Raises CheckpointMismatchError when the data iterator's position in `iterator_dir` was
  saved by another number of processes than `process_count`.

  Each process saves its own position in its own shard of the data (Grain's
  process_I-of-N.json), so the position has no meaning for another process count (the
  device count per process may change: the shards stay the same). Without this check Grain
  reports a missing file, which would make an intact checkpoint look damaged.
  """
  saved = {int(m.group(1)) for f in glob.glob(os.path.join(iterator_dir, "process_*-of-*.json"))
           if (m := re.search(r"-of-(\d+)\.json$", f))}
  if saved and process_count not in saved:
    n = max(saved)
    raise CheckpointMismatchError(
        f"the data position in {iterator_dir} was saved by {n} process(es), each in its own shard "
        f"of the data; this run has {process_count}. Resume with {n} process(es) (any number of "
        f"devices each), or start a new --workdir from these weights with "
        f"--config.init.weights={workdir}")
