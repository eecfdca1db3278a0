"""Pretrained weights into a jaxnet workdir, without training (jaxnet/tools/weights):

  python -m jaxnet.cli.weights import --from=FILE.safetensors|FILE.pth|hf-hub:OWNER/NAME \
      --config=NAME[:ARG] --workdir=DIR [--no-data] [--config.KEY=VALUE ...]

The config names the model (its architecture must be the weights') and the data (its classes,
and the eval split that eval and predict use). The workdir then holds the checkpoint of
step 0: `--mode=eval`, `jaxnet.cli.predict` and `jaxnet.cli.export` take it as a trained one.
The way back out is `python -m jaxnet.cli.export --format=torch`.

--no-data imports without the recipe's data (none on this machine, say): the head is as wide
as the weights' class layer (`--config.model.num_classes=N` where set), predict shows the
classes by index, and the checkpoint holds no data position. Without --no-data, data that is
not there is one line naming it. The workdir's own config fine-tunes it:
`jaxnet train --config=DIR --workdir=DIR --config.data.dir=DATA` (its data order from the
beginning, its class names then recorded); an eval needs the data too (`--config.data.dir`).
Data of another class count than the head's is one line naming the fix: a new workdir with
`--config.init.weights=DIR`.
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
  parser.add_argument("--no-data", dest="no_data", action="store_true",
                      help="read none of the recipe's data: the head as wide as the weights', classes "
                           "shown by index until a training records their names")
  with process.one_line_errors():
    from jaxnet.core import config as config_lib
    rest, overrides = process.split_command_line(argv)
    args = parser.parse_args(rest)
    process.setup()
    config = config_lib.load(args.config, overrides)
    from jaxnet.tools.weights import pretrained
    loaded = pretrained.import_to_workdir(config, args.workdir, args.source, data=not args.no_data)
  # The count is of the arrays that came from the weights: a re-initialised class layer's are not.
  # A fine-tune trains the workdir with its own config (the weights and their preprocessing in it).
  data_dir = " --config.data.dir=DIR" if args.no_data else ""
  if loaded["head"]:
    print(f"imported {loaded['arrays']} arrays of {args.source} into {args.workdir} (checkpoint of step "
          f"0); the class layer's {loaded['head_arrays']} arrays of the model's {loaded['of']} are freshly "
          f"initialised ({loaded['head']}): its eval and predictions are at chance until it is trained "
          f"(jaxnet train --config={args.workdir} --workdir={args.workdir}{data_dir} fine-tunes it)")
  else:
    use = (f"predict with it: jaxnet predict --workdir={args.workdir} IMAGE" if args.no_data
           else f"evaluate it with jaxnet eval --workdir={args.workdir}")
    print(f"imported {loaded['arrays']} arrays of {args.source} into {args.workdir} (checkpoint of step 0): {use}")
  if args.no_data:
    how = "" if loaded["head"] else (f" (jaxnet train --config={args.workdir} --workdir={args.workdir}{data_dir} "
                                     f"fine-tunes it)")
    print(f"without data: {loaded['classes']} classes, shown by index until a training on the recipe's data "
          f"records their names{how}; an eval needs that data too")
  return 0


if __name__ == "__main__":
  sys.exit(main())
