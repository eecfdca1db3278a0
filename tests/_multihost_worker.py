"""`python -m jaxnet.main ARGS` for the multi-host test, plus a record of this process's replica.

The checkpoint holds one copy of the replicated state (orbax writes each array
once, from the shard with replica_id 0, which lives on process 0), so it cannot
show whether process 1 ended with the same parameters. This wrapper runs the
real CLI unchanged and, whenever the loop saves a checkpoint, also writes this
process's own copy of the state to WORKDIR/replica_<step>_process<i>.npz.
"""

import os
import runpy
import sys

import numpy as np

from jaxnet import checkpoint


def _save_with_replica(self, step, state, *args, **kwargs):
  import jax
  flat = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    shards = [np.asarray(s.data) for s in leaf.addressable_shards]
    # Every local device must hold the same replica, not just the first one.
    for other in shards[1:]:
      np.testing.assert_array_equal(other, shards[0], err_msg=jax.tree_util.keystr(path))
    flat[jax.tree_util.keystr(path)] = shards[0]
  np.savez(os.path.join(self.workdir, f"replica_{step}_process{jax.process_index()}.npz"), **flat)
  return _original_save(self, step, state, *args, **kwargs)


_original_save = checkpoint.Checkpoints.save
checkpoint.Checkpoints.save = _save_with_replica
sys.argv = ["jaxnet.main"] + sys.argv[1:]
runpy.run_module("jaxnet.main", run_name="__main__", alter_sys=True)
