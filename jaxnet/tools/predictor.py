"""A trained model restored from a workdir, and image files made into its input.

`Predictor.logits_fn` is `steps.make_logits_fn`, the same function the eval step runs, so
predictions, eval metrics and the exports (jaxnet/tools/export.py, jaxnet/tools/onnx/) agree. The checkpoint is
read without the optimizer or the dataset (classes.json, written at train time, says how
many classes there are and their names).

Prediction must see images the way eval saw them (`load_image`): every file, whatever the data
source, goes through the input pipeline's own eval transform (decode, resize the shorter side to
image_size / config.data.eval_crop_fraction with config.data.eval_interpolation, center crop):
the one eval preprocessing that config.json, preprocessing.json, the ONNX metadata and int8
calibration record and use. (Digits, stored upsampled whole, record a crop fraction of 1.0.)
Normalization (mean/std) is not done here: it is part of the model function.
"""

import io
import json
import os

import jax
import numpy as np
from PIL import Image

from jaxnet.core import checkpoint as ckpt
from jaxnet.core import config as config_lib
from jaxnet.core import models, steps, tasks
from jaxnet.core.data.bit_depth import scale_16_to_8, to_8bit
from jaxnet.core.errors import InvalidValueError, MissingFileError
from jaxnet.core.state import get_policy


def head_class_names(class_names, num_classes: int) -> list[str]:
  """A name for each of the head's classes: a head wider than the dataset (config.model.num_classes
  above its class count) has classes past the named ones, named by their index."""
  names = list(class_names or [])[:num_classes]
  return names + [str(i) for i in range(len(names), num_classes)]


class Predictor:
  def __init__(self, config, model, variables, *, num_classes: int, class_names=None, step=None,
               workdir=None):
    self.config, self.model, self.step, self.workdir = config, model, step, workdir
    self.num_classes = num_classes
    self.class_names = head_class_names(class_names, num_classes)
    self.channels = len(config.data.mean)  # Experiment checks this equals the images' channels
    self.image_shape = (config.image_size, config.image_size, self.channels)
    self.variables = jax.device_put(variables)
    self.task = tasks.for_model(config.model.name)
    self.logits_fn = self.task.make_predict_fn(model, get_policy(config.precision), config)
    self._logits = jax.jit(self.logits_fn)

  def logits(self, images) -> np.ndarray:
    """uint8 images, (N, H, W, C) as in self.image_shape -> float32 logits (N, classes)."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.shape[1:] != self.image_shape:
      raise InvalidValueError(f"expected uint8 images of shape (N, {', '.join(map(str, self.image_shape))}), "
                              f"got {images.dtype} {images.shape}; use preprocess() for files")
    return np.asarray(self._logits(self.variables, images), np.float32)

  def probabilities(self, images) -> np.ndarray:
    return np.asarray(jax.nn.softmax(self.logits(images), axis=-1))

  def preprocess(self, images) -> np.ndarray:
    """Files, PIL images or arrays -> the uint8 batch eval would have seen."""
    return load_batch(images, self.config, self.channels)

  def predict(self, images, top_k: int = 5, **unused) -> list[list[tuple[str, float]]]:
    """Top-k (class name, probability) for each image; images are files/PIL images or a uint8 batch."""
    is_batch = isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.ndim == 4
    batch = images if is_batch else self.preprocess(images)
    probs = self.probabilities(batch)
    top = np.argsort(-probs, axis=-1)[:, :min(top_k, self.num_classes)]
    return [[(self.class_names[i], float(p[i])) for i in row] for p, row in zip(probs, top)]

  draws = False  # no picture to draw: `draw` is a detector's

  def lines(self, path, result) -> list[str]:
    """One image's prediction as `python -m jaxnet.cli.predict` prints it."""
    return [str(path)] + [f"  {prob:8.4f}  {name}" for name, prob in result]


