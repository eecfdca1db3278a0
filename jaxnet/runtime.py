"""Process-wide jax setup shared by the command line and the Python API.

Both `python -m jaxnet.main` and `jaxnet.api.train/evaluate/restore` call
`setup()` so that a notebook run and a CLI run compile with the same XLA flags
and share one persistent compilation cache.
"""

import os

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
    from jaxnet import parallel, xla_flags
    xla_flags.apply()  # CPU workarounds for known XLA bugs of this jaxlib
    parallel.set_default_xla_flags()
    import jax
    # Persistent compilation cache: a rerun (resume, eval, the next experiment)
    # loads the compiled step instead of compiling it again.
    jax.config.update("jax_compilation_cache_dir", compilation_cache_dir())
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    _configured = True
  if distributed_config is not None and not _distributed:
    from jaxnet import parallel
    # jax.distributed.initialize may run once per process; a notebook that
    # trains twice must not call it again.
    parallel.initialize_distributed(distributed_config)
    _distributed = True
