"""The `jaxnet` command: one name for every command line of jaxnet.

  jaxnet train --config=RECIPE[:ARG] --workdir=DIR [--config.KEY=VALUE ...]
  jaxnet eval  --workdir=DIR [--config.KEY=VALUE ...]
  jaxnet recipes                      # the recipes, what each is for and what to expect
  jaxnet config [KEY_PREFIX]          # the config's keys, their defaults and what they do
  jaxnet COMMAND --help               # any command's flags

RECIPE is a recipe's name (`jaxnet recipes`) or the path of your own config file. `jaxnet
train` and `jaxnet eval` are `python -m jaxnet.main --mode=train|eval` (the public
command-line contract); every other command is also `python -m jaxnet.cli.COMMAND`.
"""

import ast
import difflib
import glob
import importlib
import importlib.util
import inspect
import os
import re
import sys

# The tools: each is jaxnet/cli/NAME.py with main(argv). The heartbeat is no command: it runs
# inside `jaxnet train` (jaxnet/cli/heartbeat.py).
TOOLS = ("predict", "export", "report", "summary", "verify", "gpu_plan", "weights", "make_imagefolder",
         "make_shapes", "prepare")
COMMANDS = ("train", "eval", "recipes", "config") + TOOLS


def _summary(module_name: str) -> str:
  """The first line of a module's docstring, read from its source (nothing is imported)."""
  with open(importlib.util.find_spec(module_name).origin) as f:
    docstring = ast.get_docstring(ast.parse(f.read())) or ""
  return docstring.split("\n\n")[0].replace("\n", " ").split(" (jaxnet/")[0].rstrip(":.")


def usage() -> str:
  rows = [("train", "Train, or resume from the workdir's latest checkpoint (python -m jaxnet.main)"),
          ("eval", "Evaluate a workdir's latest checkpoint (python -m jaxnet.main --mode=eval)"),
          ("recipes", "List the recipes with their :ARGs, what each is meant for and what to expect"),
          ("config", "List the config's keys with their defaults and what each does")]
  rows += [(name, _summary(f"jaxnet.cli.{name}")) for name in TOOLS]
  width = max(len(name) for name, _ in rows)
  return (f"{__doc__.strip()}\n\ncommands:\n"
          + "\n".join(f"  {name:<{width}}  {text}" for name, text in rows)
          + "\n\n  jaxnet --version   the installed version")


def version() -> str:
  from jaxnet import __version__
  return f"jaxnet {__version__}"


# --- recipes --------------------------------------------------------------------------

def _arguments(tree, docstring: str, name: str) -> str:
  """A recipe's :ARGs: its docstring's ARGS paragraph or `(variants: ...)` line, else the
  `NAME:ARG`s its commands show; "none" when get_config takes no argument."""
  get_config = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_config"), None)
  if get_config is None or not (get_config.args.args or get_config.args.vararg):
    return "none"
  for paragraph in docstring.split("\n\n"):
    lines = [line.strip() for line in paragraph.splitlines()]
    at = next((i for i, line in enumerate(lines) if line.startswith("ARGS")), None)
    if at is not None:  # up to the line that ends its sentence
      end = next((i for i in range(at, len(lines)) if lines[i].endswith(".")), len(lines) - 1)
      return " ".join(lines[at:end + 1]).removeprefix("ARGS").lstrip(" :")
    variants = [line.strip("()") for line in lines if line.startswith("(variants:")]
    if variants:
      return variants[0]
  shown = sorted(set(re.findall(rf"(?<![\w/]){re.escape(name)}(?:\.py)?:([\w=,]+)", docstring)))
  return ", ".join(f":{a}" for a in shown) or "see the file's get_config"


_KEY_LINE = re.compile(r"^(Meant for|Expect|Data):")
_VARIANT_HEADING = re.compile(r"^(\w+): ")


def _expectations(docstring: str) -> list[tuple[str, list[str]]]:
  """(variant or "", its lines) for every "Meant for:" and "Expect:" paragraph of a recipe's
  docstring, whole. An indented one belongs to the variant whose paragraph it is in
  (`shapes: ...` then `  Meant for: ...`)."""
  lines = docstring.splitlines()
  found, variant = [], ""
  i = 0
  while i < len(lines):
    line = lines[i]
    if not line.strip():
      variant = ""
    elif not line.startswith(" ") and _VARIANT_HEADING.match(line) and not _KEY_LINE.match(line):
      variant = _VARIANT_HEADING.match(line).group(1)
    stripped = line.strip()
    if stripped.startswith(("Meant for:", "Expect:")):
      indent = len(line) - len(line.lstrip())
      block = [stripped]
      i += 1
      while (i < len(lines) and lines[i].strip() and not _KEY_LINE.match(lines[i].strip())
             and len(lines[i]) - len(lines[i].lstrip()) >= indent):
        block.append(lines[i].strip())
        i += 1
      found.append((variant if indent else "", block))
      continue
    i += 1
  return found


def describe_recipe(path: str) -> dict:
  """What `jaxnet recipes` shows of a config file, read from its source (no get_config runs):
  its name, its docstring's first paragraph, its :ARGs, its "Meant for" and "Expect" paragraphs."""
  with open(path) as f:
    tree = ast.parse(f.read())
  docstring = ast.get_docstring(tree) or ""
  name = os.path.basename(path)[:-3]
  return {"name": name, "title": " ".join(docstring.split("\n\n")[0].split()),
          "args": _arguments(tree, docstring, name), "expect": _expectations(docstring)}