class Detector:
  """A detector (a detection workdir's model): `detect(images)` gives each image's boxes in
  its own pixels, classes and scores. Images are resized and padded as the eval data
  (jaxnet/core/data/coco.py); `detect_fn` is the eval step's (detection.make_detect_fn)."""

  def __init__(self, config, model, variables, *, num_classes: int, class_names=None, step=None,
               workdir=None):
    self.config, self.model, self.step, self.workdir = config, model, step, workdir
    self.num_classes = num_classes
    self.class_names = head_class_names(class_names, num_classes)
    self.image_shape = (config.image_size, config.image_size, len(config.data.mean))
    self.variables = jax.device_put(variables)
    self.task = tasks.for_model(config.model.name)
    self.detect_fn = self.task.make_predict_fn(model, get_policy(config.precision), config)
    self._detect = jax.jit(self.detect_fn)

  def preprocess(self, images) -> tuple[np.ndarray, np.ndarray]:
    """Files, bytes, PIL images or arrays -> (the uint8 batch eval would have seen, each
    image's (scale from its own pixels to the batch's, its (height, width)))."""
    from jaxnet.core.data.coco import DetectionTransform
    transform = DetectionTransform(self.config.image_size, 1, train=False, warn=False)
    examples = []
    for image in images:
      data = _to_bytes(image)
      example = transform.map({"image": data, "boxes": np.zeros((0, 4), np.float32),
                               "classes": np.zeros((0,), np.int32), "image_id": 0, "path": ""})
      if not example["mask"]:
        raise _unreadable(image, data)
      examples.append(example)
    return np.stack([e["image"] for e in examples]), [(e["scale"], e["source_size"]) for e in examples]

  def detect(self, images, min_score: float = 0.3) -> list[list[tuple[str, float, tuple]]]:
    """Per image [(class name, score, (x0, y0, x1, y1) in the image's pixels)], best first,
    those scoring at least `min_score`."""
    from jaxnet.core.data.coco import to_source_pixels
    batch, sizes = self.preprocess(images)
    boxes, scores, classes = jax.device_get(self._detect(self.variables, batch))
    return [[(self.class_names[c], float(s), tuple(float(v) for v in b))
             for b, s, c in zip(to_source_pixels(boxes[i], *sizes[i]), scores[i], classes[i]) if s >= min_score]
            for i in range(len(sizes))]

  def predict(self, images, min_score: float = 0.3, **unused) -> list[list[tuple[str, float, tuple]]]:
    """`detect`, under the name every restored model answers to (jaxnet.api.predict)."""
    return self.detect(images, min_score=min_score)

  draws = True

  def lines(self, path, result) -> list[str]:
    """One image's detections as `python -m jaxnet.cli.predict` prints them."""
    return [f"{path}: {len(result)} detections"] + [
        f"  {score:8.4f}  {name:<16} {' '.join(f'{v:7.1f}' for v in box)}" for name, score, box in result]

  def draw(self, image, result, path: str) -> None:
    draw_detections(image, result, path)


# A small image is drawn magnified, by a whole factor up to this shorter side, so that the
# labels (a fixed 14 px font) neither hide its objects nor run into one another.
DRAW_MIN_SIDE = 512
_LABEL_FONT_PX = 14


