"""The three layers (docs/architecture.md): the import-linter contracts in pyproject.toml hold,
and they are what the documentation says they are."""

import os
import re
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
  assert len(kept) == 4, proc.stdout[-3000:]
  for name in ("shell -> tools -> core", "the core never imports the shell or the tools",
               "only jaxnet.core.tasks imports a task's module", "only the shell installs signal handlers"):
    assert f"{name} KEPT" in proc.stdout, name


def _sources(root="jaxnet"):
  """{path relative to the repository: text} of every Python file under jaxnet/."""
  out = {}
  for folder, _, files in os.walk(os.path.join(REPO, root)):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        out[os.path.relpath(path, REPO)] = open(path).read()
  return out


# What deciding "is this a detector?" looks like in code: comparing a task's or a model's name,
# a detection attribute or class looked for, a detection source's duck type.
TASK_BRANCH = re.compile(
    r"""(==|!=|\bin)\s*\(?\s*["'](detection|classification)["']"""  # task == "detection"
    r"""|["'](detection|classification)["']\s*(==|!=)"""
    r"""|\bmodels\.task\("""                                         # the registry's key, read
    r"""|\bTASK\b(?!\s*=)"""                                         # a model's TASK, read
    r"""|isinstance\([^)]*\b(Detector|Predictor)\b"""                # which predictor it is
    r"""|hasattr\([^)]*["']transform["']"""                          # a detection source's duck type
    r"""|data\.source\s*==\s*["']coco["']""")


def task_branches(sources: dict) -> list[str]:
  """'path:line: text' of each place outside jaxnet/core/tasks/ that branches on the task."""
  found = []
  for path, text in sources.items():
    if path.startswith(os.path.join("jaxnet", "core", "tasks") + os.sep):
      continue
    for i, line in enumerate(text.splitlines(), 1):
      code = line.split("#", 1)[0]
      if TASK_BRANCH.search(code):
        found.append(f"{path}:{i}: {line.strip()}")
  return found


def test_no_file_outside_the_tasks_branches_on_the_task():
  """Tasks are plug-ins (jaxnet/core/tasks): every other module asks the task object, never
  compares names. The registry's own lookup (models.task, read by tasks.for_model) is the one
  place a model's task name is read."""
  found = [re.sub(r":\d+:", ":", line) for line in task_branches(_sources())]
  assert found == ['jaxnet/core/models/__init__.py: return getattr(cls, "TASK", "classification")'], \
      "\n".join(found)


def test_the_branch_finder_finds_a_branch_added_outside_the_tasks():
  sources = {"jaxnet/core/train.py": 'if exp.task.name == "detection":\n  pass\n',
             "jaxnet/tools/export.py": "x = isinstance(model, Detector)\n",
             "jaxnet/core/tasks/detection.py": 'if name == "detection": pass\n'}
  assert task_branches(sources) == ['jaxnet/core/train.py:1: if exp.task.name == "detection":',
                                    "jaxnet/tools/export.py:1: x = isinstance(model, Detector)"]


# The functions and classes that write a workdir's files (write_run_info: environment.json,
# classes.json, code.diff; the gate's own methods: data_identity.json, config_file.py). Only the
# gate (jaxnet/core/workdir.py, class Workdir) calls them; they are defined in metrics.py,
# checkpoint.py and workdir.py.
WORKDIR_WRITERS = re.compile(
    r"(?<!gate\.)\b(record_config|write_run_info|drop_records_after|record_eval_with_changes|"
    r"record_data_changes|MetricWriter)\("
    r"|\bCheckpoints\((?![^)]*read_only=True)")  # gate.NAME(...): the gate's own methods


def workdir_writers(sources: dict) -> list[str]:
  found = []
  for path, text in sources.items():
    for i, line in enumerate(text.splitlines(), 1):
      code = line.split("#", 1)[0]
      if WORKDIR_WRITERS.search(code) and not re.match(r"\s*(def|class)\s", code):
        found.append(path)
  return sorted(set(found))


def test_only_the_workdir_gate_writes_a_workdirs_files():
  """Training, an eval's record and the weights import write through one object that took the
  lock and checked the config first (workdir.Workdir); no other module writes them."""
  assert workdir_writers(_sources()) == ["jaxnet/core/workdir.py"]
  assert workdir_writers({"jaxnet/tools/x.py": "w = MetricWriter(workdir)\n",
                          "jaxnet/core/y.py": "c = ckpt.Checkpoints(workdir, read_only=True)\n"}) == \
      ["jaxnet/tools/x.py"]


def test_the_core_reports_and_the_shell_prints(capsys):
  """The core never prints: it reports through the logger "jaxnet.report", which the command
  line and jaxnet.api show as the same plain lines, and a notebook can turn off."""
  printing = [f"{path}:{i}" for path, text in _sources(os.path.join("jaxnet", "core")).items()
              for i, line in enumerate(text.splitlines(), 1) if re.search(r"(?<![\w.])print\(", line.split("#")[0])]
  assert printing == []
  from jaxnet import api
  from jaxnet.core.metrics import Progress
  progress = Progress(10, 4, 0)
  record = {"train/loss": 1.0, "train/learning_rate": 0.1}
  progress.report(5, record, 100.0)
  assert capsys.readouterr().out == "step       5/10  loss 1.0000  lr 0.1  100 img/s  ETA 0:00\n"
  api.show_reports(False)
  try:
    progress.report(6, record, 100.0)
    assert capsys.readouterr().out == ""
  finally:
    api.show_reports()
