"""Test setup: 8 CPU devices (to test 8-way data parallelism), the command line's XLA flags and
a shared XLA cache.

The environment is set before jax is imported, and it is inherited by the
`python -m jaxnet.main` subprocesses that the end-to-end tests start.
"""

import atexit
import os
import shutil
import sys
import tempfile

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()
# One compilation cache for the whole session: later subprocesses that compile the
# same step load it instead of recompiling.
os.environ.setdefault("JAXNET_COMPILATION_CACHE",
                      os.path.join(tempfile.gettempdir(), "jaxnet-test-xla-cache"))
os.environ.setdefault("PYTHONUNBUFFERED", "1")
# Every training loop in the tests (in-process and CLI subprocesses) runs its
# step under jax.transfer_guard("disallow"): an implicit host<->device copy fails.
os.environ.setdefault("JAXNET_TRANSFER_GUARD", "disallow")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

# The XLA flags the command line sets (jaxnet/cli/process.py), for the tests that compute in
# this process; merged with the device count above, not replaced by it.
from jaxnet.cli import process  # noqa: E402  (after the path set-up; imports no jax)

process.apply_xla_flags()

# The core's reports (progress lines, notes) printed as the command line prints them, for the
# tests that train in this process and read what it printed.
from jaxnet.api import show_reports  # noqa: E402

show_reports()

# Shared memory: every segment this test session makes (in this process, its `python -m`
# subprocesses and their spawned Grain workers) is named with a prefix of its own, so the
# tests that check /dev/shm look at their own segments only, whatever else runs on the
# machine (another jaxnet run, another test session). Python names a SharedMemory
# `_SHM_NAME_PREFIX` + random hex (a private name of the standard library, stable since 3.8,
# used by tests only); a sitecustomize on PYTHONPATH sets it in every Python this session
# starts, this process sets its own below.
SHM_PREFIX = f"j{os.getpid() & 0xffff:04x}_"  # Python's names are 14 characters at most
_site = os.path.join(tempfile.gettempdir(), f"jaxnet-test-site-{os.getpid()}")
os.makedirs(_site, exist_ok=True)
# Removed when the session ends: the subprocesses that read it have ended by then.
atexit.register(shutil.rmtree, _site, ignore_errors=True)
with open(os.path.join(_site, "sitecustomize.py"), "w") as _f:
  _f.write("import os\n"
           "if os.environ.get('JAXNET_TEST_SHM_PREFIX'):\n"
           "  from multiprocessing import shared_memory\n"
           "  shared_memory._SHM_NAME_PREFIX = '/' + os.environ['JAXNET_TEST_SHM_PREFIX']\n")
os.environ["JAXNET_TEST_SHM_PREFIX"] = SHM_PREFIX
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_site, os.environ.get("PYTHONPATH")]))
from multiprocessing import shared_memory  # noqa: E402

shared_memory._SHM_NAME_PREFIX = "/" + SHM_PREFIX


def pytest_xdist_auto_num_workers(config):
  """`-n auto` (pyproject.toml's addopts): one test process per core, at most 4 and one per
  3 GiB of memory: each runs 8 simulated devices and starts `python -m jaxnet.main`
  subprocesses, and waits on them, so two share a 2-core machine well."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
  try:
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  except (ValueError, OSError, AttributeError):
    memory_gib = 3
  return max(1, min(cores, 4, int(memory_gib // 3)))


# --- Trained workdirs shared by the session (tests/helpers.py, SharedRuns) ------------------

@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
  """The session's SharedRuns, in a folder that every test process sees (xdist's processes each
  have a basetemp of their own under one root)."""
  from tests.helpers import SharedRuns
  base = tmp_path_factory.getbasetemp()
  root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
  root.mkdir(exist_ok=True)
  runs = SharedRuns(root)
  yield runs
  runs.check_unchanged()


@pytest.fixture(scope="session")
def digits_run(shared_runs):
  """The quick start cut to 120 steps in a one-device process (as a notebook runs it), with an
  EMA of the params (which eval, restore and export then use), evals and checkpoints at steps
  60 and 120, logs every 5: the trained classifier that tests/test_tools.py and
  tests/test_onnx_export.py read, evaluate, predict with and export."""
  from tests.helpers import run_main
  from tests.notebooks import kernel_env
  return shared_runs.made("digits", lambda workdir: run_main(
      workdir, "total_steps=120", "log_every_steps=5", "eval_every_steps=60", "checkpoint_every_steps=60",
      "ema_decay=0.9", env=kernel_env()))
