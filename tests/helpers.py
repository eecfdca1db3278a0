"""Shared helpers for tests that run the command line."""

import fcntl
import hashlib
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

def _tree_digest(root: pathlib.Path) -> str:
  """Names, sizes and modification times of every file under `root`."""
  h = hashlib.sha256()
  for dirpath, dirnames, filenames in sorted(os.walk(root)):
    dirnames.sort()
    for name in sorted(filenames):
      path = os.path.join(dirpath, name)
      st = os.lstat(path)
      h.update(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
  return h.hexdigest()


class SharedRuns:
  """Makes each named run once per session (see above); `made(name, make)` returns its path."""

  def __init__(self, root: pathlib.Path):
    self.root, self.digests = root, {}

  def made(self, name: str, make) -> pathlib.Path:
    out = self.root / name
    done = self.root / f"{name}.done"
    with open(self.root / f"{name}.lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)  # held until this process has it or has made it
      if not done.exists():  # never made, or an earlier attempt failed: (re)make it
        if out.exists():
          shutil.rmtree(out)
        make(out)
        done.write_text(_tree_digest(out))
    self.digests[name] = done.read_text()
    return out

  def check_unchanged(self):
    changed = [n for n, d in self.digests.items() if _tree_digest(self.root / n) != d]
    assert not changed, (f"a test wrote into the shared run(s) {changed}: a test that writes takes "
                         "copy_run(run, tmp_path)")


def copy_run(run: pathlib.Path, tmp_path: pathlib.Path, name: str = "w") -> pathlib.Path:
  """A copy of a shared run for a test that writes into it."""
  return pathlib.Path(shutil.copytree(run, tmp_path / name, symlinks=True))
