"""The docs name only what exists: every jaxnet module, import and command in README.md,
docs/*.md, pyproject.toml's comments, the configs' docstrings and the notebooks.

- every `from jaxnet... import NAME` / `import jaxnet...` imports, NAME included;
- every dotted name `jaxnet.X.Y` is a module or an attribute of one (the names jaxnet's code
  writes as strings excepted: the ONNX metadata keys, `jaxnet.step` and the like, and the
  logger `jaxnet.report`);
- every `python -m jaxnet.X` names a module whose `--help` exits 0, and every `--flag` such a
  command is shown with appears in that help (`--config.KEY` overrides excepted);
- every `jaxnet COMMAND` of the console command likewise;
- every `--config=RECIPE[:ARG]` (or an older `--config=configs/NAME.py[:ARG]`) loads, from a
  folder outside the checkout (get_config only: nothing trains).
Placeholders (an upper-case segment such as jaxnet.cli.NAME or --config=NAME) are skipped.
"""

import functools
import glob
import importlib
import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _notebook_text(path):
  with open(path) as f:
    cells = json.load(f)["cells"]
  return "\n".join("".join(c["source"]) for c in cells)


def _doc_texts():
  paths = (["README.md", "pyproject.toml"] + sorted(glob.glob("docs/*.md", root_dir=REPO))
           + sorted(glob.glob("jaxnet/configs/*.py", root_dir=REPO))
           + sorted(glob.glob("notebooks/*.ipynb", root_dir=REPO)))
  texts = {}
  for rel in paths:
    path = os.path.join(REPO, rel)
    if rel.endswith(".ipynb"):
      texts[rel] = _notebook_text(path)
    elif rel == "pyproject.toml":  # its comments only
      with open(path) as f:
        texts[rel] = "\n".join(line.split("#", 1)[1] for line in f if "#" in line)
    else:
      with open(path) as f:
        texts[rel] = f.read()
  return texts


DOCS = _doc_texts()


def _placeholder(name: str) -> bool:
  return any(part.isupper() or part.startswith("$") for part in re.split(r"[./:=,]", name) if part)


def _occurrences(pattern):
  """(file, match) for each match of `pattern` in the docs."""
  return [(rel, m) for rel, text in DOCS.items() for m in re.finditer(pattern, text)]


def _resolve(name: str) -> bool:
  """True when `name` is a module, or an attribute path under the longest module prefix."""
  parts = name.split(".")
  for i in range(len(parts), 0, -1):
    module_name = ".".join(parts[:i])
    try:
      obj = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
      if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
        continue  # this prefix is not a module: try a shorter one
      # The module exists but needs an extra that is not installed (DALI, onnx, ...): its
      # name is right; its attributes cannot be checked here.
      return True
    for attr in parts[i:]:
      if not hasattr(obj, attr):
        return False
      obj = getattr(obj, attr)
    return True
  return False


def _metadata_keys() -> set[str]:
  """The names jaxnet's code writes as strings, not modules: the ONNX metadata keys, the logger
  the core reports through ("jaxnet.report")."""
  keys = set()
  for folder, _, files in os.walk(os.path.join(REPO, "jaxnet")):
    for name in files:
      if name.endswith(".py"):
        with open(os.path.join(folder, name)) as f:
          keys |= set(re.findall(r'"(jaxnet\.\w+)"', f.read()))
  return keys


def test_imports_in_the_docs_import():
  statements = _occurrences(r"(?m)^[ \t>\"]*from (jaxnet[\w.]*) import ([\w, ]+)") + \
               _occurrences(r"(?m)^[ \t>\"]*import (jaxnet[\w.]*)()\b")
  assert len(statements) >= 8, "the extraction found too few imports: the pattern is broken"
  broken = []
  for rel, m in statements:
    module_name = m.group(1)
    names = [n.split(" as ")[0].strip() for n in m.group(2).split(",") if n.strip()]
    try:
      module = importlib.import_module(module_name)
    except ImportError as e:
      if isinstance(e, ModuleNotFoundError) and e.name and not e.name.startswith("jaxnet"):
        continue  # the module needs an extra that is not installed: not the docs' fault
      broken.append(f"{rel}: {m.group(0).strip()}: {e}")
      continue
    for name in names:
      if not hasattr(module, name):
        try:
          importlib.import_module(f"{module_name}.{name}")
        except ImportError:
          broken.append(f"{rel}: {m.group(0).strip()}: {module_name} has no {name}")
  assert not broken, "\n".join(broken)


