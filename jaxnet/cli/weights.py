"""Pretrained weights into a jaxnet workdir, without training (jaxnet/tools/weights):

  python -m jaxnet.cli.weights import --from=FILE.safetensors|FILE.pth|hf-hub:OWNER/NAME \
      --config=NAME[:ARG] --workdir=DIR [--config.KEY=VALUE ...]

The config names the model (its architecture must be the weights') and the data (its classes,
and the eval split that eval and predict use; `--config.data.source=synthetic
--config.data.num_classes=1000` where there is none). The workdir then holds the checkpoint of
step 0: `--mode=eval`, `jaxnet.cli.predict` and `jaxnet.cli.export` take it as a trained one.
The way back out is `python -m jaxnet.cli.export --format=torch`.
"""

import sys

from jaxnet import cli
from jaxnet.cli import process


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  parser = cli.parser("weights", __doc__.split("\n\n")[0])
  parser.add_argument("action", choices=["import"])
  parser.add_argument("--from", dest="source", required=True,
                      help="a .safetensors or .pth file (torchvision/timm names), or hf-hub:OWNER/NAME")
  parser.add_argument("--config", required=True, help="NAME[:ARG]: the model and the data")
  parser.add_argument("--workdir", required=True, help="a new workdir to write")
  with process.one_line_errors():
    from jaxnet.core import config as config_lib
    rest, overrides = process.split_command_line(argv)
    args = parser.parse_args(rest)
    process.setup()
    config = config_lib.load(args.config, overrides)
    from jaxnet.tools.weights import pretrained
    loaded = pretrained.import_to_workdir(config, args.workdir, args.source)
  # The count is of the arrays that came from the weights: a re-initialised class layer's are not.
  if loaded["head"]:
    print(f"imported {loaded['arrays']} arrays of {args.source} into {args.workdir} (checkpoint of step "
          f"0); the class layer's {loaded['head_arrays']} arrays of the model's {loaded['of']} are freshly "
          f"initialised ({loaded['head']}): its eval and predictions are at chance until it is trained "
          f"(jaxnet train --config={args.config} --workdir={args.workdir} fine-tunes it)")
  else:
    print(f"imported {loaded['arrays']} arrays of {args.source} into {args.workdir} (checkpoint of step 0): "
          f"evaluate it with jaxnet eval --workdir={args.workdir}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