def format_recipe(recipe: dict, shown_as: str) -> str:
  out = [shown_as, f"    {recipe['title']}", f"    :ARGs: {recipe['args']}"]
  for variant, block in recipe["expect"]:
    indent = "    "
    if variant:
      heading = f"    :{variant}:"
      if heading not in out:
        out.append(heading)
      indent = "      "
    out += [indent + block[0]] + [indent + "  " + line for line in block[1:]]
  return "\n".join(out)


def recipes(argv) -> int:
  from jaxnet import cli
  from jaxnet.core import config as config_lib
  parser = cli.parser("recipes", (
      "The recipes jaxnet ships (jaxnet/configs/NAME.py): what each trains, the :ARGs its "
      "get_config takes (--config=NAME:ARG), what it is meant for and what to expect. Read "
      "from the files; nothing is run."))
  parser.add_argument("--dir", default=None, help="list the config files of this folder instead")
  args = parser.parse_args(argv)
  folder = args.dir or config_lib.RECIPES_DIR
  paths = sorted(p for p in glob.glob(os.path.join(folder, "*.py"))
                 if not os.path.basename(p).startswith("_"))
  if not paths:
    print(f"error: no config files (*.py) in {folder}: pass --dir=FOLDER of config files",
          file=sys.stderr)
    return 1
  for path in paths:
    recipe = describe_recipe(path)
    print(format_recipe(recipe, recipe["name"] if args.dir is None else os.path.relpath(path)))
  if args.dir is None:
    print("\nRun one: jaxnet train --config=NAME[:ARG] --workdir=DIR; its keys: jaxnet config "
          "--config=NAME")
  return 0


# --- config keys -----------------------------------------------------------------------

def key_help() -> dict[str, str]:
  """{dotted key: its comment} from the source of base_config and the tasks' add_config: the
  comment on a key's line and the comment lines that continue it, else the comment lines just
  above it."""
  from jaxnet.core import config as config_lib
  helps, key, above = {}, None, []
  source = "\n".join(inspect.getsource(define) for define in config_lib.key_definitions())
  for line in source.splitlines():
    assigned = re.match(r"\s*c\.([\w.]+)\s*=[^#]*?(?:#\s?(.*))?$", line)
    if assigned:
      key = assigned.group(1)
      helps[key] = (assigned.group(2) or "").strip() or " ".join(above)
      above = []
    elif key and re.match(r"\s{8,}#", line):  # a continuation, aligned under the comment
      helps[key] = f"{helps[key]} {line.strip().lstrip('#').strip()}".strip()
    elif re.match(r"\s*#", line):
      key = None
      above.append(line.strip().lstrip("#").strip())
    else:
      key, above = None, []
  return helps


def config_keys(argv) -> int:
  from jaxnet import cli
  from jaxnet.core import config as config_lib
  from jaxnet.core.errors import UserError
  parser = cli.parser("config", (
      "The config's keys (set any with --config.KEY=VALUE), with their values and what each "
      "does: the defaults of jaxnet/core/config.py, or a recipe's values with --config."))
  parser.add_argument("prefix", nargs="?", default="", metavar="KEY_PREFIX",
                      help="only the keys that start with it (optim, data.eval_, ...)")
  parser.add_argument("--config", default=None, metavar="RECIPE[:ARG]",
                      help="a recipe or config file (or a workdir): its values (default: the defaults)")
  args = parser.parse_args(argv)
  try:
    config = (config_lib.load(args.config) if args.config
              else config_lib.with_model_options(config_lib.base_config()))
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  helps = key_help()
  keys = [k for k in config_lib.flat_keys(config) if k.startswith(args.prefix)]
  if not keys:
    names = config_lib.flat_keys(config)
    close = difflib.get_close_matches(args.prefix, names + sorted({k.split(".")[0] for k in names}), n=3)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    print(f"error: no config key starts with {args.prefix!r}{hint}; jaxnet config lists them all",
          file=sys.stderr)
    return 2
  for key in keys:
    value = config_lib.get(config, key)
    text = helps.get(key) or (f"an option of model {config.model.name}"
                              if key.startswith("model.") else "")
    if key == "model.name":
      text = "the model, a registry name (jaxnet summary --help lists them)"
    print(f"{key} = {value!r}" + (f"  # {text}" if text else ""))
  return 0


# --- dispatch --------------------------------------------------------------------------

def main(argv=None) -> int:
  try:
    return _dispatch(sys.argv[1:] if argv is None else list(argv))
  except BrokenPipeError:  # `jaxnet recipes | head`: the reader has what it wanted
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _dispatch(argv: list[str]) -> int:
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(usage())
    return 0 if argv else 2
  if argv[0] in ("-V", "--version", "version"):
    print(version())
    return 0
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
  if command == "config":
    return config_keys(rest)
  if command in TOOLS:
    sys.argv[0] = f"jaxnet {command}"  # the usage line of a parser that names no prog of its own
    module = importlib.import_module(f"jaxnet.cli.{command}")
    return module.main(rest) or 0
  close = difflib.get_close_matches(command, COMMANDS, n=1)
  hint = f"did you mean jaxnet {close[0]}? " if close else ""
  print(f"error: jaxnet has no command {command!r}; {hint}the commands are {', '.join(COMMANDS)} "
        f"(jaxnet --help)", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main())
