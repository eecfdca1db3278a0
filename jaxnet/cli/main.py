"""The train and eval command:

  python -m jaxnet.main --config=NAME[:ARG] --workdir=DIR [--mode=train|eval]
      [--config.KEY=VALUE ...] [--accept_config_changes=KEY,...]

The config is built by the same function as the Python API's (jaxnet.core.config.load):
the file's get_config(), locked, then the --config.KEY=VALUE overrides, each read as its
key's type. A key the config does not have is an error naming it. Around the training
code that notebooks run too (jaxnet.api), this command sets up the process (XLA flags, the
compilation cache, jax.distributed), holds the workdir's lock, turns SIGTERM and Ctrl-C
into a checkpoint and a clean stop, watches the other processes of a multi-process run, and
prints a problem jaxnet explains as one line.
"""

import contextlib
import sys

from absl import app, flags, logging

from jaxnet.cli import process
from jaxnet.core import config as config_lib
from jaxnet.core.errors import UserError

_CONFIG = flags.DEFINE_string("config", None, "A config file, jaxnet/configs/NAME.py[:ARG]. Override "
                              "its keys with --config.KEY=VALUE (keys: jaxnet/core/config.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and logs.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval"],
                          "train: train (resuming if WORKDIR has checkpoints); eval: evaluate the "
                          "latest checkpoint.")
_ACCEPT = flags.DEFINE_list(
    "accept_config_changes", [],
    "Config keys that may differ from the workdir's config.json (or 'all'), on resume or in "
    "--mode=eval. Without it, a change to any key that alters training or what the model sees "
    "stops the run (or the eval) with a list of the changes.")
flags.mark_flags_as_required(["config", "workdir"])

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
    print(usage())
    sys.exit(0)
  try:
    argv, overrides = process.split_command_line(argv)
    rest = flags.FLAGS(argv)
    parsed["config"] = config_lib.load(_CONFIG.value, overrides)
  except (flags.Error, UserError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    print("Run with --helpfull for flags; config keys are listed in jaxnet/core/config.py.",
          file=sys.stderr)
    sys.exit(2)
  return rest


def usage() -> str:
  return (f"{__doc__.strip()}\n\nflags:{flags.FLAGS.module_help(sys.modules[__name__]).split(':', 1)[1]}\n"
          "  --verbosity: 0 shows INFO logs, 1 also DEBUG (default: WARNING only)\n"
          "  --helpfull: also the flags of absl and jax\n\n"
          "Recipes and their :ARGs: jaxnet recipes (or python -m jaxnet.cli.console recipes).")


def run():
  parsed = {}  # the config the flags' parser builds, handed to main
  try:
    app.run(lambda argv: main(argv, parsed["config"]), flags_parser=lambda argv: _parse_flags(argv, parsed))
  except KeyboardInterrupt:  # Ctrl-C before training started (or outside it)
    sys.exit(130)


if __name__ == "__main__":
  run()
