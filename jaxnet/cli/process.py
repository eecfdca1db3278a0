"""The process around a command: XLA flags, the compilation cache, jax.distributed, the
signals that stop a run, and one-line errors. (The workdir's lock is its gate's,
jaxnet/core/workdir.py.)

`setup()` runs first thing in a command, before anything touches jax: XLA reads XLA_FLAGS
once, when jax starts its first backend. Multi-host runs start `jax.distributed` there,
after which every process sees all devices of all hosts and feeds its own share of each
global batch (jaxnet/core/sharding.py).
"""

import contextlib
import logging
import os
import signal
import sys
import warnings

from jaxnet.core import config as config_lib
from jaxnet.core.adapters import orbax as orbax_adapter
from jaxnet.core.adapters import xla
from jaxnet.core.errors import UserError

_state = {"configured": False, "distributed": False}


def setup(distributed_config=None) -> None:
  """XLA flags, the persistent compilation cache, and (when configured) jax.distributed.
  Idempotent. The XLA flags only take effect before jax starts a backend."""
  if not _state["configured"]:
    profile = cluster_profile(distributed_config)
    apply_cluster_environment(profile)
    apply_xla_flags(profile)
    from jaxnet import api
    api.show_reports()  # the core's progress and notes, as plain lines
    import jax
    # A rerun (resume, eval, the next experiment) loads the compiled step instead of
    # compiling it again.
    jax.config.update("jax_compilation_cache_dir", compilation_cache_dir())
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    _state["configured"] = True
  if distributed_config is not None and not _state["distributed"]:
    initialize_distributed(distributed_config)  # once per process
    _state["distributed"] = True


def compilation_cache_dir() -> str:
  return os.environ.get("JAXNET_COMPILATION_CACHE") or os.path.join(
      os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "jaxnet", "xla")


# --- XLA flags ------------------------------------------------------------------

def merge_flags(current: str, defaults) -> str:
  """`current` followed by each default flag whose name `current` does not set."""
  have = {xla.flag_name(f) for f in current.split()}
  extra = [f for f in defaults if xla.flag_name(f) not in have]
  return " ".join([current.strip()] + extra).strip()


def _platforms() -> list[str]:
  return [p.strip() for p in os.environ.get("JAX_PLATFORMS", "").lower().split(",") if p.strip()]


def cluster_profile(dist_config) -> str:
  """config.distributed.cluster_profile, checked: "" (none) or a name of xla.CLUSTER_PROFILES."""
  name = str(dist_config.get("cluster_profile", "")) if dist_config is not None else ""
  if name and name not in xla.CLUSTER_PROFILES:
    raise UserError(f"distributed.cluster_profile={name!r} is not a profile: use "
                    f"{', '.join(sorted(xla.CLUSTER_PROFILES))}, or '' for none")
  return name


def apply_cluster_environment(profile: str) -> None:
  """The profile's environment variables (CUDA, NCCL), each unless the user set it; before jax
  starts, as NCCL and CUDA read them when the backend starts."""
  for key, value in (xla.CLUSTER_PROFILES[profile]["env"].items() if profile else ()):
    os.environ.setdefault(key, value)


def default_xla_flags(profile: str = "") -> list[str]:
  """jaxnet's XLA flags for this machine: the GPU flags where a GPU plugin is installed (and
  JAX_PLATFORMS does not say cpu), the YNNPACK workaround where jax computes on a CPU with
  a jaxlib that has the bug (jaxnet/core/adapters/xla.py). A cluster profile's GPU flags
  apply wherever it is asked for (they are known to every XLA, and a CPU run records them)."""
  import importlib.util
  installed = lambda modules: any(importlib.util.find_spec(m) for m in modules)
  platforms = _platforms()
  if platforms:
    on_cpu = platforms[0] == "cpu"
  else:
    on_cpu = not installed(xla.GPU_PLUGINS + ("libtpu",))
  flags = []
  if profile or (not on_cpu and installed(xla.GPU_PLUGINS)):
    flags += xla.profile_flags(profile)
  if on_cpu and xla.has_ynn_bug(xla.jaxlib_version()):
    flags.append(xla.YNN_FUSION_OFF)
  return flags


def apply_xla_flags(profile: str = "") -> None:
  """Adds `default_xla_flags(profile)` to XLA_FLAGS; a flag the user set there wins."""
  current = os.environ.get("XLA_FLAGS", "")
  merged = merge_flags(current, default_xla_flags(profile))
  if merged != current.strip():
    os.environ["XLA_FLAGS"] = merged


# --- jax.distributed ------------------------------------------------------------

