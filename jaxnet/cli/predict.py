"""Top-5 classes of image files under a trained model; a detector's boxes.

  python -m jaxnet.cli.predict --workdir=DIR [--step=N] [--top=5] IMAGE|FOLDER [...]
  python -m jaxnet.cli.predict --workdir=DETECTION_DIR [--min-score=0.3] [--draw=OUT] IMAGE|FOLDER [...]

Images are any file PIL reads; they are preprocessed like the training run's
eval data (see jaxnet/tools/predictor.py). A folder stands for the image files in it
(.jpg/.jpeg/.png/.webp, sorted, not hidden, not its subfolders), as ImageFolder
reads a class folder. Class names come from the dataset, recorded in
DIR/classes.json at train time. A detection workdir (a retinanet_* model) prints each
image's boxes (x0 y0 x1 y1 in the image's pixels), classes and scores; --draw writes the
image with its boxes as PNG: OUT itself for one image, OUT/NAME.png for several.
"""

import os
import sys

from jaxnet import cli
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


def _draw_paths(out: str, images: list[str]) -> list[str]:
  """Where --draw writes each image: OUT for one image, OUT/NAME.png for several."""
  from jaxnet.core.metrics import prepare_output
  paths = ([out] if len(images) == 1 else
           [os.path.join(out, os.path.splitext(os.path.basename(p))[0] + ".png") for p in images])
  prepare_output(paths[0])
  return paths


def main(argv=None):
  parser = cli.parser("predict", __doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True, help="a training workdir with checkpoints")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  parser.add_argument("--top", type=int, default=5, help="classes to print per image")
  parser.add_argument("--min-score", type=float, default=0.3, help="detection: the lowest score shown")
  parser.add_argument("--draw", default=None, metavar="OUT",
                      help="detection: write the images with their boxes (a .png for one image, a folder for several)")
  parser.add_argument("images", nargs="+", metavar="IMAGE|FOLDER",
                      help="image files, or folders whose image files to predict")
  args = parser.parse_args(argv)

  with process.one_line_errors():
    process.setup()
    from jaxnet import api
    from jaxnet.core.errors import UserError
    images = _expand_folders(args.images)
    model = api.restore(args.workdir, step=args.step)
    if args.draw and not model.draws:
      raise UserError(f"--draw is for a detection workdir; {args.workdir} holds a classifier")
    outputs = _draw_paths(args.draw, images) if args.draw else None  # checked before the work
    results = model.predict(images, top_k=args.top, min_score=args.min_score)
    for i, (path, result) in enumerate(zip(images, results)):
      for line in model.lines(path, result):
        print(line)
      if outputs:
        model.draw(path, result, outputs[i])
    if outputs:
      print(f"drawn: {args.draw}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
