"""XLA_FLAGS for this process: jaxnet's defaults, merged under the user's own flags.

XLA reads XLA_FLAGS once, when jax starts its first backend, so `apply()` has to
run before the first jax computation: runtime.setup() calls it for the command
line and the Python API, tests/conftest.py for the test process. A flag that
XLA_FLAGS already sets wins over jaxnet's value for that flag; any other flag
there (a device count, say) leaves jaxnet's defaults in place.

This module imports no jax (it runs before jax starts).
"""

import importlib.metadata
import importlib.util
import mmap
import os
import re

# XLA:CPU's YNNPACK fusion in jaxlib 0.11.2 to 0.12.0.1 computes a bf16
# relu -> matmul -> relu -> sum, fused into one kernel, as inf/NaN. Every
# eval-mode ResNet contains that chain (batch norm is elementwise in eval mode;
# the global average pool is the sum), so bf16 evaluations on a CPU came out
# NaN while training looked fine. jaxlib 0.10.0, 0.10.2, 0.11.0 and 0.11.1
# compute it correctly. The empty fusion list turns YNNPACK fusion off; the standalone
# reproduction is in docs/models.md. When a jaxlib release fixes it, set
# YNN_BUG_FIXED_IN to that version: tests/test_xla_flags.py fails for a jaxlib in
# the range below that computes the reproduction right without the flag.
YNN_FUSION_OFF = "--xla_cpu_experimental_ynn_fusion_type="
YNN_BUG_SINCE = (0, 11, 2)
YNN_BUG_FIXED_IN = None

GPU_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")


def flag_name(flag: str) -> str:
  """'--xla_foo=1' -> 'xla_foo'."""
  return flag.lstrip("-").split("=", 1)[0]


def merge(current: str, defaults) -> str:
  """`current` followed by each default flag whose name `current` does not set."""
  have = {flag_name(f) for f in current.split()}
  extra = [f for f in defaults if flag_name(f) not in have]
  return " ".join([current.strip()] + extra).strip()


def version_tuple(version: str) -> tuple:
  """'0.12.0.1' -> (0, 12, 0, 1); '0.13.0.dev20260101' -> (0, 13, 0)."""
  return tuple(int(p) for p in re.match(r"\d+(?:\.\d+)*", version).group(0).split("."))


def jaxlib_version() -> tuple | None:
  try:
    return version_tuple(importlib.metadata.version("jaxlib"))
  except importlib.metadata.PackageNotFoundError:
    return None


def has_ynn_bug(version: tuple | None) -> bool:
  """Whether jaxlib `version` is one whose YNNPACK fusion miscomputes bf16 (see above)."""
  return (version is not None and version >= YNN_BUG_SINCE
          and (YNN_BUG_FIXED_IN is None or version < YNN_BUG_FIXED_IN))


def jaxlib_defines_flag(name: str) -> bool:
  """Whether the installed jaxlib's XLA has the flag `name`.

  An unknown flag in XLA_FLAGS makes XLA abort the process, so a flag is only
  added when its name is compiled into jaxlib's native library (a ~10 ms scan).
  """
  spec = importlib.util.find_spec("jaxlib")
  if spec is None or not spec.submodule_search_locations:
    return False
  root = list(spec.submodule_search_locations)[0]
  libraries = sorted((f for f in os.listdir(root) if f.endswith(".so")),
                     key=lambda f: f != "libjax_common.so")  # where jaxlib 0.10-0.12 keep XLA
  for library in libraries:
    with open(os.path.join(root, library), "rb") as f:
      try:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
          if data.find(name.encode()) >= 0:
            return True
      except ValueError:  # an empty file cannot be mapped
        continue
  return False


def installed(modules) -> bool:
  return any(importlib.util.find_spec(m) for m in modules)


def cpu_is_default_backend() -> bool:
  """Whether jax will compute on the CPU: JAX_PLATFORMS starts with cpu, or no GPU/TPU plugin."""
  platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
  if platforms:
    return platforms.split(",")[0].strip() == "cpu"
  return not installed(GPU_PLUGINS + ("libtpu",))


def cpu_defaults() -> list:
  """The CPU workarounds this jaxlib needs (none on a GPU/TPU machine)."""
  if (cpu_is_default_backend() and has_ynn_bug(jaxlib_version())
      and jaxlib_defines_flag(flag_name(YNN_FUSION_OFF))):
    return [YNN_FUSION_OFF]
  return []


def apply() -> None:
  """Adds `cpu_defaults()` to XLA_FLAGS, leaving flags the user set. Run before jax starts."""
  current = os.environ.get("XLA_FLAGS", "")
  merged = merge(current, cpu_defaults())
  if merged != current.strip():
    os.environ["XLA_FLAGS"] = merged


def ynn_hint(precision: str, platform: str) -> str:
  """For an error about a non-finite bf16 CPU result: the YNNPACK bug, if it can be the cause."""
  active = {flag_name(f): f for f in os.environ.get("XLA_FLAGS", "").split()}
  if (precision != "bf16" or platform != "cpu" or not has_ynn_bug(jaxlib_version())
      or active.get(flag_name(YNN_FUSION_OFF)) == YNN_FUSION_OFF):
    return ""
  return (f"This jaxlib's XLA:CPU YNNPACK fusion computes some bf16 results as NaN (docs/models.md): "
          f"start the process with XLA_FLAGS={YNN_FUSION_OFF} (jaxnet sets it unless XLA_FLAGS "
          f"already sets that flag or jax started before jaxnet.runtime.setup). ")
