"""Data parallelism with `jax.jit` over a device mesh.

The batch is split along the `data` mesh axis; the train state is replicated.
XLA sees that the loss averages over a sharded batch and inserts the gradient
all-reduce itself (NCCL on GPUs), overlapping it with the backward pass. The
mesh is 2-D, (data, model), with model=1 today, so model parallelism can be
added without touching the data path.

Multi-host runs call `initialize_distributed` before anything else touches jax:
every process then sees all devices of all hosts, feeds its own share of each
global batch, and jax assembles the pieces into one global array.
"""

import logging
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxnet import xla_flags

DATA_AXIS = "data"
MODEL_AXIS = "model"


def initialize_distributed(dist_config) -> None:
  """Starts `jax.distributed` when the config or the environment asks for it.

  `dist_config.enabled`: "auto" (on under Slurm with >1 task, or when a
  coordinator address is set in the config or JAX_COORDINATOR_ADDRESS), "true", "false".
  Settings left unset (address "", num_processes 0, process_id -1) are detected
  by jax from the cluster environment (Slurm, Open MPI, Kubernetes JobSets).
  """
  mode = str(dist_config.enabled).lower()
  if mode in ("false", "0", "no", "off"):
    return
  slurm_multi = int(os.environ.get("SLURM_NTASKS", "1")) > 1
  explicit = dist_config.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if mode == "auto" and not (slurm_multi or explicit):
    return
  kwargs = {}
  if dist_config.coordinator_address:
    kwargs["coordinator_address"] = dist_config.coordinator_address
  if dist_config.num_processes > 0:
    kwargs["num_processes"] = dist_config.num_processes
  if dist_config.process_id >= 0:
    kwargs["process_id"] = dist_config.process_id
  if dist_config.local_device_ids:
    kwargs["local_device_ids"] = [int(i) for i in str(dist_config.local_device_ids).split(",")]
  elif (ids := slurm_process_per_node_device_ids()) is not None:
    kwargs["local_device_ids"] = ids
  # Cross-process collectives on the CPU backend need an implementation; without
  # one a multi-process CPU run fails at its first all-reduce. Gloo needs nothing
  # beyond jax's own distributed client. Only the CPU client reads this option
  # (GPUs use NCCL), and a user's explicit choice (e.g. "mpi") is kept.
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**kwargs)
  logging.info("jax.distributed: process %d of %d, %d local / %d global devices",
               jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())


def slurm_process_per_node_device_ids() -> list[int] | None:
  """All of a node's GPUs when Slurm runs one task per node, else None (jax's default).

  jax's Slurm detection assumes one process per GPU and gives process k of a
  node only GPU k (SLURM_LOCALID). With one process per node that silently
  trains on one GPU per node, so in that layout we hand it every GPU Slurm
  allocated (CUDA_VISIBLE_DEVICES numbering, which starts at 0 in the process).
  """
  env = os.environ
  if "SLURM_JOB_ID" not in env or "SLURM_LOCALID" not in env:
    return None
  tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
  nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")
  if not tasks or not nodes or int(tasks) != int(nodes):
    return None
  visible = env.get("CUDA_VISIBLE_DEVICES", "")
  if visible and visible != "NoDevFiles":
    count = len([d for d in visible.split(",") if d.strip()])
  elif env.get("SLURM_GPUS_ON_NODE", "").isdigit():
    count = int(env["SLURM_GPUS_ON_NODE"])
  else:
    return None  # no GPUs allocated through Slurm (e.g. a CPU job): nothing to restrict
  return list(range(count)) if count else None


_barrier_count = 0


def sync_processes(name: str, timeout_s: int = 3600) -> None:
  """Blocks until every process has reached this point (a no-op in one process).

  A barrier of jax.distributed's coordination service, not a device
  collective: it waits as long as `timeout_s`, whereas jax's CPU (gloo)
  collectives give up when the processes reach their first all-reduce more
  than ~30 s apart (e.g. because one of them compiled the step slower).
  """
  global _barrier_count
  if jax.process_count() == 1:
    return
  from jax._src import distributed  # the client orbax's barriers use too; no public handle
  _barrier_count += 1  # barrier ids must not repeat
  distributed.global_state.client.wait_at_barrier(f"jaxnet_{_barrier_count}_{name}",
                                                  timeout_in_ms=timeout_s * 1000)


def make_mesh(num_devices: int = 0) -> Mesh:
  """A (data, model=1) mesh over all devices, or the first `num_devices` of them."""
  devices = jax.devices()
  if num_devices:
    if num_devices > len(devices):
      raise ValueError(f"asked for {num_devices} devices, only {len(devices)} available")
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
    raise ValueError(
        f"{key}={global_batch_size} does not divide evenly over {devices} devices; "
        f"set --config.{key} to a multiple of {devices}")


def bn_num_groups(bn_group_size: int, mesh: Mesh) -> int:
  """Number of batch-norm groups for statistics over `bn_group_size` devices (0 = all)."""
  devices = mesh.shape[DATA_AXIS]
  if not bn_group_size:
    return 1
  # A group larger than the mesh (e.g. a 16-device recipe run on 8) cannot be
  # formed; silently falling back to global statistics would change the recipe.
  if bn_group_size < 0 or devices % bn_group_size:
    raise ValueError(f"model.bn_group_size={bn_group_size} does not divide the {devices} devices "
                     f"of the mesh; use a divisor of {devices}, or 0 for statistics over the "
                     f"global batch")
  return devices // bn_group_size


def to_global(local_batch: dict, sharding: NamedSharding) -> dict:
  """This process's numpy batch -> global jax.Arrays sharded along `data`."""
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}


def default_xla_flags(platform: str) -> str:
  """XLA flags that help multi-GPU data parallelism (documented defaults; never on CPU).

  The latency-hiding scheduler overlaps gradient all-reduces with the backward
  pass; combining all-reduces into larger buffers amortises NCCL launch cost.
  """
  if platform != "gpu":
    return ""
  return ("--xla_gpu_enable_latency_hiding_scheduler=true "
          "--xla_gpu_all_reduce_combine_threshold_bytes=134217728")


def set_default_xla_flags() -> None:
  """Appends `default_xla_flags` to XLA_FLAGS when a GPU backend is installed.

  A flag the user already set in XLA_FLAGS wins. Must run before jax starts a backend.
  """
  if os.environ.get("JAX_PLATFORMS", "").lower() == "cpu":
    return
  if not xla_flags.installed(xla_flags.GPU_PLUGINS):
    return
  os.environ["XLA_FLAGS"] = xla_flags.merge(os.environ.get("XLA_FLAGS", ""),
                                            default_xla_flags("gpu").split())
