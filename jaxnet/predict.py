"""Top-5 classes of image files under a trained model.

  python -m jaxnet.predict --workdir=DIR [--step=N] [--top=5] IMAGE [IMAGE ...]

Images are any file PIL reads; they are preprocessed like the training run's
eval data (see jaxnet/preprocess.py). Class names come from the dataset,
recorded in DIR/classes.json at train time.
"""

import argparse
import sys


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m jaxnet.predict", description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True, help="a training workdir with checkpoints")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  parser.add_argument("--top", type=int, default=5, help="classes to print per image")
  parser.add_argument("images", nargs="+", metavar="IMAGE")
  args = parser.parse_args(argv)

  from jaxnet import api, errors
  with errors.one_line_errors():
    model = api.restore(args.workdir, step=args.step)
    results = model.predict(args.images, top_k=args.top)
  for path, top in zip(args.images, results):
    print(path)
    for name, prob in top:
      print(f"  {prob:8.4f}  {name}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
