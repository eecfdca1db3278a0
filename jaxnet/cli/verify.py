"""Checks a workdir's numbers: re-evaluates its reported checkpoints, compares data, versions and code (jaxnet/tools/verify.py):

  python -m jaxnet.cli.verify WORKDIR [--step=N] [--retrain=STEPS] [--scratch=DIR]

Prints a table (check, recorded, now, verdict) and exits 0 only if every check holds:
the eval metrics of each checkpoint metrics.jsonl reports (bit for bit on the run's device
kind and count, to a tolerance on others), the data's identity per split, the package
versions, jaxnet's version, git revision and uncommitted changes. --retrain=STEPS re-runs
the first STEPS steps into a scratch workdir and compares the logged train losses,
naming the first step that differs. Devices, Python and XLA flags are shown as notes, and
so is the init.weights file of a run that started from one (the same, another or missing:
only --retrain reads it again, and refuses where it is not the run's).
See docs/reproducibility.md.
"""

import sys

from jaxnet import cli
from jaxnet.cli import process


def main(argv=None) -> int:
  parser = cli.parser("verify", __doc__.split("\n\n")[0])
  parser.add_argument("workdir", help="the workdir of a training run")
  parser.add_argument("--step", type=int, default=None,
                      help="re-evaluate this checkpoint only (default: every kept one with a recorded eval)")
  parser.add_argument("--no-eval", dest="evaluate", action="store_false",
                      help="compare data, versions and code only (no re-evaluation)")
  parser.add_argument("--retrain", type=int, default=0, metavar="STEPS",
                      help="also re-run the first STEPS steps and compare the logged train losses")
  parser.add_argument("--scratch", default=None,
                      help="with --retrain: the workdir to re-run into (default: a temporary one, removed)")
  args = parser.parse_args(argv)
  if args.retrain < 0:
    parser.error(f"--retrain takes a number of steps >= 1, not {args.retrain}")
  with process.one_line_errors():
    process.setup()
    from jaxnet import api
    from jaxnet.tools import verify
    api.show_reports(progress=False)  # the table is the output; warnings still show
    try:
      checks = verify.verify(args.workdir, evaluate=args.evaluate, step=args.step, retrain=args.retrain,
                             scratch=args.scratch)
    finally:  # as it was, for a caller in the same process (a test, `jaxnet verify` from Python)
      api.show_reports()
  print(verify.table(checks))
  failed = [c for c in checks if c.holds is False]
  print(f"{len(checks) - len(failed)} of {len(checks)} rows hold" if failed
        else f"verified: every check of {args.workdir} holds")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
