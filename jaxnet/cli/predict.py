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
A file that is not an image (or is missing) is named in an `error:` line and the others
are still predicted; the exit status is then 1.
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
    images = _expand_folders(args.images)
    model = api.restore(args.workdir, step=args.step)
    if args.draw:  # both checked before the work
      model.task.check_draw()
    outputs = _draw_paths(args.draw, images) if args.draw else None
    drawn = dict(zip(images, outputs or []))
    given = len(images)
    images, results, unreadable = _predict_readable(model, images, args.top, args.min_score)
    for path, result in zip(images, results):
      for line in model.lines(path, result):
        print(line)
      if outputs:
        model.draw(path, result, drawn[path])
    if outputs:
      print(f"drawn: {args.draw}")
    if unreadable:  # each named on its own line, the others predicted: still a failure
      for error in unreadable:
        print(f"error: {error}", file=sys.stderr)
      print(f"error: {len(unreadable)} of {given} images could not be read (named above); the others "
            f"are predicted", file=sys.stderr)
      return 1
  return 0


def _predict_readable(model, images: list[str], top: int, min_score: float):
  """(the images that read, their results, an error naming each that does not): one file that
  is not an image must not cost the others their predictions. The files are read one by one
  only where reading them together failed; a single image that does not read is the error."""
  from jaxnet.tools.predictor import ImageReadError
  try:
    return images, model.predict(images, top_k=top, min_score=min_score), []
  except ImageReadError:
    if len(images) == 1:
      raise
  readable, errors = [], []
  for path in images:
    try:
      model.preprocess([path])
      readable.append(path)
    except ImageReadError as e:
      errors.append(e)
  results = model.predict(readable, top_k=top, min_score=min_score) if readable else []
  return readable, results, errors


if __name__ == "__main__":
  sys.exit(main())
