"""The `jaxnet` console command (jaxnet/cli/console.py) and `python -m jaxnet.main --help`.

The installed `jaxnet` entry point runs console.main; the tests call it, or run the module
(`python -m jaxnet.cli.console`), so that this tree's code is what they check.
"""

import glob
import os
import subprocess
import sys

import pytest

from jaxnet.cli import console
from jaxnet.core import config as config_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*argv, cwd=REPO, env=None):
  return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=120,
                        env=env)


def test_every_cli_tool_is_a_jaxnet_command():
  # A tool is a module of jaxnet/cli with main(argv); the train command is jaxnet.cli.main.
  tools = set()
  for path in glob.glob(os.path.join(REPO, "jaxnet", "cli", "*.py")):
    name = os.path.basename(path)[:-3]
    with open(path) as f:
      if "\ndef main(argv" in f.read() and name not in ("main", "console"):
        tools.add(name)
  assert tools == set(console.TOOLS)


def test_help_lists_every_command_with_a_line(capsys):
  assert console.main(["--help"]) == 0
  out = capsys.readouterr().out
  for name in console.COMMANDS:
    line = next((l for l in out.splitlines() if l.startswith(f"  {name} ")), None)
    assert line is not None and len(line.split()) > 2, name
  assert console.main([]) == 2  # no command: the same help, as a usage error


def test_an_unknown_command_is_one_line_naming_the_commands(capsys):
  assert console.main(["trian", "--config=digits"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "'trian'; did you mean jaxnet train?" in err and "train, eval, recipes" in err


def test_version(capsys):
  import jaxnet
  assert console.main(["--version"]) == 0
  assert capsys.readouterr().out == f"jaxnet {jaxnet.__version__}\n"


def test_every_tool_s_usage_names_the_jaxnet_command_and_shows_defaults(capsys):
  with pytest.raises(SystemExit):
    console.main(["predict", "--help"])
  out = capsys.readouterr().out
  assert out.startswith("usage: jaxnet predict ") and "--top TOP" in out and "(default: 5)" in out


def test_a_tool_runs_with_its_arguments(capsys):
  with pytest.raises(SystemExit) as exit_:
    console.main(["summary", "--help"])
  assert exit_.value.code == 0
  assert "--image-size" in capsys.readouterr().out


def test_train_and_eval_are_jaxnet_main_with_their_mode(tmp_path):
  done = _run("-m", "jaxnet.cli.console", "train", "--mode=eval", "--config=digits",
              f"--workdir={tmp_path}")
  assert done.returncode == 2 and "drop --mode" in done.stderr
  # eval of a workdir without checkpoints, its config read from the workdir (no --config): jaxnet.main's
  # own one-line refusal, so --mode=eval ran; from a folder outside the checkout.
  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "config.json").write_text(config_lib.load("digits").to_json_best_effort())
  done = _run("-m", "jaxnet.cli.console", "eval", f"--workdir={workdir}", cwd=tmp_path,
              env=dict(os.environ, PYTHONPATH=REPO))
  assert done.returncode == 1, done.stderr
  assert f"no checkpoint in {workdir}" in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def parse(capsys):
  """jaxnet.main's flags and config, parsed in this process: (config or None, exit status, stderr)."""
  from absl import flags
  from jaxnet.cli import main

  def parse(*argv):
    parsed = {}
    flags.FLAGS.unparse_flags()  # one parse per process, as a command has
    try:
      main._parse_flags(["jaxnet", *argv], parsed)
      return parsed["config"], 0, capsys.readouterr().err
    except SystemExit as e:
      return None, e.code, capsys.readouterr().err
  yield parse
  flags.FLAGS.unparse_flags()


def test_eval_reads_the_workdir_s_config_and_train_needs_one(parse, tmp_path):
  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "config.json").write_text(config_lib.load("digits", {"batch_size": 32}).to_json_best_effort())
  config, status, _ = parse(f"--workdir={workdir}", "--mode=eval", "--config.data.eval_batch_size=8")
  assert status == 0 and config.batch_size == 32 and config.data.eval_batch_size == 8
  config, status, _ = parse(f"--workdir={workdir}", "--mode=eval", "--config=resnet50:fast")
  assert status == 0 and config.batch_size == 2048  # an explicit one: the gate compares it
  _, status, err = parse(f"--workdir={tmp_path / 'none'}", "--mode=eval")
  assert status == 2 and err == f"error: no run in {tmp_path / 'none'}: it has no config.json (a workdir " \
      "that jaxnet train wrote, or a bundle)\n"
  _, status, err = parse(f"--workdir={workdir}", "--mode=train")
  assert status == 2 and err.count("\n") == 1 and "needs --config=RECIPE" in err
  (workdir / "config_file.py").write_text("# jaxnet: the config file this run was started with: digits\n")
  _, status, err = parse(f"--workdir={workdir}", "--mode=train")
  assert status == 2 and err.endswith(f"; to resume {workdir}: --config=digits\n")


