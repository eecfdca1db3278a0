"""Shared helpers for tests that run the command line."""

import os
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
