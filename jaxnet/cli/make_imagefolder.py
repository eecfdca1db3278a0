"""Write a synthetic ImageNet-style JPEG folder that a small CNN can learn
(jaxnet/tools/make_imagefolder.py):

    python -m jaxnet.cli.make_imagefolder DIR --classes 10 --per-class 50
"""

import sys

from jaxnet import cli
from jaxnet.tools.make_imagefolder import make_imagefolder


def main(argv=None) -> None:
  parser = cli.parser("make_imagefolder", __doc__.split("\n\n")[0])
  parser.add_argument("dir", help="output root; train/ and val/ go inside")
  parser.add_argument("--classes", type=int, default=10)
  parser.add_argument("--per-class", type=int, default=50, help="train images per class")
  parser.add_argument("--val-per-class", type=int, default=None,
                      help="val images per class (default: per-class / 5)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--noise", type=float, default=0.05,
                      help="std of the pixel noise, as a fraction of 255: it sets the JPEG "
                           "entropy, hence decode cost (0.05: ~90 KiB per image, like "
                           "ImageNet's bytes per pixel; 0: ~55 KiB)")
  args = parser.parse_args(argv)
  make_imagefolder(args.dir, args.classes, args.per_class, args.val_per_class, args.seed,
                   noise=args.noise)
  print(f"wrote {args.dir}/train and {args.dir}/val")


if __name__ == "__main__":
  main(sys.argv[1:])
