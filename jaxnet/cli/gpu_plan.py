"""Compile jaxnet's train and eval steps for GPUs you do not have, and say what they would do
(jaxnet/tools/gpu_plan.py; docs/gpu_plan.md):

  python -m jaxnet.cli.gpu_plan --config=configs/resnet50.py --target=h100 --gpus=8 \
      [--config.KEY=VALUE ...] [--hosts=N] [--find-max-batch] [--dump=DIR] [--json]
"""

import argparse
import json
import os
import sys

from jaxnet.cli import process


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  parser = argparse.ArgumentParser(prog="python -m jaxnet.cli.gpu_plan", description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", required=True, help="configs/NAME.py[:ARG], as for training")
  parser.add_argument("--target", default="h100", help="h100, h200, a100, or a .txtpb path")
  parser.add_argument("--gpus", type=int, default=8, help="GPUs in all (over all hosts)")
  parser.add_argument("--hosts", type=int, default=1)
  parser.add_argument("--find-max-batch", action="store_true",
                      help="also find the largest per-GPU batch that fits (several compiles)")
  parser.add_argument("--dump", default="", help="write the optimized HLO of both steps here")
  parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
  with process.one_line_errors():
    from jaxnet.core import config as config_lib
    from jaxnet.tools import gpu_plan
    rest, overrides = config_lib.split_command_line(argv)
    args = parser.parse_args(rest)
    # Before jax starts: compile on this CPU process, never start the CUDA backend (jax#28376).
    os.environ["JAX_PLATFORMS"] = "cpu"
    gpu_plan.check_plugin()
    process.apply_xla_flags()
    config = config_lib.load(args.config, overrides)
    log = lambda line: print(line, file=sys.stderr, flush=True)
    result = gpu_plan.plan(config, target=args.target, gpus=args.gpus, hosts=args.hosts,
                           dump=args.dump, find_max_batch=args.find_max_batch, log=log)
  print(json.dumps(result, indent=1, default=str) if args.json else gpu_plan.table(result))


if __name__ == "__main__":
  main()