def test_dotted_names_in_the_docs_exist():
  skip = _metadata_keys()
  names = {(rel, m.group(0)) for rel, m in _occurrences(r"(?<![\w/.-])jaxnet(?:\.\w+)+")}
  assert len(names) >= 30, "the extraction found too few names: the pattern is broken"
  # File names are not module names: jaxnet.def (the Apptainer definition in the repository)
  # and the jaxnet.sif image Apptainer builds from it.
  files = lambda name: os.path.exists(os.path.join(REPO, name)) or name.endswith(".sif")
  broken = sorted(f"{rel}: {name}" for rel, name in names
                  if name not in skip and not _placeholder(name) and not files(name) and not _resolve(name))
  assert not broken, "names in the docs that are neither modules nor attributes:\n" + "\n".join(broken)


def _code(text: str) -> str:
  """The code in a doc: its fenced blocks, `code spans` and indented lines, one per line."""
  blocks = re.findall(r"(?s)```[^\n]*\n(.*?)```", text)
  spans = re.findall(r"`([^`\n]+)`", re.sub(r"(?s)```.*?```", "", text))
  indented = re.findall(r"(?m)^(?: {2,}|\t)(\S.*)$", text)
  return "\n".join(blocks + spans + indented)


def _commands(prefix_pattern, code_only=False):
  """(file, program, command) for each documented command: the text from the program name to
  the end of its line (backslash continuations joined) or of its `code span`, comments cut."""
  found = []
  for rel, text in DOCS.items():
    text = _code(text) if code_only else text
    text = text.replace("\\\n", " ")
    for m in re.finditer(prefix_pattern + r"[^\n`]*", text):
      command = m.group(0).split(" #")[0]
      found.append((rel, m.group(1), command))
  return found


def _flags(command: str) -> set[str]:
  return {f for f in re.findall(r"(?<![\w-])--([a-zA-Z][\w-]*)(?![\w.-]*\.)", command)
          if not f.startswith("config.")} | (
      {"config"} if re.search(r"--config=", command) else set())


@functools.cache
def _run_help(argv: tuple[str, ...]) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, *argv, "--help"], cwd=REPO, capture_output=True,
                        text=True, timeout=120)


def _help(argv: tuple[str, ...]) -> str:
  done = _run_help(argv)
  assert done.returncode == 0, f"{' '.join(argv)} --help exited {done.returncode}: {done.stderr[-500:]}"
  assert done.stdout.strip(), f"{' '.join(argv)} --help printed nothing"
  return done.stdout


def _check_commands(commands, argv_of):
  broken = []
  for rel, program, command in commands:
    if _placeholder(program):
      continue
    argv = argv_of(program)
    try:
      text = _help(argv)
    except AssertionError as e:
      broken.append(f"{rel}: {command}: {e}")
      continue
    missing = sorted(f for f in _flags(command) if f"--{f}" not in text)
    if missing:
      broken.append(f"{rel}: {command}: {' '.join(argv)} --help names no {', '.join('--' + f for f in missing)}")
  return broken


def test_python_m_commands_in_the_docs_exist_and_take_their_flags():
  commands = _commands(r"python -m (jaxnet[\w.]*)")
  modules = {p for _, p, _ in commands if not _placeholder(p)}
  assert {"jaxnet.main", "jaxnet.cli.predict", "jaxnet.cli.export"} <= modules
  broken = _check_commands(commands, lambda module: ("-m", module))
  assert not broken, "\n".join(broken)


def test_console_commands_in_the_docs_exist_and_take_their_flags():
  from jaxnet.cli import console
  commands = _commands(r"(?m)(?:^|(?<=\$ ))jaxnet ([a-z][a-z_]*)", code_only=True)
  unknown = [f"{rel}: {command}: jaxnet has no such command" for rel, name, command in commands
             if name not in console.COMMANDS]
  assert not unknown, "\n".join(unknown)
  assert {"train", "eval", "recipes", "predict"} <= {name for _, name, _ in commands}
  broken = _check_commands(commands, lambda name: ("-m", "jaxnet.cli.console", name))
  assert not broken, "\n".join(broken)