def draw_scale(width: int, height: int) -> int:
  """The whole factor draw_detections magnifies a width x height image by (1: none)."""
  return max(1, -(-DRAW_MIN_SIDE // min(width, height)))


def draw_detections(image, detections, path: str) -> None:
  """Writes `image` (a path, bytes, PIL image or array) with `detections` (Detector.detect's
  for it) drawn, as PNG at `path`, whole or not at all: magnified by draw_scale (pixels kept
  square, nearest-neighbour), each box with its label on a band of its colour above it."""
  from PIL import ImageDraw, ImageFont
  from jaxnet.core.metrics import write_file_atomically
  picture = _to_pil(image).convert("RGB")
  scale = draw_scale(*picture.size)
  if scale > 1:
    picture = picture.resize((picture.width * scale, picture.height * scale), Image.NEAREST)
  try:
    font = ImageFont.load_default(size=_LABEL_FONT_PX)
  except TypeError:  # Pillow < 10.1: its one bitmap font, ~11 px
    font = ImageFont.load_default()
  pen = ImageDraw.Draw(picture)
  for k, (name, score, box) in enumerate(detections):
    colour = tuple(int(255 * c) for c in _PALETTE[k % len(_PALETTE)])
    x0, y0, x1, y1 = (float(v) * scale for v in box)
    pen.rectangle((x0, y0, x1, y1), outline=colour, width=3)
    text = f"{name} {score:.2f}"
    left, top, right, bottom = pen.textbbox((0, 0), text, font=font)
    height = bottom - top + 4
    y = y0 - height if y0 >= height else y0  # above the box where there is room
    pen.rectangle((x0, y, x0 + right - left + 6, y + height), fill=colour)
    pen.text((x0 + 3, y + 2 - top), text, fill=(255, 255, 255), font=font)
  write_file_atomically(path, lambda tmp: picture.save(tmp, format="PNG"))


_PALETTE = ((0.9, 0.1, 0.1), (0.1, 0.6, 0.1), (0.1, 0.3, 0.9), (0.9, 0.6, 0.0), (0.6, 0.1, 0.7))


# What a restored model is, by what its task says it returns (jaxnet.core.tasks.Task.returns).
PREDICTORS = {"classes": Predictor, "boxes": Detector}


def restore(workdir: str, step: int | None = None, config=None) -> "Predictor | Detector":
  """The model of WORKDIR's latest (or given) checkpoint, ready for inference: its task's
  predictor (a Predictor for a classifier, a Detector for a detector). Each has
  `predict(images)`, `lines(result)` and `draw(image, result, path)`."""
  if not os.path.isdir(workdir):
    raise MissingFileError(f"workdir {workdir} not found: give the --workdir of a training run")
  from jaxnet.tools import bundle
  bundle.check_bundle(workdir)  # a bundle (export --format=bundle): every file as it was made
  config = config or config_lib.load(workdir)
  variables, step = load_eval_variables(workdir, config, step)
  info = _class_info(workdir)
  model = models.from_config(config.model, info["num_classes"], get_policy(config.precision).compute_dtype)
  _check_matches_model(model, variables, (1, config.image_size, config.image_size,
                                          len(config.data.mean)), workdir)
  kind = PREDICTORS[tasks.for_model(config.model.name).returns]
  return kind(config, model, variables, num_classes=info["num_classes"],
              class_names=info.get("class_names"), step=step, workdir=workdir)


def load_eval_variables(workdir: str, config, step: int | None = None) -> tuple[dict, int]:
  """(the variables eval uses, as host arrays, step) of WORKDIR's latest (or given)
  checkpoint: EMA params when its run (`config`) kept an EMA. Also `init.weights`'s reader."""
  tree, step = ckpt.load_arrays(workdir, step)
  return steps.eval_variables(tree["params"], tree.get("ema_params"), tree["batch_stats"],
                              use_ema=config.ema_decay > 0), step


def _class_info(workdir: str) -> dict:
  """The head's width and the class names training recorded in WORKDIR/classes.json."""
  path = os.path.join(workdir, "classes.json")
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise InvalidValueError(f"{path} cannot be read ({e}): it is written when training starts; "
                            f"is {workdir} a jaxnet training workdir?") from None


def _check_matches_model(model, variables, input_shape, workdir):
  expected = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), np.zeros(input_shape, np.float32),
                                               train=False))
  shapes = lambda tree: jax.tree.map(lambda x: tuple(x.shape), tree)
  if shapes(dict(expected)) != shapes(dict(variables)):
    raise InvalidValueError(f"the checkpoint in {workdir} does not match the model its config.json builds "
                            f"({model.__class__.__name__}); was config.json edited after training?")


