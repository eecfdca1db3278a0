"""Write a small COCO-format detection dataset of shapes (jaxnet/tools/make_shapes.py):

    python -m jaxnet.cli.make_shapes DIR --train 1000 --val 200
"""

import sys

from jaxnet import cli
from jaxnet.tools.make_shapes import make_shapes


def main(argv=None) -> None:
  parser = cli.parser("make_shapes", __doc__.split("\n\n")[0])
  parser.add_argument("dir", help="output root; annotations/, train/ and val/ go inside")
  parser.add_argument("--train", type=int, default=1000, help="train images")
  parser.add_argument("--val", type=int, default=200, help="val images")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  make_shapes(args.dir, args.train, args.val, args.seed)
  print(f"wrote {args.dir}: train with --config=retinanet:shapes --config.data.dir={args.dir}")


if __name__ == "__main__":
  main(sys.argv[1:])
