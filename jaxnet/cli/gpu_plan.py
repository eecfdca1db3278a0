"""Compile jaxnet's train and eval steps for GPUs you do not have, and say what they would do
(jaxnet/tools/gpu_plan.py; docs/gpu_plan.md):

  python -m jaxnet.cli.gpu_plan --config=resnet50 --target=h100 --gpus=8 \
      [--config.KEY=VALUE ...] [--hosts=N] [--find-max-batch] [--dump=DIR] [--json] [--layers]
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from jaxnet import cli
from jaxnet.cli import process


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  parser = cli.parser("gpu_plan", __doc__.split("\n\n")[0])
  parser.add_argument("--config", required=True, help="NAME[:ARG], as for training")
  parser.add_argument("--target", default="h100", help="h100, h200, a100, or a .txtpb path")
  parser.add_argument("--gpus", type=int, default=8, help="GPUs in all (over all hosts)")
  parser.add_argument("--hosts", type=int, default=1)
  parser.add_argument("--find-max-batch", action="store_true",
                      help="also find the largest per-GPU batch that fits (one compile per try: "
                           "minutes; each try is named on stderr as it starts)")
  parser.add_argument("--dump", default="", help="write the optimized HLO of both steps here")
  parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
  parser.add_argument("--layers", action="store_true",
                      help="also print the train step's kernels by layer, part and pass (bytes, FLOPs, "
                           "roofline ms)")
  parser.add_argument("--install-plugin", action="store_true",
                      help="first install the CUDA plugin wheels of this jaxlib into jaxnet's cache "
                           "folder (not into the Python environment), if they are not there")
  with process.one_line_errors():
    from jaxnet.core import config as config_lib
    from jaxnet.tools import gpu_plan
    rest, overrides = process.split_command_line(argv)
    args = parser.parse_args(rest)
    # Before jax starts: compile on this CPU process, never start the CUDA backend (jax#28376),
    # with the plugin from jaxnet's cache folder (never installed into the environment).
    os.environ["JAX_PLATFORMS"] = "cpu"
    prepare_plugin(args.install_plugin)
    gpu_plan.check_plugin()
    process.apply_xla_flags()
    config = config_lib.load(args.config, overrides)
    log = lambda line: print(line, file=sys.stderr, flush=True)
    result = gpu_plan.plan(config, target=args.target, gpus=args.gpus, hosts=args.hosts,
                           dump=args.dump, find_max_batch=args.find_max_batch, log=log)
  if args.json:
    print(json.dumps(result, indent=1, default=str))
  else:
    print(gpu_plan.table(result))
    if args.layers:
      print("\n".join(gpu_plan.layer_lines(result)))


def prepare_plugin(install: bool) -> None:
  """The plugin folder on sys.path, first installed (`install`) unless it holds this jaxlib's
  plugin: a folder holding another jaxlib's is replaced, where skipping it (as when it was only
  checked to exist) gave back the very mismatch that advised --install-plugin."""
  from jaxnet.tools import gpu_plan
  folder = gpu_plan.plugin_dir()
  if install and not gpu_plan.folder_matches(folder):
    install_plugin(folder)
  if os.path.isdir(folder):
    sys.path.insert(0, folder)


def install_plugin(target: str) -> None:
  """pip installs the CUDA plugin wheels of this jaxlib (cuda12, else cuda13) into `target`,
  whole or not at all (a temporary folder beside it, renamed when complete)."""
  import importlib.metadata
  from jaxnet.core.errors import UserError
  version = importlib.metadata.version("jaxlib")
  os.makedirs(os.path.dirname(target), exist_ok=True)
  for cuda in (12, 13):
    staging = tempfile.mkdtemp(prefix=".install-", dir=os.path.dirname(target))
    print(f"installing jax-cuda{cuda}-plugin=={version} and jax-cuda{cuda}-pjrt=={version} into "
          f"{target} ...", file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", staging,
                           f"jax-cuda{cuda}-plugin=={version}", f"jax-cuda{cuda}-pjrt=={version}"])
    if done.returncode == 0:
      # A mismatched folder there is moved aside first (os.replace cannot overwrite a folder
      # that holds files), then deleted once the new one is in place.
      old = None
      if os.path.exists(target):
        old = tempfile.mkdtemp(prefix=".replaced-", dir=os.path.dirname(target))
        os.replace(target, os.path.join(old, "plugin"))
      os.replace(staging, target)
      if old:
        shutil.rmtree(old, ignore_errors=True)
      return
    shutil.rmtree(staging, ignore_errors=True)
  raise UserError(f"pip could not install the CUDA plugin wheels of jaxlib {version} (see above): "
                  f"check the network, or install them yourself with pip install --no-deps --target "
                  f"{target} jax-cuda12-plugin=={version} jax-cuda12-pjrt=={version}")


if __name__ == "__main__":
  main()
