"""`python -m jaxnet.main ARGS` for the multi-host tests, plus a record of this process's replica.

The checkpoint holds one copy of the replicated state (orbax writes each array
once, from the shard with replica_id 0, which lives on process 0), so it cannot
show whether process 1 ended with the same parameters. This wrapper runs the
real CLI unchanged and, whenever the loop saves a checkpoint, also writes this
process's own copy of the replicated arrays of the state to
WORKDIR/replica_<step>_process<i>.npz (arrays FSDP splits are in the checkpoint).

Each process lists the data identities it computes in WORKDIR/identity_calls_process<i>.

With JAXNET_TEST_SIGTERM=P:S, process P sends itself SIGTERM once step S is done,
as a scheduler preempting one host would; the other process gets no signal.

Once jax.distributed is up it writes WORKDIR/devices_process<i>.json: what jax.distributed resolved for this
process (its index and count, the GPUs it would use, its local devices), which the launch
tests compare with what a Slurm or Kubernetes layout should give.
"""

import json
import os
import runpy
import signal
import sys

import numpy as np

from jaxnet.cli import process
from jaxnet.core import checkpoint
from jaxnet.core import train as train_lib


def _save_with_replica(self, step, state, *args, **kwargs):
  import jax
  flat = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    if not leaf.sharding.is_fully_replicated:  # FSDP: each device holds its own part
      continue
    shards = [np.asarray(s.data) for s in leaf.addressable_shards]
    # Every local device must hold the same replica, not just the first one.
    for other in shards[1:]:
      np.testing.assert_array_equal(other, shards[0], err_msg=jax.tree_util.keystr(path))
    flat[jax.tree_util.keystr(path)] = shards[0]
  np.savez(os.path.join(self.workdir, f"replica_{step}_process{jax.process_index()}.npz"), **flat)
  return _original_save(self, step, state, *args, **kwargs)


def _sigterm_after(process: int, step: int) -> None:
  """Process `process` signals itself when the loop asks whether to stop after `step`.

  The loop asks once per step, from the step it resumed at (recorded here from
  Checkpoints.restore_newest), so the n-th question follows step start + n.
  """
  import jax
  original_stop, original_restore = train_lib._should_stop, checkpoint.Checkpoints.restore_newest
  current = [0]

  def restore_newest(self, *args, **kwargs):
    state, start = original_restore(self, *args, **kwargs)
    current[0] = start or 0
    return state, start

  def should_stop(control, sync):
    current[0] += 1
    if current[0] == step and jax.process_index() == process:
      os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the line below
    return original_stop(control, sync)

  checkpoint.Checkpoints.restore_newest = restore_newest
  train_lib._should_stop = should_stop


def _initialize_and_record(dist_config) -> None:
  import jax
  _original_initialize(dist_config)
  workdir = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--workdir="))
  os.makedirs(workdir, exist_ok=True)
  record = dict(process_index=jax.process_index(), process_count=jax.process_count(),
                gpus=jax.config.values["jax_cuda_visible_devices"], local_devices=jax.local_device_count(),
                devices=jax.device_count())
  with open(os.path.join(workdir, f"devices_process{jax.process_index()}.json"), "w") as f:
    json.dump(record, f)


def _record_identity_calls() -> None:
  """Appends a line to WORKDIR/identity_calls_process<i> each time this process computes a
  source's identity: only process 0 should (the others would hash the same folder again)."""
  import jax
  from jaxnet.core import provenance
  original = provenance.identity_of
  workdir = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--workdir="))

  def identity_of(source, *kind):
    with open(os.path.join(workdir, f"identity_calls_process{jax.process_index()}"), "a") as f:
      f.write(f"{type(source).__name__}\n")
    return original(source, *kind)

  provenance.identity_of = identity_of


_record_identity_calls()
_original_initialize = process.initialize_distributed
process.initialize_distributed = _initialize_and_record
_original_save = checkpoint.Checkpoints.save
checkpoint.Checkpoints.save = _save_with_replica
if os.environ.get("JAXNET_TEST_SIGTERM"):
  _sigterm_after(*map(int, os.environ["JAXNET_TEST_SIGTERM"].split(":")))
sys.argv = ["jaxnet.main"] + sys.argv[1:]
runpy.run_module("jaxnet.main", run_name="__main__", alter_sys=True)
