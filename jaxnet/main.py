"""Command line: python -m jaxnet.main --config=configs/NAME.py[:ARG] --workdir=DIR
[--mode=train|eval] [--config.KEY=VALUE ...] [--accept_config_changes=KEY,...].

The config is built by the same function as the Python API's (config_io.load):
the file's get_config(), locked, then the --config.KEY=VALUE overrides, each read
as its key's type. A key the config does not have is an error naming it.
"""

import sys

from absl import app, flags, logging

from jaxnet import config_io, errors

_CONFIG = flags.DEFINE_string("config", None, "A config file, configs/NAME.py[:ARG]. Override "
                              "its keys with --config.KEY=VALUE (keys: jaxnet/config_base.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and logs.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval"],
                          "train: train (resuming if WORKDIR has checkpoints); eval: evaluate the "
                          "latest checkpoint.")
_ACCEPT = flags.DEFINE_list(
    "accept_config_changes", [],
    "Resuming a workdir: config keys that may differ from its config.json (or 'all'). "
    "Without it, a change to any key that alters training stops the run with a list of changes.")
flags.mark_flags_as_required(["config", "workdir"])

_config = []  # the config _parse_flags built, for main


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not any(a.split("=")[0] in ("--verbosity", "-v", "--v") for a in sys.argv[1:]):
    logging.set_verbosity(logging.WARNING)  # absl's INFO default would print orbax's chatter
  # The command line is a front end to the Python API: the same runtime setup
  # (XLA flags, compilation cache, jax.distributed) and the same training code.
  from jaxnet import api
  config, workdir = _config[0], _WORKDIR.value
  with errors.one_line_errors():
    if _MODE.value == "train":
      result = api.train(config, workdir, accept_config_changes=_ACCEPT.value)
      if result.get("signal") == "SIGINT":
        sys.exit(130)  # the shell's convention for a run stopped by Ctrl-C
    else:
      api.evaluate(workdir, config)


def _parse_flags(argv):
  """absl's flags, then the config: any problem is one line on stderr and exit status 2."""
  try:
    argv, overrides = config_io.split_command_line(argv)
    rest = flags.FLAGS(argv)
    _config.append(config_io.load(_CONFIG.value, overrides))
  except (flags.Error, errors.UserError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    print("Run with --helpfull for flags; config keys are listed in jaxnet/config_base.py.",
          file=sys.stderr)
    sys.exit(2)
  return rest


def run():
  try:
    app.run(main, flags_parser=_parse_flags)
  except KeyboardInterrupt:  # Ctrl-C before training started (or outside it)
    sys.exit(130)


if __name__ == "__main__":
  run()
