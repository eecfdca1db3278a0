"""The train and eval command:

  jaxnet train --config=RECIPE[:ARG] --workdir=DIR [--config.KEY=VALUE ...]
  jaxnet eval --workdir=DIR [--config=RECIPE[:ARG]] [--config.KEY=VALUE ...]
  (python -m jaxnet.main ... [--mode=train|eval], the same command)

The config is built by the same function as the Python API's (jaxnet.core.config.load):
the recipe's or file's get_config(), locked, then the --config.KEY=VALUE overrides, each
read as its key's type. A key the config does not have is an error naming it. Around the
training code that notebooks run too (jaxnet.api), this command sets up the process (XLA
flags, the compilation cache, jax.distributed), holds the workdir's lock, turns SIGTERM and
Ctrl-C into a checkpoint and a clean stop, watches the other processes of a multi-process
run, and prints a problem jaxnet explains as one line.
"""

import contextlib
import difflib
import os
import sys
import textwrap

from absl import app, flags, logging

from jaxnet.cli import process
from jaxnet.core import config as config_lib
from jaxnet.core.errors import UserError

_CONFIG = flags.DEFINE_string(
    "config", None, "A recipe by name (jaxnet recipes: digits, resnet50:fast, ...) or the path of "
    "a config file, FILE.py[:ARG]. Required to train; eval reads the workdir's config.json "
    "without it. Override its keys with --config.KEY=VALUE (jaxnet config lists them).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and logs.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval"],
                          "train: train (resuming if WORKDIR has checkpoints); eval: evaluate the "
                          "latest checkpoint.")
_ACCEPT = flags.DEFINE_list(
    "accept_config_changes", [],
    "Config keys that may differ from the workdir's config.json (or 'all'), on resume or in "
    "eval. Without it, a change to any key that alters training or what the model sees "
    "stops the run (or the eval) with a list of the changes.")
flags.mark_flags_as_required(["workdir"])

def main(argv, config):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not any(a.split("=")[0] in ("--verbosity", "-v", "--v") for a in sys.argv[1:]):
    logging.set_verbosity(logging.WARNING)  # absl's INFO default would print orbax's chatter
  workdir = _WORKDIR.value
  with process.one_line_errors():
    process.setup(config.distributed)
    if _MODE.value == "train":
      train(config, workdir, _ACCEPT.value, config_file=_CONFIG.value)
    else:
      from jaxnet import api
      api.evaluate(workdir, config, accept_config_changes=_ACCEPT.value)


def train(config, workdir: str, accept_config_changes=(), config_file: str | None = None) -> dict:
  """api.train (which holds the workdir's lock), with SIGTERM/Ctrl-C stopping the loop and the
  other processes of a multi-process run watched. A run stopped by a signal says where it
  saved; Ctrl-C exits with the shell's status 130."""
  from jaxnet import api
  from jaxnet.cli import heartbeat
  from jaxnet.core import train as train_lib
  control = train_lib.RunControl()
  with contextlib.ExitStack() as stack:  # the workdir's lock: its gate, inside api.train
    signals = stack.enter_context(process.StopSignals())
    control.stop_requested = signals.requested
    watch = stack.enter_context(heartbeat.PeerWatch(config.distributed.heartbeat_timeout_sec, control))
    try:
      result = api.train(config, workdir, accept_config_changes=accept_config_changes, control=control,
                         config_file=config_file)
    except Exception as e:
      if not isinstance(e, UserError):
        # A process that died fails the others' collectives first (gloo): let the
        # heartbeat name it, in one line, instead of this exception.
        watch.wait_for_verdict(e)
      raise
  if "stopped_at_step" in result:
    interrupted = signals.received == "SIGINT"
    print(f"{'interrupted' if interrupted else 'preempted'}: checkpoint saved at step "
          f"{result['stopped_at_step']}; rerun the same command to resume", flush=True)
    if interrupted:
      sys.exit(130)  # the shell's convention for a run stopped by Ctrl-C
  return result


