"""RandAugment (Cubuk et al. 2020) on uint8 images, in the Grain workers.

Each train image gets `num_ops` operations, each picked uniformly from the 16
below and applied at one shared `magnitude` (0..10). The operations and the
way magnitude maps to their strength follow the TensorFlow implementation
that big_vision's `randaug(2, 10)` (and the ViT recipes tuned with it) use:

  op            at magnitude m (level = m / 10)
  AutoContrast  stretch each channel to 0..255
  Equalize      histogram-equalise each channel
  Invert        255 - x
  Rotate        +-30 * level degrees
  Posterize     keep int(4 * level) bits (at least 1: TF's blanks the image below m=2.5)
  Solarize      invert pixels >= 256 * level (so at m=10 nothing changes, as in TF)
  SolarizeAdd   add 110 * level to pixels below 128
  Color         saturation factor 0.1 + 1.8 * level
  Contrast      contrast factor 0.1 + 1.8 * level
  Brightness    brightness factor 0.1 + 1.8 * level
  Sharpness     sharpness factor 0.1 + 1.8 * level
  ShearX/Y      shear +-0.3 * level
  TranslateX/Y  shift +-100/224 * level of the image size
  Cutout        a grey square of side 2 * 40/224 * level of the image size

Signs are random. Geometric operations fill with grey (128) and sample the
nearest pixel. The blends (Color .. Sharpness) and point operations run in OpenCV
when it is installed (within 2 intensity levels of PIL's ImageEnhance, which is
the fallback): RandAugment(2, 10) then costs ~0.5 ms per 224px image. TF gives translation and cutout in pixels (100 and 40); they
are scaled here with the image size so that 224px images match TF.

Randomness comes only from the generator Grain hands each record, seeded by
the loader's seed and the record's position in the stream: the augmentation
of every example is a function of (seed, position), so a resumed run that
restores the iterator's position sees the same augmented images.
"""

from __future__ import annotations

from typing import Any

import grain.python as grain
import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from jaxnet.core.data.transforms import cv2  # None without OpenCV (then numpy)
from jaxnet.core.errors import InvalidValueError

GREY = 128
MAX_MAGNITUDE = 10


def _pil(image: np.ndarray) -> Image.Image:
  return Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)


def _array(pil: Image.Image, like: np.ndarray) -> np.ndarray:
  return np.asarray(pil, np.uint8).reshape(like.shape)


def _signed(value: float, rng: np.random.Generator) -> float:
  return -value if rng.random() < 0.5 else value


def _affine(image, rng, coefficients) -> np.ndarray:
  """PIL affine: output pixel (x, y) reads input (a x + b y + c, d x + e y + f)."""
  pil = _pil(image)
  fill = GREY if pil.mode == "L" else (GREY,) * image.shape[-1]
  return _array(pil.transform(pil.size, Image.Transform.AFFINE, coefficients,
                              resample=Image.Resampling.NEAREST, fillcolor=fill), image)


def auto_contrast(image, level, rng):
  return _array(ImageOps.autocontrast(_pil(image)), image)


def equalize(image, level, rng):
  return _array(ImageOps.equalize(_pil(image)), image)


def invert(image, level, rng):
  return 255 - image


def rotate(image, level, rng):
  pil = _pil(image)
  fill = GREY if pil.mode == "L" else (GREY,) * image.shape[-1]
  return _array(pil.rotate(_signed(30 * level, rng), resample=Image.Resampling.NEAREST,
                           fillcolor=fill), image)


# Point operations as 256-entry lookup tables: one gather per image.
_VALUES = np.arange(256, dtype=np.int32)


def _lookup(image, table):
  table = np.asarray(table, np.uint8)
  if cv2 is not None:  # ~4x faster than np.take
    return cv2.LUT(image, table).reshape(image.shape)
  return np.take(table, image)


def posterize(image, level, rng):
  shift = 8 - max(int(4 * level), 1)
  return _lookup(image, (_VALUES >> shift) << shift)


def solarize(image, level, rng):
  return _lookup(image, np.where(_VALUES >= int(256 * level), 255 - _VALUES, _VALUES))


