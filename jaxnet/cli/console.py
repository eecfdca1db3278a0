"""The `jaxnet` command: one name for every command line of jaxnet.

  jaxnet train --config=configs/NAME.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]
  jaxnet eval  --config=configs/NAME.py[:ARG] --workdir=DIR
  jaxnet recipes                      # configs/*.py, what each trains, and its :ARGs
  jaxnet COMMAND --help               # any command's flags

`jaxnet train` and `jaxnet eval` are `python -m jaxnet.main --mode=train|eval` (the public
command-line contract); every other command is `python -m jaxnet.cli.COMMAND`.
"""

import ast
import glob
import importlib
import importlib.util
import os
import re
import sys

# The tools: each is jaxnet/cli/NAME.py with main(argv). The heartbeat is no command: it runs
# inside `jaxnet train` (jaxnet/cli/heartbeat.py).
TOOLS = ("predict", "export", "report", "summary", "verify", "gpu_plan", "weights", "make_imagefolder",
         "make_shapes")
COMMANDS = ("train", "eval", "recipes") + TOOLS


def _summary(module_name: str) -> str:
  """The first line of a module's docstring, read from its source (nothing is imported)."""
  with open(importlib.util.find_spec(module_name).origin) as f:
    docstring = ast.get_docstring(ast.parse(f.read())) or ""
  return docstring.split("\n\n")[0].replace("\n", " ").split(" (jaxnet/")[0].rstrip(":.")


def usage() -> str:
  rows = [("train", "Train, or resume from the workdir's latest checkpoint (python -m jaxnet.main)"),
          ("eval", "Evaluate a workdir's latest checkpoint (python -m jaxnet.main --mode=eval)"),
          ("recipes", "List the recipes in configs/ with their :ARGs")]
  rows += [(name, _summary(f"jaxnet.cli.{name}")) for name in TOOLS]
  width = max(len(name) for name, _ in rows)
  return (f"{__doc__.strip()}\n\ncommands:\n"
          + "\n".join(f"  {name:<{width}}  {text}" for name, text in rows))


# --- recipes --------------------------------------------------------------------------

def configs_dir() -> str | None:
  """./configs where it exists, else the one beside the jaxnet package (a source checkout)."""
  here = os.path.join(os.getcwd(), "configs")
  beside = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "configs")
  return next((d for d in (here, beside) if glob.glob(os.path.join(d, "*.py"))), None)


def describe_recipe(path: str) -> tuple[str, str]:
  """(its docstring's first line, its :ARGs) of a config file, read from its source: the
  docstring's ARGS paragraph or variants line, else the `:ARG`s its commands show; no
  get_config runs."""
  with open(path) as f:
    tree = ast.parse(f.read())
  docstring = ast.get_docstring(tree) or ""
  title = docstring.split("\n")[0].strip()
  get_config = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_config"), None)
  if get_config is None or not (get_config.args.args or get_config.args.vararg):
    return title, "none"
  for paragraph in docstring.split("\n\n"):
    lines = [line.strip() for line in paragraph.splitlines()]
    at = next((i for i, line in enumerate(lines) if line.startswith("ARGS")), None)
    if at is not None:  # up to the line that ends its sentence
      end = next((i for i in range(at, len(lines)) if lines[i].endswith(".")), len(lines) - 1)
      return title, " ".join(lines[at:end + 1]).removeprefix("ARGS").lstrip(" :")
    variants = [line.strip("()") for line in lines if line.startswith("(variants:")]
    if variants:
      return title, variants[0]
  name = os.path.basename(path)
  shown = sorted(set(re.findall(rf"{re.escape(name)}:([\w=,]+)", docstring)))
  return title, ", ".join(f":{a}" for a in shown) or "see the file's get_config"


def recipes(argv) -> int:
  import argparse
  parser = argparse.ArgumentParser(prog="jaxnet recipes", description=(
      "List the recipes (configs/*.py): what each trains and the :ARGs its get_config takes "
      "(--config=configs/NAME.py:ARG). Read from the files; nothing is run."))
  parser.add_argument("--dir", default=None, help="the folder of configs (default: ./configs, "
                      "else the one of this jaxnet checkout)")
  args = parser.parse_args(argv)
  folder = args.dir or configs_dir()
  paths = sorted(glob.glob(os.path.join(folder, "*.py"))) if folder else []
  if not paths:
    print(f"error: no configs/*.py in {args.dir or os.getcwd()}: run jaxnet recipes in a jaxnet "
          f"checkout, or pass --dir=PATH/TO/configs", file=sys.stderr)
    return 1
  for path in paths:
    title, arguments = describe_recipe(path)
    print(f"{os.path.relpath(path)}\n    {title}\n    :ARGs: {arguments}")
  return 0


# --- dispatch --------------------------------------------------------------------------

def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(usage())
    return 0 if argv else 2
  command, rest = argv[0], argv[1:]
  if command in ("train", "eval"):
    if any(a.split("=")[0] == "--mode" for a in rest):
      print(f"error: jaxnet {command} sets --mode itself; drop --mode", file=sys.stderr)
      return 2
    from jaxnet.cli import main as train_main
    # absl reads sys.argv; the contract's command line, so its messages name what runs.
    sys.argv = ["python -m jaxnet.main", *rest, f"--mode={command}"]
    train_main.run()
    return 0
  if command == "recipes":
    return recipes(rest)
  if command in TOOLS:
    sys.argv[0] = f"jaxnet {command}"  # the usage line of a parser that names no prog of its own
    module = importlib.import_module(f"jaxnet.cli.{command}")
    return module.main(rest) or 0
  print(f"error: jaxnet has no command {command!r}; the commands are {', '.join(COMMANDS)} "
        f"(jaxnet --help)", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main())
