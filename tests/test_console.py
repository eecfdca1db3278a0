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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*argv, cwd=REPO):
  return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=120)


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
  assert console.main(["trian", "--config=configs/digits.py"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "'trian'" in err and "train, eval, recipes" in err


def test_a_tool_runs_with_its_arguments(capsys):
  with pytest.raises(SystemExit) as exit_:
    console.main(["summary", "--help"])
  assert exit_.value.code == 0
  assert "--image-size" in capsys.readouterr().out


def test_train_and_eval_are_jaxnet_main_with_their_mode(tmp_path):
  done = _run("-m", "jaxnet.cli.console", "train", "--mode=eval", "--config=configs/digits.py",
              f"--workdir={tmp_path}")
  assert done.returncode == 2 and "drop --mode" in done.stderr
  # eval of a workdir without checkpoints: jaxnet.main's own one-line refusal, so --mode=eval ran.
  done = _run("-m", "jaxnet.cli.console", "eval", "--config=configs/digits.py",
              f"--workdir={tmp_path / 'w'}")
  assert done.returncode == 1, done.stderr
  assert f"no checkpoint in {tmp_path / 'w'}" in done.stderr and "Traceback" not in done.stderr


def test_jaxnet_main_help_explains_its_own_flags():
  done = _run("-m", "jaxnet.main", "--help")
  assert done.returncode == 0, done.stderr
  for flag in ("--config", "--workdir", "--mode", "--accept_config_changes", "--verbosity",
               "--helpfull"):
    assert f"  {flag}:" in done.stdout, flag
  assert len(done.stdout.splitlines()) < 45  # not absl's ~60 flags
  assert "--only_check_args" not in done.stdout


def test_recipes_lists_every_config_with_its_args(tmp_path):
  done = _run("-m", "jaxnet.cli.console", "recipes")
  assert done.returncode == 0, done.stderr
  listed = [l for l in done.stdout.splitlines() if l.startswith("configs/")]
  assert listed == [f"configs/{os.path.basename(p)}" for p in sorted(glob.glob(f"{REPO}/configs/*.py"))]
  out = done.stdout
  assert "configs/vit.py\n" in out and "ti16, s16, b16, l16, h14" in out
  assert "depth=18|34|50|101|152" in out and "recipe=coco|shapes" in out
  assert "configs/digits.py\n    Quick start" in out
  # Read, not run: a config whose get_config would fail is still described.
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "mine.py").write_text(
      '"""My recipe.\n\nARGS: size=small|big.\n"""\ndef get_config(arg=""):\n  raise SystemExit(3)\n')
  done = _run("-m", "jaxnet.cli.console", "recipes", cwd=tmp_path)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split("\n")[:3] == ["configs/mine.py", "    My recipe.", "    :ARGs: size=small|big."]


def test_recipes_without_configs_names_the_fix(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  assert console.main(["recipes", f"--dir={tmp_path}"]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "--dir=" in err
