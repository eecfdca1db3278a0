"""A trained model restored from a workdir, whatever its task, and image files made into its input.

`Predictor.predict_fn` is steps.make_predict_fn of the task's predict_outputs, the function the
eval step runs the model through, so predictions, eval metrics and the exports
(jaxnet/tools/export.py, jaxnet/tools/onnx/) agree. The checkpoint is read without the
optimizer or the dataset (classes.json, written at train time, says how many classes there
are and their names). What an image becomes, what the outputs mean, how a result is printed
and drawn: the task's (jaxnet/core/tasks); this module reads the files.

Prediction must see images the way eval saw them (`load_image`, the task's preprocess): a
classifier's files, whatever the data source, go through the input pipeline's own eval
transform (decode, resize the shorter side to image_size / config.data.eval_crop_fraction with
config.data.eval_interpolation, center crop): the one eval preprocessing that config.json,
preprocessing.json, the ONNX metadata and int8 calibration record and use. (Digits, stored
upsampled whole, record a crop fraction of 1.0.) Normalization (mean/std) is not done here: it
is part of the model function.
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
  """A restored model, whatever its task: `predict(images)` gives each image's result (a
  classifier's top-k classes, a detector's boxes: the task's postprocess), `lines` prints one
  and `draw` draws one, as the task does. `predict_fn(variables, images)` is the task's
  function of the model (steps.make_predict_fn), the one the eval step and the exports run."""

  def __init__(self, config, model, variables, *, num_classes: int, class_names=None, step=None,
               workdir=None):
    self.config, self.model, self.step, self.workdir = config, model, step, workdir
    self.num_classes = num_classes
    self.class_names = head_class_names(class_names, num_classes)
    self.channels = len(config.data.mean)  # Experiment checks this equals the images' channels
    self.image_shape = (config.image_size, config.image_size, self.channels)
    self.variables = jax.device_put(variables)
    self.task = tasks.for_model(config.model.name)
    self.predict_fn = steps.make_predict_fn(model, get_policy(config.precision),
                                            self.task.predict_outputs(model, config),
                                            mean=tuple(config.data.mean), std=tuple(config.data.std))
    self._outputs = jax.jit(self.predict_fn)

  def outputs(self, images):
    """uint8 images, (N, H, W, C) as in self.image_shape -> predict_fn's outputs as host
    arrays (a classifier's float32 logits (N, classes))."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.shape[1:] != self.image_shape:
      raise InvalidValueError(f"expected uint8 images of shape (N, {', '.join(map(str, self.image_shape))}), "
                              f"got {images.dtype} {images.shape}; use preprocess() for files")
    return jax.tree.map(np.asarray, jax.device_get(self._outputs(self.variables, images)))

  logits = outputs  # a classifier's word for them

  def examples(self, images) -> list[dict]:
    """Files, bytes, PIL images or arrays -> the examples eval would have made of them (the
    task's preprocess)."""
    out = []
    for image in images:
      data = _to_bytes(image)
      example = self.task.preprocess(data, self.config, self.channels)
      if not example["mask"]:
        raise _unreadable(image, data)
      out.append(example)
    return out

  def preprocess(self, images) -> np.ndarray:
    """Files, bytes, PIL images or arrays -> the uint8 batch eval would have seen."""
    return np.stack([e["image"] for e in self.examples(images)])

  def predict(self, images, **options) -> list:
    """Each image's result (files/PIL images/arrays, or a uint8 batch): the task's postprocess
    of the model's outputs, with `options` (top_k for a classifier, min_score for a detector)."""
    if isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.ndim == 4:
      examples = [{"image": image} for image in images]
    else:
      examples = self.examples(images)
    outputs = self.outputs(np.stack([e["image"] for e in examples]))
    return self.task.postprocess(outputs, examples, self.class_names, **options)

  def lines(self, path, result) -> list[str]:
    """One image's result as `python -m jaxnet.cli.predict` prints it."""
    return self.task.lines(path, result)

  def draw(self, image, result, path: str) -> None:
    """Writes `image` (a path, bytes, PIL image or array) with its result drawn, as PNG at `path`."""
    self.task.draw(_to_pil(image), result, path)


def restore(workdir: str, step: int | None = None, config=None) -> Predictor:
  """The model of WORKDIR's latest (or given) checkpoint, ready for inference, whatever its task."""
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
  return Predictor(config, model, variables, num_classes=info["num_classes"],
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
  """A path, bytes, PIL image or HxW[xC] array -> the uint8 image of `channels` channels eval
  would have seen: the task's preprocess (a classifier's: the pipeline's eval transform,
  EvalDecodeCrop, whatever the workdir's data source: what config.json, preprocessing.json and
  the exports' metadata record)."""
  data = _to_bytes(image)
  example = tasks.for_model(config.model.name).preprocess(data, config, channels)
  if not example["mask"]:
    raise _unreadable(image, data)
  return np.asarray(example["image"], np.uint8)


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