def test_a_config_key_given_as_a_flag_gets_its_config_spelling(parse, tmp_path):
  _, status, err = parse("--config=digits", f"--workdir={tmp_path}", "--batch_size=32")
  assert status == 2
  assert err.splitlines() == [
      "error: Unknown command line flag 'batch_size'; did you mean --config.batch_size=32?",
      "Flags: --help (--helpfull for absl's too); config keys: jaxnet config [KEY_PREFIX]."]
  _, _, err = parse("--config=digits", f"--workdir={tmp_path}", "--warmup_steps=5")
  assert "did you mean --config.optim.warmup_steps=5?" in err
  # A config error names its own fix: one line, no second pointer.
  _, status, err = parse("--config=digits", f"--workdir={tmp_path}", "--config.batchsize=32")
  assert status == 2 and err.count("\n") == 1 and "'batch_size'" in err and "jaxnet config" in err
  _, status, err = parse("--config=digts", f"--workdir={tmp_path}")
  assert status == 2 and err.count("\n") == 1 and "did you mean --config=digits?" in err


def test_train_and_eval_have_their_own_help():
  train = _run("-m", "jaxnet.cli.console", "train", "--help")
  evaluate = _run("-m", "jaxnet.main", "--mode=eval", "--help")
  assert train.returncode == evaluate.returncode == 0
  assert train.stdout.startswith("jaxnet train --config=RECIPE[:ARG] --workdir=DIR")
  assert evaluate.stdout.startswith("jaxnet eval --workdir=DIR [--config=RECIPE[:ARG]]")
  assert "(default: 'train')" not in train.stdout and "--workdir: " in evaluate.stdout


def test_jaxnet_main_help_explains_its_own_flags():
  done = _run("-m", "jaxnet.main", "--help")
  assert done.returncode == 0, done.stderr
  for flag in ("--config", "--workdir", "--mode", "--accept_config_changes", "--verbosity",
               "--helpfull", "--config.KEY=VALUE"):
    assert f"  {flag}:" in done.stdout, flag
  assert len(done.stdout.splitlines()) < 45  # not absl's ~60 flags
  assert "--only_check_args" not in done.stdout


