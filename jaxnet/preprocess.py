"""Image files -> the uint8 NHWC arrays a trained model was evaluated on.

Prediction must see images the way eval saw them:
  array sources (digits, synthetic) hold whole images already resized to
    image_size (digits: bilinear upsampling of the 8x8 originals), so a file is
    converted to the model's channels (L or RGB) and resized the same way;
  encoded sources (imagefolder, tfds) go through the input pipeline's own eval
    transform (decode, resize the shorter side to image_size /
    config.data.eval_crop_fraction with config.data.eval_interpolation,
    center crop), torchvision's reference eval transform.
Normalization (mean/std) is not done here: it is part of the model function.
"""

import io
import os

import numpy as np
from PIL import Image

from jaxnet.data.bit_depth import scale_16_to_8, to_8bit
from jaxnet.errors import InvalidValueError

# Sources whose records are decoded arrays rather than JPEG bytes (see data/sources.py).
ARRAY_SOURCES = ("digits", "synthetic")


def load_image(image, config, channels: int) -> np.ndarray:
  """A path, bytes, PIL image or HxW[xC] array -> uint8 (image_size, image_size, channels)."""
  size = config.image_size
  if config.data.source in ARRAY_SOURCES:
    pil = _to_pil(image).convert("L" if channels == 1 else "RGB")
    if pil.size != (size, size):
      pil = pil.resize((size, size), Image.BILINEAR)
    out = np.asarray(pil, np.uint8)
    return out[..., None] if channels == 1 else out
  from jaxnet.data.transforms import EvalDecodeCrop  # the pipeline's own eval transform
  op = EvalDecodeCrop(size, config.data.eval_crop_fraction, config.data.eval_interpolation)
  example = op.map({"image": _to_bytes(image), "label": np.int32(0)})
  if not example["mask"]:
    raise ImageReadError(f"could not decode image {image if isinstance(image, str) else ''}".strip())
  out = np.asarray(example["image"], np.uint8)
  if channels == 1 and out.shape[-1] == 3:
    out = np.asarray(Image.fromarray(out).convert("L"), np.uint8)[..., None]
  return out


def load_batch(images, config, channels: int) -> np.ndarray:
  return np.stack([load_image(im, config, channels) for im in images])


class ImageReadError(InvalidValueError):
  """An image to predict on is missing or is not an image."""


def _check_file(path) -> None:
  if not os.path.exists(path):
    raise ImageReadError(f"image file {path} not found")
  if os.path.isdir(path):
    raise ImageReadError(f"{path} is a directory, not an image: pass its image files "
                         f"(python -m jaxnet.predict takes a directory and predicts the images in it)")


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