def solarize_add(image, level, rng):
  return _lookup(image, np.where(_VALUES < 128, np.minimum(_VALUES + int(110 * level), 255), _VALUES))


def _degenerate(kind: str, image: np.ndarray) -> np.ndarray:
  """The image that `kind`'s factor blends away from (PIL ImageEnhance's definitions)."""
  grey = image[..., 0] if image.shape[-1] == 1 else cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
  if kind == "color":
    return np.repeat(grey[..., None], image.shape[-1], axis=-1)
  if kind == "contrast":
    return np.full_like(image, int(grey.mean() + 0.5))
  if kind == "brightness":
    return np.zeros_like(image)
  # sharpness: a 3x3 smoothing (centre weight 5, total 13), the border left as it is
  smooth = cv2.filter2D(image, -1, np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / 13,
                        borderType=cv2.BORDER_REPLICATE).reshape(image.shape)
  smooth[0], smooth[-1], smooth[:, 0], smooth[:, -1] = image[0], image[-1], image[:, 0], image[:, -1]
  return smooth


def _enhance(kind, pil_enhancer):
  def op(image, level, rng):
    factor = 0.1 + 1.8 * level
    if cv2 is None:
      return _array(pil_enhancer(_pil(image)).enhance(factor), image)
    # degenerate + factor * (image - degenerate), rounded and clipped to 0..255
    blended = cv2.addWeighted(image, factor, _degenerate(kind, image), 1 - factor, 0)
    return blended.reshape(image.shape)
  op.__name__ = kind
  return op


def shear_x(image, level, rng):
  return _affine(image, rng, (1, _signed(0.3 * level, rng), 0, 0, 1, 0))


def shear_y(image, level, rng):
  return _affine(image, rng, (1, 0, 0, _signed(0.3 * level, rng), 1, 0))


def translate_x(image, level, rng):
  return _affine(image, rng, (1, 0, _signed(100 / 224 * level * image.shape[1], rng), 0, 1, 0))


def translate_y(image, level, rng):
  return _affine(image, rng, (1, 0, 0, 0, 1, _signed(100 / 224 * level * image.shape[0], rng)))


def cutout(image, level, rng):
  h, w = image.shape[:2]
  half = int(40 / 224 * level * min(h, w))
  cy, cx = int(rng.integers(0, h)), int(rng.integers(0, w))
  out = image.copy()
  out[max(cy - half, 0):cy + half, max(cx - half, 0):cx + half] = GREY
  return out


OPS = (auto_contrast, equalize, invert, rotate, posterize, solarize,
       _enhance("color", ImageEnhance.Color), _enhance("contrast", ImageEnhance.Contrast),
       _enhance("brightness", ImageEnhance.Brightness), _enhance("sharpness", ImageEnhance.Sharpness),
       shear_x, shear_y, translate_x, translate_y, cutout, solarize_add)


def rand_augment(image: np.ndarray, num_ops: int, magnitude: float,
                 rng: np.random.Generator) -> np.ndarray:
  """`num_ops` random operations at `magnitude` on a uint8 HxWxC (C = 1 or 3) image."""
  level = magnitude / MAX_MAGNITUDE
  for _ in range(num_ops):
    image = OPS[int(rng.integers(len(OPS)))](image, level, rng)
  return image


class RandAugment(grain.RandomMapTransform):
  """RandAugment on the `image` of a decoded example; examples masked out (unreadable) pass as they are."""

  def __init__(self, num_ops: int, magnitude: float):
    if num_ops < 0 or not 0 <= magnitude <= MAX_MAGNITUDE:
      raise InvalidValueError(f"RandAugment({num_ops}, {magnitude}): config.data.randaug_num_ops must be "
                              f">= 0 and config.data.randaug_magnitude within 0..{MAX_MAGNITUDE}")
    self.num_ops, self.magnitude = num_ops, magnitude

  def random_map(self, element: dict[str, Any], rng: np.random.Generator):
    if not element["mask"]:
      return element
    return {**element, "image": rand_augment(element["image"], self.num_ops, self.magnitude, rng)}
