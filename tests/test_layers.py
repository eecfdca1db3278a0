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
  kept = [line for line in proc.stdout.splitlines() if re.search(r" KEPT( \(\d+ ignored imports?\))?$", line)]
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


# What deciding it by a flag or a key looks like: a restored model's or a task's kind read
# (`model.draws`, `task.returns`), or a name only one task has (its metrics, its batch's fields,
# its config keys: `task_names`) tested with `in`, `==`, hasattr/getattr or .get, or its config
# block read (`config.detection`).
KIND_FLAG = re.compile(r"\.(draws|returns)\b")


def _config_keys(task) -> list[str]:
  """The top-level config keys `task` adds (Task.add_config)."""
  import ml_collections
  c = ml_collections.ConfigDict()
  task.add_config(c)
  return list(c)


def task_names() -> set[str]:
  """The names one task owns and no other has: its headline and plotted metrics (and the
  report's best_ key of its headline), its batch's fields, its config block's keys."""
  from jaxnet.core import config as config_lib
  from jaxnet.core import tasks
  config = config_lib.base_config()
  owned = []
  for task in tasks.all_tasks():
    names = {task.headline, "best_" + task.headline.replace("/", "_"), *task.batch_fields(config),
             *_config_keys(task)}
    names |= {metric for _, _, metrics in task.plots for metric, _, _ in metrics}
    owned.append(names)
  shared = {n for i, a in enumerate(owned) for b in owned[i + 1:] for n in a & b}
  return set().union(*owned) - shared


def key_tests(names: set[str]) -> re.Pattern:
  from jaxnet.core import tasks
  alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
  blocks = "|".join(sorted({k for t in tasks.all_tasks() for k in _config_keys(t)} & names))
  quoted = rf"""["']({alternatives})["']"""
  return re.compile(rf"""{quoted}\s*(==|!=|\bin\b|\bnot\s+in\b)"""
                    rf"""|(==|!=)\s*{quoted}"""
                    rf"""|\b(hasattr|getattr)\([^)]*{quoted}"""
                    rf"""|\.get\(\s*{quoted}"""
                    rf"""|\bc(onfig)?\.({alternatives})\b"""        # its config block read
                    + (rf"""|["']({blocks})(\.[\w.]*)?["']""" if blocks else ""))  # its config keys named


# Where a model family's own knowledge lives, beside the tasks: its modules, its ONNX writer,
# its weights' names (RetinaNet's ONNX writer reads config.detection); and the recipes, which
# set a model's and its task's keys.
MODEL_FILES = tuple(os.path.join("jaxnet", *parts) + os.sep for parts in
                    (("core", "models"), ("core", "tasks"), ("configs",)))


def _is_model_file(path: str) -> bool:
  folder, name = os.path.split(path)
  return (path.startswith(MODEL_FILES) or name.endswith("_names.py")
          or (folder == os.path.join("jaxnet", "tools", "onnx") and name not in ("__init__.py", "graph.py", "int8.py")))


def family_tests() -> re.Pattern:
  """What deciding "is this a ViT?" looks like: a model family's name (a module of
  jaxnet/core/models, found as the registry finds them) compared or looked for in a model's
  name, where the family's own constant belongs (models.declared)."""
  import pkgutil
  from jaxnet.core import models
  families = "|".join(sorted(m.name for m in pkgutil.iter_modules(models.__path__)))
  quoted = rf"""["']({families})["']"""
  return re.compile(rf"""{quoted}\s*(==|!=|\bin\b|\bnot\s+in\b)|(==|!=)\s*{quoted}"""
                    rf"""|\.startswith\(\s*\(?{quoted}""")


def task_branches(sources: dict, names: set[str] | None = None) -> list[str]:
  """'path:line: text' of each place outside jaxnet/core/tasks/ that branches on the task: by
  its name, by a flag of its kind, or by a key only one task has (outside the model files too);
  and each place outside the model files that branches on a model's family by its name."""
  keys = key_tests(task_names() if names is None else names)
  families = family_tests()
  found = []
  for path, text in sources.items():
    if path.startswith(os.path.join("jaxnet", "core", "tasks") + os.sep):
      continue
    code_only = re.sub(r'"""[\s\S]*?"""', lambda m: "\n" * m.group().count("\n"), text)  # no docstrings
    for i, line in enumerate(code_only.splitlines(), 1):
      code = line.split("#", 1)[0]
      if TASK_BRANCH.search(code) or KIND_FLAG.search(code) or (
          not _is_model_file(path) and (keys.search(code) or families.search(code))):
        found.append(f"{path}:{i}: {line.strip()}")
  return found


def test_no_file_outside_the_tasks_branches_on_the_task():
  """Tasks are plug-ins (jaxnet/core/tasks): every other module asks the task object, never
  compares names. The registry's own lookup (models.task, read by tasks.for_model) is the one
  place a model's task name is read."""
  found = [re.sub(r":\d+:", ":", line) for line in task_branches(_sources())]
  assert found == ['jaxnet/core/models/__init__.py: return declared(name, "TASK", "classification")'], \
      "\n".join(found)


def test_the_branch_finder_finds_a_decision_by_flag_or_key():
  """The sites main d243e8b still had (issue 54), each a task decided without its name."""
  sources = {"jaxnet/tools/report.py": 'best = a if "best_eval_mAP" in s else b\n',
             "jaxnet/cli/predict.py": "if args.draw and not model.draws:\n",
             "jaxnet/tools/predictor.py": "kind = PREDICTORS[task.returns]\n",
             "jaxnet/core/workdir.py": 'EVAL = ("init.preprocessing", "detection.")\nx = config.mix.prob\n',
             "jaxnet/tools/summary.py": 'batch = {"label": 1}\nif "boxes" in batch: pass\n',
             "jaxnet/tools/onnx/retinanet.py": "n = c.detection.max_detections\n",
             "jaxnet/tools/gpu_plan.py": 'a = f(x) if "vit" in config.model.name else ""\n',
             "jaxnet/core/mlperf_log.py": 'b = "resnet" if name.startswith("resnet") else name\n',
             "jaxnet/core/models/vit.py": 'if "vit" in name: pass\n'}
  assert task_branches(sources) == ['jaxnet/tools/report.py:1: best = a if "best_eval_mAP" in s else b',
                                    "jaxnet/cli/predict.py:1: if args.draw and not model.draws:",
                                    "jaxnet/tools/predictor.py:1: kind = PREDICTORS[task.returns]",
                                    'jaxnet/core/workdir.py:1: EVAL = ("init.preprocessing", "detection.")',
                                    "jaxnet/core/workdir.py:2: x = config.mix.prob",
                                    'jaxnet/tools/summary.py:2: if "boxes" in batch: pass',
                                    'jaxnet/tools/gpu_plan.py:1: a = f(x) if "vit" in config.model.name else ""',
                                    'jaxnet/core/mlperf_log.py:1: b = "resnet" if name.startswith("resnet") else name']
  assert {"eval/mAP", "eval/top1", "boxes", "label", "detection", "mix", "label_smoothing"} <= task_names()


def test_the_branch_finder_finds_a_branch_added_outside_the_tasks():
  sources = {"jaxnet/core/train.py": 'if exp.task.name == "detection":\n  pass\n',
             "jaxnet/tools/export.py": "x = isinstance(model, Detector)\n",
             "jaxnet/core/tasks/detection/__init__.py": 'if name == "detection": pass\n'}
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
