"""Data parallelism with `jax.jit` over a device mesh.

The mesh is 2-D, (data, fsdp): the batch is split over all its devices, and
the train state is replicated over `data` and, with config.mesh.fsdp, split over
`fsdp` (jaxnet/fsdp.py). Without FSDP the mesh is (devices, 1): every device
holds the whole state, and XLA, seeing that the loss averages over a sharded
batch, inserts the gradient all-reduce itself (NCCL on GPUs), overlapping it
with the backward pass. FSDP over all devices is (1, devices); over groups of k
devices (e.g. one host's, on NVLink) it is (devices / k, k): the state is split
within a group and replicated across groups.

In a multi-host run (started by `jaxnet/runtime.py`) every process sees all
devices of all hosts and feeds its own share of each global batch; `to_global`
assembles the pieces into one global array.
"""

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxnet.errors import InvalidValueError

DATA_AXIS = "data"
FSDP_AXIS = "fsdp"
BATCH_AXES = (DATA_AXIS, FSDP_AXIS)  # the batch is split over every device of the mesh


def make_mesh(num_devices: int = 0, devices=None, fsdp: bool = False, fsdp_devices: int = 0) -> Mesh:
  """A (data, fsdp) mesh over all devices, or the first `num_devices` of them.

  fsdp off: (devices, 1); on: (devices / fsdp_devices, fsdp_devices), where
  fsdp_devices 0 means all of them. `devices` replaces jax.devices(): e.g. the
  devices of a GPU topology that `jaxnet.gpu_plan` compiles for from a machine
  without GPUs.
  """
  devices = list(jax.devices() if devices is None else devices)
  if num_devices:
    if num_devices > len(devices):
      raise InvalidValueError(f"asked for {num_devices} devices, only {len(devices)} available")
    devices = devices[:num_devices]
  if fsdp_devices and not fsdp:
    raise InvalidValueError(f"mesh.fsdp_devices={fsdp_devices} applies to FSDP: add --config.mesh.fsdp=True, "
                            f"or leave mesh.fsdp_devices at 0")
  group = (fsdp_devices or len(devices)) if fsdp else 1
  if group < 0 or len(devices) % group:
    raise InvalidValueError(f"mesh.fsdp_devices={fsdp_devices} does not divide the {len(devices)} devices; "
                            f"use a divisor of {len(devices)}, or 0 to shard over all of them")
  # Row-major: a group is consecutive devices, which jax orders host by host.
  return Mesh(np.asarray(devices).reshape(-1, group), (DATA_AXIS, FSDP_AXIS))


def batch_devices(mesh: Mesh) -> int:
  """How many devices the batch is split over: all of the mesh's."""
  return mesh.devices.size


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def check_batch_size(global_batch_size: int, mesh: Mesh, key: str = "batch_size") -> None:
  """Raises if the batch does not split evenly over the mesh's devices (a configuration error)."""
  devices = batch_devices(mesh)
  if global_batch_size % devices:
    raise InvalidValueError(
        f"{key}={global_batch_size} does not divide evenly over {devices} devices; "
        f"set --config.{key} to a multiple of {devices}")


def bn_num_groups(bn_group_size: int, mesh: Mesh) -> int:
  """`model.bn_group_size` (devices per BN group, the config's unit) -> the model's
  `bn_num_groups` (chunks of the global batch, what BatchNorm splits by); 0 = one group."""
  devices = batch_devices(mesh)
  if not bn_group_size:
    return 1
  # A group larger than the mesh (e.g. a 16-device recipe run on 8) cannot be
  # formed; silently falling back to global statistics would change the recipe.
  if bn_group_size < 0 or devices % bn_group_size:
    raise InvalidValueError(f"model.bn_group_size={bn_group_size} does not divide the {devices} devices "
                            f"of the mesh; use a divisor of {devices}, or 0 for statistics over the "
                            f"global batch")
  return devices // bn_group_size


def abstract(tree, shardings):
  """ShapeDtypeStructs with shardings: e.g. a restore target that allocates nothing."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def to_global(local_batch: dict, sharding: NamedSharding) -> dict:
  """This process's numpy batch -> global jax.Arrays sharded over the mesh's devices."""
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}
