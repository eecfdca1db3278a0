"""Command line: python -m jaxnet.main --config=configs/NAME.py --workdir=DIR [--mode=train|eval]
[--config.KEY=VALUE ...].

An override of a key the config does not have (a typo) stops with an error
naming the key: the config is locked before the overrides are applied.
"""

import os
import sys
import traceback

from absl import app, flags, logging
from ml_collections import config_flags

from jaxnet import config_io, errors

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and logs.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval"],
                          "train: train (resuming if WORKDIR has checkpoints); eval: evaluate the "
                          "latest checkpoint.")
_ACCEPT = flags.DEFINE_list(
    "accept_config_changes", [],
    "Resuming a workdir: config keys that may differ from its config.json (or 'all'). "
    "Without it, a change to any key that alters training stops the run with a list of changes.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  config = _CONFIG.value
  workdir = _WORKDIR.value
  if not _verbosity_given(sys.argv):
    logging.set_verbosity(logging.WARNING)  # absl's INFO default would print orbax's chatter
  # The command line is a front end to the Python API: the same runtime setup
  # (XLA flags, compilation cache, jax.distributed) and the same training code.
  from jaxnet import api
  with errors.one_line_errors():
    if _MODE.value == "train":
      result = api.train(config, workdir, accept_config_changes=_ACCEPT.value)
      if result.get("signal") == "SIGINT":
        sys.exit(130)  # the shell's convention for a run stopped by Ctrl-C
    else:
      api.evaluate(workdir, config)


def _parse_flags(argv):
  """absl flag parsing, with config errors (a mistyped key, a wrong type) as one clear line."""
  try:
    rest = flags.FLAGS(argv)
  except Exception as e:  # noqa: BLE001  (anything the config file raised, too)
    config_path = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")), "")
    if _raised_in(e, config_path.split(":")[0]):
      print(f"error: {config_io.config_file_error(config_path.split(':')[0], e)}", file=sys.stderr)
      sys.exit(2)
    detail = str(e)
    if detail[:1] in "'\"" and detail[-1:] == detail[:1]:
      detail = detail[1:-1].replace("\\n", " ").replace("\n", " ").replace('\\"', '"')
    overrides = [a for a in argv[1:] if a.startswith("--config.")]
    bad = [a for a in overrides if a.split("=")[0][len("--config."):].split(".")[-1] in detail]
    where = f"{bad[0]}: " if bad else ""
    if isinstance(e, (AttributeError, KeyError)) and bad:
      key = bad[0].split("=")[0][len("--config."):]
      detail = f"the config has no key {key!r}. {detail.split(' ', 1)[-1] if 'Did you mean' in detail else ''}"
    print(f"error: {where}{detail}", file=sys.stderr)
    print("Run with --helpfull for flags; config keys are listed in jaxnet/config_base.py.",
          file=sys.stderr)
    sys.exit(2)
  try:
    _CONFIG.value.keys()  # the config file is loaded lazily: surface a bad path here
  except OSError as e:
    print(f"error: could not load --config: {str(e).splitlines()[-1].strip()}", file=sys.stderr)
    sys.exit(2)
  return rest


def _verbosity_given(argv) -> bool:
  return any(a.split("=")[0] in ("--verbosity", "-v", "--v") for a in argv[1:])


def _raised_in(error: BaseException, path: str) -> bool:
  """Whether `error` came from running the file at `path` (a config file's own bug)."""
  if not path or not os.path.exists(path):
    return False
  if isinstance(error, SyntaxError):
    return os.path.abspath(error.filename or "") == os.path.abspath(path)
  return any(os.path.abspath(f.filename) == os.path.abspath(path)
             for f in traceback.extract_tb(error.__traceback__))


def run():
  try:
    app.run(main, flags_parser=_parse_flags)
  except KeyboardInterrupt:  # Ctrl-C before training started (or outside it)
    sys.exit(130)


if __name__ == "__main__":
  run()