def test_configs_in_the_docs_load(tmp_path, monkeypatch):
  from jaxnet.core import config as config_lib
  specs = {m.group(1) for _, m in _occurrences(r"--config=((?:configs/\w+\.py|[a-z]\w*)(?::[\w=,]+)?)(?![\w./])")}
  assert {"digits", "resnet50:fast", "convnext:mini"} <= specs
  monkeypatch.chdir(tmp_path)  # a recipe runs by name from any folder
  broken = []
  for spec in sorted(s for s in specs if not _placeholder(s)):
    try:
      config_lib.load(spec)
    except Exception as e:  # noqa: BLE001  (each broken spec named, not just the first)
      broken.append(f"{spec}: {type(e).__name__}: {e}")
  assert not broken, "\n".join(broken)


@pytest.mark.parametrize("text,expected", [
    ("see `jaxnet.predict` here", {"jaxnet.predict"}),
    ("a path jaxnet/core/train.py and jaxnet-train", set()),
])
def test_the_name_pattern_finds_dotted_names_only(text, expected):
  assert {m.group(0) for m in re.finditer(r"(?<![\w/.-])jaxnet(?:\.\w+)+", text)} == expected
  assert not _resolve("jaxnet.predict") and _resolve("jaxnet.cli.process.setup")


def test_flags_are_read_from_commands():
  assert _flags("python -m jaxnet.cli.export --workdir=DIR --format=onnx [--int8] "
                "--config.data.dir=X") == {"workdir", "format", "int8"}


def test_the_images_the_docs_predict_on_exist():
  """What a reader can try predict on: a repository file (docs/images/), never a made-up name."""
  paths = set()
  for text in DOCS.values():
    code = _code(text)
    for m in re.finditer(r"\.(?:predict|preprocess)\(\[([^\]]*)\]", code):
      paths |= set(re.findall(r"\"([^\"]+\.(?:png|jpe?g|webp))\"", m.group(1)))
    for m in re.finditer(r"(?:jaxnet\.cli\.predict|jaxnet predict)((?: +[^\s#`]+)+)", code):
      paths |= {a for a in m.group(1).split()
                if not a.startswith("-") and re.search(r"\.(?:png|jpe?g|webp)$|/$", a)}
  relative = {p for p in paths if not p.startswith(("/", "$")) and not _placeholder(p)}
  assert "docs/images/seven.png" in relative
  missing = sorted(p for p in relative if not os.path.exists(os.path.join(REPO, p)))
  assert not missing, f"the docs predict on files that do not exist: {missing}"


def test_a_test_session_leaves_no_site_folder_behind(tmp_path):
  # README, "Files outside the workdir": a session's jaxnet-test-site-<pid> goes at its end.
  # (-n 1: one xdist worker, whose folder must go too; -n auto would start one per core.)
  done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "1", "-p", "no:cacheprovider",
                         "tests/test_docs.py::test_flags_are_read_from_commands"],
                        cwd=REPO, env=dict(os.environ, TMPDIR=str(tmp_path)), capture_output=True,
                        text=True, timeout=120)
  assert done.returncode == 0, done.stdout + done.stderr
  assert "1 passed" in done.stdout
  assert not glob.glob(str(tmp_path / "jaxnet-test-site-*"))


def test_self_contained_python_snippets_run():
  """The ```python blocks that need no file or workdir (none under /tmp, /data, a DIR) run, each
  in a fresh namespace, in one process."""
  blocks = [(rel, code) for rel, text in DOCS.items() if rel.endswith(".md")
            for code in re.findall(r"(?s)```python\n(.*?)```", text)
            if not re.search(r"/tmp/|/data|/models|\bDIR\b|\.onnx|\.jaxexport|\bimages\b", code)]
  assert any("models.create" in code for _, code in blocks)  # the filter keeps docs/models.md's
  script = "\n".join(f"exec(compile({code!r}, {rel!r}, 'exec'), {{}})" for rel, code in blocks)
  done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                        timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]


def test_deploy_md_lists_every_export_format():
  from jaxnet.cli import export
  parser_source = open(export.__file__).read()
  formats = re.search(r'"--format".*?choices=[(\[]([^)\]]*)[)\]]', parser_source, re.S).group(1)
  formats = re.findall(r'"(\w+)"', formats)
  assert len(formats) >= 4
  rows = re.findall(r"(?m)^\| `(\w+)`(?: \(default\))? \| `", DOCS["docs/deploy.md"])
  assert sorted(rows) == sorted(formats), f"docs/deploy.md's table lists {rows}; export --format takes {formats}"
