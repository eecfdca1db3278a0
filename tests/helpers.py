"""Shared helpers for tests that run the command line."""

import fcntl
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_main(workdir, *overrides, config="configs/digits.py", mode="train", env=None,
             check=True, timeout=600, python_prefix=(), flags=()):
  """Runs `python -m jaxnet.main` in a subprocess; returns the CompletedProcess.

  `overrides` are config keys (`"total_steps=20"`); `flags` other flags, whole.
  """
  cmd = [sys.executable, *python_prefix]
  if not python_prefix:
    cmd += ["-m", "jaxnet.main"]
  cmd += [f"--config={config}", f"--workdir={workdir}", f"--mode={mode}",
          *flags, *[f"--config.{o}" for o in overrides]]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, **(env or {})})
  if check and proc.returncode != 0:
    raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
                         f"\n--- stderr\n{proc.stderr[-6000:]}")
  return proc


def max_abs_diff(a, b) -> float:
  """Largest absolute difference between two pytrees of arrays with the same structure."""
  import jax
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             for x, y in zip(la, lb))


# --- Trained workdirs, one training each per session ----------------------------------------
# Training is what the suite spends its time on, and most tests only read or evaluate a trained
# workdir. Each run below is trained once per session, by the first test process that asks for
# it (pytest-xdist's other processes wait on its lock and then share it); a test that writes
# into a run takes a copy (`copy_run`: a directory copy costs milliseconds, a training tens of
# seconds). At the end of the session each run is checked unchanged, so a test that wrote into
# a shared run instead of its copy fails the session rather than changing what other tests see.

def _tree_listing(root: pathlib.Path) -> dict:
  """{relative path: [size, modification time]} of every file under `root`."""
  listing = {}
  for dirpath, _, filenames in os.walk(root):
    for name in filenames:
      st = os.lstat(os.path.join(dirpath, name))
      listing[os.path.relpath(os.path.join(dirpath, name), root)] = [st.st_size, st.st_mtime_ns]
  return listing


class SharedRuns:
  """Makes each named run once per session (see above); `made(name, make)` returns its path."""

  def __init__(self, root: pathlib.Path):
    self.root, self.listings = root, {}

  def made(self, name: str, make) -> pathlib.Path:
    out = self.root / name
    done = self.root / f"{name}.done"
    with open(self.root / f"{name}.lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)  # held until this process has it or has made it
      if not done.exists():  # never made, or an earlier attempt failed: (re)make it
        if out.exists():
          shutil.rmtree(out)
        make(out)
        done.write_text(json.dumps(_tree_listing(out)))
    self.listings[name] = json.loads(done.read_text())
    return out

  def check_unchanged(self):
    for name, before in self.listings.items():
      now = _tree_listing(self.root / name)
      changed = sorted(p for p in before.keys() | now.keys() if before.get(p) != now.get(p))
      assert not changed, (f"a test wrote into the shared run {name!r} ({', '.join(changed[:5])}): a test "
                           "that writes takes copy_run(run, tmp_path)")


def copy_run(run: pathlib.Path, tmp_path: pathlib.Path, name: str = "w") -> pathlib.Path:
  """A copy of a shared run for a test that writes into it."""
  return pathlib.Path(shutil.copytree(run, tmp_path / name, symlinks=True))