def initialize_distributed(dist_config) -> None:
  """Starts `jax.distributed` when the config or the environment asks for it.

  `dist_config.enabled`: "auto" (on under Slurm with >1 task, or when a coordinator
  address is set in the config or JAX_COORDINATOR_ADDRESS), "true", "false". Settings
  left unset (address "", num_processes 0, process_id -1) are detected by jax from the
  cluster environment (Slurm, Open MPI, Kubernetes JobSets).
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
  # Cross-process collectives on the CPU backend need an implementation; without one a
  # multi-process CPU run fails at its first all-reduce. Gloo needs nothing beyond jax's
  # own distributed client. Only the CPU client reads this option (GPUs use NCCL), and a
  # user's explicit choice (e.g. "mpi") is kept.
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  # jaxnet's heartbeat (heartbeat.py) must report a lost process before jax's own, which
  # terminates the process from C++ without a usable word.
  from jaxnet.cli import heartbeat
  kwargs["heartbeat_timeout_seconds"] = heartbeat.jax_heartbeat_timeout(dist_config.heartbeat_timeout_sec)
  jax.distributed.initialize(**kwargs)
  logging.info("jax.distributed: process %d of %d, %d local / %d global devices",
               jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())


def slurm_process_per_node_device_ids() -> list[int] | None:
  """All of a node's GPUs when Slurm runs one task per node, else None (jax's default).

  jax's Slurm detection assumes one process per GPU and gives process k of a node only
  GPU k (SLURM_LOCALID). With one process per node that silently trains on one GPU per
  node, so in that layout we hand it every GPU Slurm allocated (CUDA_VISIBLE_DEVICES
  numbering, which starts at 0 in the process).
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


# --- signals --------------------------------------------------------------------

class StopSignals:
  """SIGTERM (preemption) and a first Ctrl-C become a flag the training loop checks between
  steps (`requested`, for core.train.RunControl): the loop then saves a checkpoint and
  returns. A second Ctrl-C (or a second SIGTERM) exits at once without saving (the newest
  complete checkpoint stays intact)."""

  def __init__(self):
    self.received = None       # "SIGTERM" or "SIGINT" once one arrived
    self._previous = {}

  def requested(self) -> bool:
    return self.received is not None

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


# --- the command line -------------------------------------------------------------

def split_command_line(argv: list[str]) -> tuple[list[str], dict]:
  """Takes `--config.KEY=VALUE` (or `--config.KEY VALUE`) out of argv: (rest, {KEY: VALUE})."""
  rest, overrides, i = [], {}, 0
  while i < len(argv):
    arg = argv[i]
    if arg.startswith("--config."):
      key, has_value, value = arg[len("--config."):].partition("=")
      if not has_value:
        if i + 1 >= len(argv):
          raise config_lib.ConfigOverrideError(f"{arg} needs a value: {arg}=VALUE")
        value, i = argv[i + 1], i + 1
      overrides[key] = value
    else:
      rest.append(arg)
    i += 1
  return rest, overrides


# --- one-line errors ----------------------------------------------------------------

@contextlib.contextmanager
def one_line_errors(*also):
  """A UserError (jaxnet explaining a problem), or a type in `also`, is printed as one line
  on stderr and exits with status 1. Every other exception (a bug, a shape error in a
  model) keeps its traceback. JAXNET_DEBUG=1 lets the exception through, with its
  traceback. Also quiets the tracebacks libraries print for a failure already reported in
  one line."""
  quiet_reported_failures()
  try:
    yield
  except (UserError, *also) as e:
    if os.environ.get("JAXNET_DEBUG"):
      raise
    print(f"error: {e}", file=sys.stderr)
    print("(set JAXNET_DEBUG=1 to see the traceback)", file=sys.stderr, flush=True)
    if getattr(e, "noisy_teardown", False):
      # Background threads of the failed operation may still print tracebacks while
      # the interpreter shuts down; the line above already said what happened.
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
    sys.exit(1)


class _DropReportedNoise(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return not orbax_adapter.is_reported_noise(record)


def quiet_reported_failures() -> None:
  """Installs, once per process (not with JAXNET_DEBUG=1), filters for what orbax, asyncio and
  Python would print again about a failed save or read that jaxnet reports in one line: log
  records (orbax_adapter.is_reported_noise), uncaught and unraisable exceptions."""
  if os.environ.get("JAXNET_DEBUG") or _state.get("quiet"):
    return
  _state["quiet"] = True
  for name in ("absl", "asyncio"):
    logging.getLogger(name).addFilter(_DropReportedNoise())
  warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
  previous_hook, previous_unraisable = sys.excepthook, sys.unraisablehook

  def excepthook(exc_type, exc, tb):
    if not orbax_adapter.is_reported_exception(exc_type, exc):
      previous_hook(exc_type, exc, tb)

  def unraisablehook(unraisable):
    if not orbax_adapter.is_reported_exception(unraisable.exc_type, unraisable.exc_value):
      previous_unraisable(unraisable)
  sys.excepthook, sys.unraisablehook = excepthook, unraisablehook
