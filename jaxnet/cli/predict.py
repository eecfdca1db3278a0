"""Top-5 classes of image files under a trained model.

  python -m jaxnet.cli.predict --workdir=DIR [--step=N] [--top=5] IMAGE|FOLDER [...]

Images are any file PIL reads; they are preprocessed like the training run's
eval data (see jaxnet/tools/predictor.py). A folder stands for the image files in it
(.jpg/.jpeg/.png/.webp, sorted, not hidden, not its subfolders), as ImageFolder
reads a class folder. Class names come from the dataset, recorded in
DIR/classes.json at train time.
"""

import argparse
import os
import sys

from jaxnet.cli import process


def _expand_folders(paths: list[str]) -> list[str]:
  """Each folder replaced by its image files, in name order; other paths kept."""
  from jaxnet.core.data.imagefolder import EXTENSIONS_TEXT, is_image_name
  from jaxnet.core.errors import UserError
  files = []
  for path in paths:
    if not os.path.isdir(path):
      files.append(path)
      continue
    images = sorted(name for name in os.listdir(path) if is_image_name(name)
                    and not os.path.isdir(os.path.join(path, name)))
    if not images:
      raise UserError(f"folder {path} holds no {EXTENSIONS_TEXT} images to predict")
    files.extend(os.path.join(path, name) for name in images)
  return files


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m jaxnet.cli.predict", description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True, help="a training workdir with checkpoints")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  parser.add_argument("--top", type=int, default=5, help="classes to print per image")
  parser.add_argument("images", nargs="+", metavar="IMAGE|FOLDER",
                      help="image files, or folders whose image files to predict")
  args = parser.parse_args(argv)

  with process.one_line_errors():
    process.setup()
    from jaxnet import api
    images = _expand_folders(args.images)
    model = api.restore(args.workdir, step=args.step)
    results = model.predict(images, top_k=args.top)
  for path, top in zip(images, results):
    print(path)
    for name, prob in top:
      print(f"  {prob:8.4f}  {name}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