# --- image files -> the eval input ----------------------------------------------------

def load_image(image, config, channels: int) -> np.ndarray:
  """A path, bytes, PIL image or HxW[xC] array -> uint8 (image_size, image_size, channels):
  the pipeline's eval transform (EvalDecodeCrop: the shorter side to image_size /
  data.eval_crop_fraction with data.eval_interpolation, the center crop), whatever the
  workdir's data source. It is what config.json, preprocessing.json and the exports' metadata
  record; array sources (digits, synthetic) once resized files straight to image_size instead,
  so weights imported with data.source=synthetic saw other pixels than their record said.
  (Digits record eval_crop_fraction=1.0: the shorter side to image_size, which for their square
  images is the resize their stored images had.)"""
  size = config.image_size
  from jaxnet.core.data.transforms import EvalDecodeCrop  # the pipeline's own eval transform
  # warn=False: the error below names the file and why; the transform's own warning knows
  # neither (it said "record ?").
  op = EvalDecodeCrop(size, config.data.eval_crop_fraction, config.data.eval_interpolation, warn=False)
  data = _to_bytes(image)
  example = op.map({"image": data, "label": np.int32(0)})
  if not example["mask"]:
    raise _unreadable(image, data)
  out = np.asarray(example["image"], np.uint8)
  if channels == 1 and out.shape[-1] == 3:
    out = np.asarray(Image.fromarray(out).convert("L"), np.uint8)[..., None]
  return out


def _unreadable(image, data: bytes) -> "ImageReadError":
  """The error for an image the eval transform could not decode: the file and why (the
  transforms are told not to warn, so this is the one line said)."""
  from jaxnet.core.data import decode
  try:
    decode.decode_full(data)
    why = ""
  except decode.CorruptImageError as e:
    why = f" ({e})"
  where = os.fspath(image) if isinstance(image, (str, os.PathLike)) else "an image given as bytes or pixels"
  return ImageReadError(f"could not decode {where} as an image{why}")


def load_batch(images, config, channels: int) -> np.ndarray:
  return np.stack([load_image(im, config, channels) for im in images])


class ImageReadError(InvalidValueError):
  """An image to predict on is missing or is not an image."""


def _check_file(path) -> None:
  if not os.path.exists(path):
    raise ImageReadError(f"image file {path} not found")
  if os.path.isdir(path):
    raise ImageReadError(f"{path} is a directory, not an image: pass its image files "
                         f"(jaxnet predict takes a directory and predicts the images in it)")


def _open_file(path) -> Image.Image:
  _check_file(path)
  try:
    with Image.open(path) as im:
      im.load()
      return im
  except (OSError, Image.DecompressionBombError) as e:
    raise ImageReadError(f"{path} is not an image that PIL can read ({e})") from None


def _to_pil(image) -> Image.Image:
  """A PIL image of at most 8 bits per channel (16-bit grayscale is scaled, not clipped)."""
  if isinstance(image, Image.Image):
    return to_8bit(image)
  if isinstance(image, (str, os.PathLike)):
    return to_8bit(_open_file(image))
  if isinstance(image, bytes):
    return to_8bit(Image.open(io.BytesIO(image)))
  array = np.asarray(image)
  if array.ndim == 3 and array.shape[-1] == 1:
    array = array[..., 0]
  if array.dtype == np.uint16:
    return Image.fromarray(scale_16_to_8(array))
  return Image.fromarray(array.astype(np.uint8))


def _to_bytes(image) -> bytes:
  if isinstance(image, bytes):
    return image
  if isinstance(image, (str, os.PathLike)):
    _check_file(image)
    with open(image, "rb") as f:
      return f.read()
  buffer = io.BytesIO()
  _to_pil(image).convert("RGB").save(buffer, format="PNG")
  return buffer.getvalue()
