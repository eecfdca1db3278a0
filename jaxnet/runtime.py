"""Process setup shared by the command line and the Python API: XLA flags, the
compilation cache, jax.distributed, barriers between processes, and the signals
that stop a run.

Both `python -m jaxnet.main` and `jaxnet.api.train/evaluate/restore` call
`setup()` so that a notebook run and a CLI run compile with the same XLA flags
and share one persistent compilation cache.

Multi-host runs call `initialize_distributed` (through `setup`) before anything
else touches jax: every process then sees all devices of all hosts, feeds its
own share of each global batch, and jax assembles the pieces into one global
array (`jaxnet/parallel.py`).
"""

import logging
import os
import signal
import sys

_configured = False
_distributed = False


def compilation_cache_dir() -> str:
  return os.environ.get("JAXNET_COMPILATION_CACHE") or os.path.join(
      os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "jaxnet", "xla")


def setup(distributed_config=None) -> None:
  """XLA flags, compilation cache, and (when configured) jax.distributed. Idempotent.

  The XLA flags only take effect if this runs before jax starts a backend: call
  it before the first jax computation (the CLI does so first thing).
  """
  global _configured, _distributed
  if not _configured:
    from jaxnet import xla_flags
    xla_flags.apply()  # CPU workarounds for known XLA bugs of this jaxlib
    set_default_xla_flags()
    import jax
    # Persistent compilation cache: a rerun (resume, eval, the next experiment)
    # loads the compiled step instead of compiling it again.
    jax.config.update("jax_compilation_cache_dir", compilation_cache_dir())
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    _configured = True
  if distributed_config is not None and not _distributed:
    # jax.distributed.initialize may run once per process; a notebook that
    # trains twice must not call it again.
    initialize_distributed(distributed_config)
    _distributed = True


# --- XLA flags ------------------------------------------------------------------

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
  from jaxnet import xla_flags
  if os.environ.get("JAX_PLATFORMS", "").lower() == "cpu":
    return
  if not xla_flags.installed(xla_flags.GPU_PLUGINS):
    return
  os.environ["XLA_FLAGS"] = xla_flags.merge(os.environ.get("XLA_FLAGS", ""),
                                            default_xla_flags("gpu").split())


# --- jax.distributed ------------------------------------------------------------

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
  import jax
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
  # jaxnet's own check of the other processes (peers.PeerWatch) must report before
  # jax's, which terminates the process from C++ without a usable word.
  from jaxnet import peers
  kwargs["heartbeat_timeout_seconds"] = peers.jax_heartbeat_timeout(dist_config.heartbeat_timeout_sec)
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


# --- barriers -------------------------------------------------------------------

_barrier_count = 0


def sync_processes(name: str, timeout_s: int = 3600) -> None:
  """Blocks until every process has reached this point (a no-op in one process).

  A barrier of jax.distributed's coordination service, not a device collective:
  it waits as long as `timeout_s`, whereas jax's CPU (gloo) collectives give up
  when the processes reach their first all-reduce more than ~30 s apart (e.g.
  because one of them compiled the step slower). Naming the processes is what
  makes orbax use the coordination service; without them it would run a device
  collective.
  """
  global _barrier_count
  import jax
  if jax.process_count() == 1:
    return
  from orbax.checkpoint import multihost
  _barrier_count += 1  # a barrier name must not repeat
  multihost.sync_global_processes(f"jaxnet_{_barrier_count}_{name}", timeout=timeout_s,
                                  processes=set(range(jax.process_count())))


def any_process(flag: bool) -> bool:
  """Whether `flag` is true in any process (every process must call this at the same point)."""
  import jax
  if jax.process_count() == 1:
    return bool(flag)
  import numpy as np
  from jax.experimental import multihost_utils
  return bool(np.any(multihost_utils.process_allgather(np.array(bool(flag)))))


def compile_then_sync(jitted, args, name: str) -> None:
  """Multi-process runs: compile `jitted` for `args` now, then wait for every process.

  The first execution of a step is the processes' first collective; jax's CPU
  (gloo) collectives fail if the processes arrive more than ~30 s apart, as a
  slower compile on one host makes them. Compiled here, the call that follows
  hits jit's cache.
  """
  import jax
  if jax.process_count() > 1:
    jitted.lower(*args).compile()
    sync_processes(name)


# --- signals --------------------------------------------------------------------

class StopSignals:
  """SIGTERM (preemption) and a first Ctrl-C become a flag the training loop checks between steps.

  The loop then saves a checkpoint and returns. A second Ctrl-C (or a second
  SIGTERM) exits at once without saving (the newest complete checkpoint stays intact).
  """

  def __init__(self):
    self.received = None       # "SIGTERM" or "SIGINT" once one arrived
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread (e.g. some notebook runners): no handler
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if self.received == name:
      # The loop has not reached its next stop yet (a long step, a save, a blocked write):
      # a second signal of the same kind always ends the process.
      what = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
      print(f"second {what}: exiting now without saving", file=sys.stderr, flush=True)
      os._exit(130 if signum == signal.SIGINT else 128 + signal.SIGTERM)
    self.received = name
    how = ("press Ctrl-C again to quit without saving" if signum == signal.SIGINT
           else "then exiting; a second SIGTERM exits at once without saving")
    print(f"{self.received} received: saving a checkpoint after this step ({how})",
          file=sys.stderr, flush=True)

  def __exit__(self, *exc):
    for sig, previous in self._previous.items():
      signal.signal(sig, previous)

  def should_stop(self, sync: bool) -> bool:
    """Whether to stop now. With several processes, only on `sync` steps, where all of them ask."""
    import jax
    if jax.process_count() == 1:
      return self.received is not None
    if not sync:
      return False
    # Every process must stop at the same step, or the collective save would hang.
    return any_process(self.received is not None)
