"""Runs a notebook top to bottom in a fresh kernel (nbclient), as the notebook tests do."""

import os
import re

import nbformat
from nbclient import NotebookClient

from tests.helpers import REPO


def kernel_env(**extra) -> dict:
  """The test environment for a kernel, on one CPU device.

  conftest.py forces 8 CPU devices for the data-parallel tests; the notebooks
  are what a user runs on one device (a laptop, Colab), and compile faster there.
  PYTHONPATH puts this checkout's jaxnet first, ahead of any installed copy.
  """
  env = dict(os.environ)
  env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                            env.get("XLA_FLAGS", "")).strip()
  env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in [env.get("PYTHONPATH")] if p])
  env.update({k: str(v) for k, v in extra.items()})
  return env


def run_notebook(name: str, timeout: int = 300, **env):
  """Executes notebooks/NAME from the repository root; returns the executed notebook.

  A failing cell (an assertion in the notebook) raises nbclient's CellExecutionError.
  """
  nb = nbformat.read(os.path.join(REPO, "notebooks", name), as_version=4)
  client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                          resources={"metadata": {"path": REPO}})
  client.execute(env=kernel_env(**env))
  return nb


def outputs_text(nb) -> str:
  """All text the notebook printed or returned, for checks on what it showed."""
  parts = []
  for cell in nb.cells:
    for out in cell.get("outputs", []):
      if "text" in out:
        parts.append(out["text"])
      parts.append(out.get("data", {}).get("text/plain", ""))
  return "\n".join(parts)
