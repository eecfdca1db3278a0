"""Data parallelism with `jax.jit` over a device mesh.

The batch is split along the `data` mesh axis; the train state is replicated.
XLA sees that the loss averages over a sharded batch and inserts the gradient
all-reduce itself (NCCL on GPUs), overlapping it with the backward pass. The
mesh is 2-D, (data, model), with model=1 today, so model parallelism can be
added without touching the data path.

In a multi-host run (started by `jaxnet/runtime.py`) every process sees all
devices of all hosts and feeds its own share of each global batch; `to_global`
assembles the pieces into one global array.
"""

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxnet.errors import InvalidValueError

DATA_AXIS = "data"
MODEL_AXIS = "model"


def make_mesh(num_devices: int = 0, devices=None) -> Mesh:
  """A (data, model=1) mesh over all devices, or the first `num_devices` of them.

  `devices` replaces jax.devices(): e.g. the devices of a GPU topology that
  `jaxnet.gpu_plan` compiles for from a machine without GPUs.
  """
  devices = list(jax.devices() if devices is None else devices)
  if num_devices:
    if num_devices > len(devices):
      raise InvalidValueError(f"asked for {num_devices} devices, only {len(devices)} available")
    devices = devices[:num_devices]
  return Mesh(np.asarray(devices).reshape(-1, 1), (DATA_AXIS, MODEL_AXIS))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def check_batch_size(global_batch_size: int, mesh: Mesh, key: str = "batch_size") -> None:
  """Raises if the batch does not split evenly over the mesh's data axis (a configuration error)."""
  devices = mesh.shape[DATA_AXIS]
  if global_batch_size % devices:
    raise InvalidValueError(
        f"{key}={global_batch_size} does not divide evenly over {devices} devices; "
        f"set --config.{key} to a multiple of {devices}")


def bn_num_groups(bn_group_size: int, mesh: Mesh) -> int:
  """`model.bn_group_size` (devices per BN group, the config's unit) -> the model's
  `bn_num_groups` (chunks of the global batch, what BatchNorm splits by); 0 = one group."""
  devices = mesh.shape[DATA_AXIS]
  if not bn_group_size:
    return 1
  # A group larger than the mesh (e.g. a 16-device recipe run on 8) cannot be
  # formed; silently falling back to global statistics would change the recipe.
  if bn_group_size < 0 or devices % bn_group_size:
    raise InvalidValueError(f"model.bn_group_size={bn_group_size} does not divide the {devices} devices "
                            f"of the mesh; use a divisor of {devices}, or 0 for statistics over the "
                            f"global batch")
  return devices // bn_group_size


def to_global(local_batch: dict, sharding: NamedSharding) -> dict:
  """This process's numpy batch -> global jax.Arrays sharded along `data`."""
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}