def test_recipes_lists_every_recipe_and_variant_with_what_to_expect(tmp_path):
  done = _run("-m", "jaxnet.cli.console", "recipes", cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO))
  assert done.returncode == 0, done.stderr
  out = done.stdout
  listed = [l for l in out.splitlines() if l and not l.startswith(" ") and not l.startswith("Run one")]
  assert listed == config_lib.recipe_names() == sorted(
      os.path.basename(p)[:-3] for p in glob.glob(f"{REPO}/jaxnet/configs/[a-z]*.py"))
  assert "vit\n" in out and "ti16, s16, b16, l16, h14" in out
  assert "depth=18|34|50|101|152" in out and "recipe=coco|shapes" in out
  assert "digits\n    Quick start" in out
  assert "tiny, small, base, large, mini" in out and "b0 ... b7, v2_s, v2_m, v2_l, mini" in out
  # Each recipe's "Meant for" and "Expect" paragraphs, whole (the last line of each is there);
  # a variant's own under its name.
  for name in config_lib.recipe_names():
    section = out.split(f"\n{name}\n")[-1] if name != "alexnet" else out
    recipe = console.describe_recipe(os.path.join(config_lib.RECIPES_DIR, f"{name}.py"))
    assert recipe["expect"], name
    for _, block in recipe["expect"]:
      assert block[-1] in section, (name, block[-1])
  assert "    :mini:\n      Meant for: any CPU" in out and "    :shapes:\n      Meant for:" in out
  assert "ImageNet: see experiments/RESULTS.md." in out  # resnet's Expect, to its last line


def test_recipes_of_a_folder_are_read_not_run(tmp_path):
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "mine.py").write_text(
      '"""My recipe.\n\nARGS: size=small|big.\n\nExpect: nothing.\n"""\ndef get_config(arg=""):\n'
      '  raise SystemExit(3)\n')
  done = _run("-m", "jaxnet.cli.console", "recipes", "--dir=configs", cwd=tmp_path,
              env=dict(os.environ, PYTHONPATH=REPO))
  assert done.returncode == 0, done.stderr
  assert done.stdout.split("\n")[:4] == ["configs/mine.py", "    My recipe.", "    :ARGs: size=small|big.",
                                          "    Expect: nothing."]


def test_recipes_without_configs_names_the_fix(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  assert console.main(["recipes", f"--dir={tmp_path}"]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "--dir=" in err


def test_config_lists_every_key_with_its_default_and_help(capsys):
  assert console.main(["config"]) == 0
  lines = capsys.readouterr().out.splitlines()
  keys = config_lib.flat_keys(config_lib.with_model_options(config_lib.base_config()))
  assert [l.split(" = ")[0] for l in lines] == keys
  assert "batch_size = 256  # global, over all devices and hosts" in lines
  # Every key says what it does: a key added to base_config() without a comment fails here.
  assert [l for l in lines if "  # " not in l] == []
  assert console.main(["config", "optim.warm", "--config=vit:s16"]) == 0
  assert capsys.readouterr().out.splitlines() == [
      "optim.warmup_epochs = 0.0  # linear warmup from 0 to the peak LR",
      "optim.warmup_steps = 10000  # overrides warmup_epochs when > 0"]
  assert console.main(["config", "optm"]) == 2
  assert "did you mean optim" in capsys.readouterr().err


def test_recipes_run_by_name_from_any_folder_and_old_paths_still_work(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert config_lib.load("resnet50:fast").batch_size == 2048
  assert config_lib.load("configs/digits.py").model.name == "resnet_tiny"  # the layout before the move
  (tmp_path / "digits.py").write_text(
      "from jaxnet.core.config import base_config\ndef get_config():\n  c = base_config()\n"
      "  c.batch_size = 7\n  return c\n")
  assert config_lib.load("digits.py").batch_size == 7  # a file of the user's own
  assert config_lib.load("digits").batch_size == 64    # the recipe
  (tmp_path / "resnet50").mkdir()  # a folder named as a recipe: the name stays the recipe's
  assert config_lib.load("resnet50").batch_size == 1024
  (tmp_path / "resnet50" / "config.json").write_text(config_lib.load("digits").to_json_best_effort())
  assert config_lib.load("resnet50").batch_size == 64  # ... unless it is a workdir, as before
  with pytest.raises(FileNotFoundError, match="did you mean --config=resnet50"):
    config_lib.load("resnet5")


def test_the_recipes_are_package_data():
  # pyproject.toml's package discovery takes jaxnet/configs into a wheel (a non-editable install).
  setuptools = pytest.importorskip("setuptools")
  assert "jaxnet.configs" in setuptools.find_packages(REPO, include=["jaxnet*"])