def _parse_flags(argv, parsed: dict):
  """absl's flags, then the config (into `parsed`, for main): any problem is one line on
  stderr and exit status 2.
  --help (-h) prints jaxnet's own flags and exits 0; --helpfull adds absl's ~60."""
  if any(a in ("--help", "-h", "--helpshort") for a in argv[1:]):
    print(usage("eval" if "--mode=eval" in argv[1:] else "train"))
    sys.exit(0)
  try:
    argv, overrides = process.split_command_line(argv)
    rest = flags.FLAGS(argv)
    spec = _CONFIG.value
    if spec is None:
      if _MODE.value == "train":
        raise UserError("jaxnet train needs --config=RECIPE (jaxnet recipes lists them) or "
                        f"--config=FILE.py{_resume_hint(_WORKDIR.value)}")
      spec = _WORKDIR.value  # eval: the config the workdir's run recorded
      if not os.path.isfile(os.path.join(spec, "config.json")):
        raise UserError(f"no run in {spec}: it has no config.json (a workdir that jaxnet train "
                        f"wrote, or a bundle)")
    parsed["config"] = config_lib.load(spec, overrides)
  except flags.UnrecognizedFlagError as e:
    _exit_usage(f"{e}{_config_key_hint(e.flagname, e.flagvalue)}", pointer=True)
  except flags.Error as e:
    _exit_usage(str(e), pointer=True)
  except (UserError, FileNotFoundError) as e:
    _exit_usage(str(e), pointer=False)  # a config error names its fix itself
  return rest


def _resume_hint(workdir: str) -> str:
  """"; to resume DIR: --config=digits" where DIR's run recorded the config it started with."""
  try:
    with open(os.path.join(workdir, "config_file.py")) as f:
      first = f.readline()
  except OSError:
    return ""
  started_with = first.rpartition("started with: ")[2].strip()
  return f"; to resume {workdir}: --config={started_with}" if started_with else ""


def _exit_usage(message: str, pointer: bool):
  print(f"error: {message}", file=sys.stderr)
  if pointer:
    print("Flags: --help (--helpfull for absl's too); config keys: jaxnet config [KEY_PREFIX].",
          file=sys.stderr)
  sys.exit(2)


def _config_key_hint(flag: str, value: str) -> str:
  """"; did you mean --config.batch_size=32?" for a config key given as a flag of its own."""
  keys = config_lib.flat_keys(config_lib.with_model_options(config_lib.base_config()))
  name = flag.removeprefix("no")  # absl reads --noFLAG as FLAG=false
  matches = [k for k in keys if k == name or k.endswith(f".{name}")] or \
      difflib.get_close_matches(name, keys, n=1)
  if not matches:
    return ""
  shown = value.split("=", 1)[1] if "=" in value else "VALUE"
  return f"; did you mean --config.{matches[0]}={shown}?"


def usage(mode: str = "train") -> str:
  shown = ("config", "workdir", "accept_config_changes") if mode == "train" else \
      ("workdir", "config", "accept_config_changes")
  flag_help = "\n".join(_flag_help(flags.FLAGS[name]) for name in shown)
  if mode == "train":
    head = ("jaxnet train --config=RECIPE[:ARG] --workdir=DIR [--config.KEY=VALUE ...]\n\n"
            "Trains the recipe (jaxnet recipes lists them; or your own config file, FILE.py[:ARG]) "
            "into DIR:\ncheckpoints, metrics.jsonl, config.json, TensorBoard events. Rerunning "
            "the same command resumes from\nDIR's latest checkpoint; Ctrl-C or SIGTERM saves one "
            "and stops. (python -m jaxnet.main ..., the same.)")
  else:
    head = ("jaxnet eval --workdir=DIR [--config=RECIPE[:ARG]] [--config.KEY=VALUE ...]\n\n"
            "Evaluates DIR's latest checkpoint with the config its run recorded (DIR/config.json) "
            "and prints\nthe metrics. A --config or override that changes what the model sees is "
            "refused unless named in\n--accept_config_changes. (python -m jaxnet.main --mode=eval "
            "..., the same.)")
  return (f"{head}\n\nflags:\n{flag_help}\n"
          "  --config.KEY=VALUE: set a config key (jaxnet config [KEY_PREFIX] lists them)\n"
          "  --mode: train|eval (jaxnet train and jaxnet eval set it)\n"
          "  --verbosity: 0 shows INFO logs, 1 also DEBUG (default: WARNING only)\n"
          "  --helpfull: also the flags of absl and jax")


def _flag_help(flag) -> str:
  default = "" if flag.default in (None, []) else f" (default: {flag.default_as_str})"
  if flag.name == "workdir":
    default = " (required)"
  return textwrap.fill(f"--{flag.name}: {flag.help}{default}", width=96, initial_indent="  ",
                       subsequent_indent="      ")


def run():
  parsed = {}  # the config the flags' parser builds, handed to main
  try:
    app.run(lambda argv: main(argv, parsed["config"]), flags_parser=lambda argv: _parse_flags(argv, parsed))
  except KeyboardInterrupt:  # Ctrl-C before training started (or outside it)
    sys.exit(130)


if __name__ == "__main__":
  run()
