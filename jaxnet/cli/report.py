"""Plots and a summary of one or more workdirs' metrics.jsonl (jaxnet/tools/report.py):

  python -m jaxnet.cli.report WORKDIR [WORKDIR ...] [--out DIR]
"""

import os
import sys

from jaxnet import cli


def main(argv=None):
  parser = cli.parser("report", __doc__.split("\n\n")[0])
  parser.add_argument("workdirs", nargs="+", metavar="WORKDIR")
  parser.add_argument("--out", default=None, help="output directory for PNGs and summary")
  args = parser.parse_args(argv)
  missing = [w for w in args.workdirs if not os.path.exists(os.path.join(w, "metrics.jsonl"))]
  if missing:
    print(f"error: no metrics.jsonl in {', '.join(missing)}", file=sys.stderr)
    return 2
  from jaxnet.tools import report
  report.report(args.workdirs, args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
