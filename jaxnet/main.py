"""Command line: python -m jaxnet.main --config=configs/NAME.py --workdir=DIR [--mode=train|eval]
[--config.KEY=VALUE ...].

An override of a key the config does not have (a typo) stops with an error
naming the key: the config is locked before the overrides are applied.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and logs.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval"],
                          "train: train (resuming if WORKDIR has checkpoints); eval: evaluate the "
                          "latest checkpoint.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  config = _CONFIG.value
  workdir = _WORKDIR.value
  logging.set_verbosity(logging.WARNING)
  # The command line is a front end to the Python API: the same runtime setup
  # (XLA flags, compilation cache, jax.distributed) and the same training code.
  from jaxnet import api, train
  try:
    if _MODE.value == "train":
      api.train(config, workdir)
    else:
      api.evaluate(workdir, config)
  except (FileNotFoundError, ValueError, train.NonFiniteLossError) as e:
    # Problems with the user's data or config: one clear message, no traceback.
    if os.environ.get("JAXNET_DEBUG"):
      raise
    print(f"error: {e}", file=sys.stderr)
    print("(set JAXNET_DEBUG=1 to see the traceback)", file=sys.stderr)
    sys.exit(1)


def _parse_flags(argv):
  """absl flag parsing, with config errors (a mistyped key, a wrong type) as one clear line."""
  try:
    rest = flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
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


def run():
  try:
    app.run(main, flags_parser=_parse_flags)
  except KeyboardInterrupt:
    sys.exit(130)


if __name__ == "__main__":
  run()
