"""The three layers (docs/architecture.md): the import-linter contracts in pyproject.toml hold,
and they are what the documentation says they are."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO


def _lint_imports():
  executable = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
  if executable is None:
    pytest.fail("lint-imports is not installed: pip install -e '.[test]' installs import-linter")
  return subprocess.run([executable, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_layering_contracts_hold():
  proc = _lint_imports()
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
  kept = [line for line in proc.stdout.splitlines() if line.endswith(" KEPT")]
  assert len(kept) == 3, proc.stdout[-3000:]
  for name in ("shell -> tools -> core", "the core never imports the shell or the tools",
               "only the shell installs signal handlers"):
    assert f"{name} KEPT" in proc.stdout, name
