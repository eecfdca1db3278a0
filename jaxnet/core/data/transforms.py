"""JPEG decoding and Inception-style crops for the Grain input pipeline.

How a train image is made
-------------------------
1. Read the JPEG header (simplejpeg) and draw the crop box from its size.
2. Decode only that box (`_jpeg_region`, a small C extension over the
   system's libjpeg-turbo, as TF's decode_and_crop_jpeg does): rows above the
   box are skipped without inverse DCT, rows below it never read, and only the
   block columns overlapping it transformed. The pixels equal those of a full
   decode. Where the crop allows, the decode is also at 1/2, 1/4 or 1/8 scale
   in the DCT (crop still >= image_size pixels, so no upsampling is added;
   other M/8 scales are avoided, libjpeg-turbo decodes 7/8 or 6/8 slower than
   full size). Train uses libjpeg-turbo's fast integer IDCT (as TF's ImageNet
   pipelines do), eval the accurate one.
3. Resize the crop with OpenCV: bilinear, or area averaging when shrinking 2x
   or more (bilinear would skip pixels there). Without OpenCV installed, PIL's
   antialiased bilinear does it, ~1 ms slower per image.
4. Flip half of them.

Without the C extension (no compiler or libjpeg-turbo headers at install)
step 2 decodes the whole image with simplejpeg: same result, ~25% slower.

How an eval image is made
-------------------------
Exactly as torchvision's reference eval (and timm's, with its crop_pct and
interpolation): decode the whole image, resize the shorter side to
floor(image_size / crop_fraction) with PIL's antialiased bilinear or bicubic,
center-crop image_size. PIL resamples only the cropped window. Pretrained
weights are scored with this transform, so it trades speed for pixels equal to
the reference: 1.86 ms of CPU per ~500x375 JPEG, against 1.05 ms for a
crop-first decode and OpenCV resize, which differed from the reference by
1.2-3.6 grey levels on average on scikit-image's photographs; this one by under
0.001 (tests/test_eval_reference.py).

Decoding (libjpeg-turbo through simplejpeg, the region decoder, PIL's fallback) is in
decode.py; the measured decoder choice is in experiments/RESULTS.md ("Input pipeline with region
decoding and OpenCV resizing", bench_input.py) and docs/data.md.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import grain.python as grain
import numpy as np
from PIL import Image

from jaxnet.core.errors import InvalidValueError

from jaxnet.core.data import decode
from jaxnet.core.data.decode import CorruptImageError, decode_jpeg  # noqa: F401 (CorruptImageError: public here too)

try:
  import cv2
  # One image at a time per Grain worker process: parallelism comes from the
  # workers, and OpenCV's own thread pool would only oversubscribe the cores.
  cv2.setNumThreads(1)
except ImportError:  # a minimal image without the wheel: PIL resizes, ~6x slower
  cv2 = None

Box = tuple[int, int, int, int]  # (top, left, height, width) in pixels

def random_resized_crop_box(rng: np.random.Generator, height: int, width: int,
                            area_range=(0.08, 1.0), ratio_range=(3 / 4, 4 / 3),
                            attempts: int = 10) -> Box:
  """Inception-style crop: random area fraction and log-uniform aspect ratio.

  Falls back to the largest centered crop whose aspect ratio lies within
  `ratio_range` when no attempt fits inside the image.
  """
  area = height * width
  log_ratio = (math.log(ratio_range[0]), math.log(ratio_range[1]))
  for _ in range(attempts):
    target_area = area * rng.uniform(*area_range)
    aspect = math.exp(rng.uniform(*log_ratio))  # width / height
    w = int(round(math.sqrt(target_area * aspect)))
    h = int(round(math.sqrt(target_area / aspect)))
    if 0 < w <= width and 0 < h <= height:
      top = int(rng.integers(0, height - h + 1))
      left = int(rng.integers(0, width - w + 1))
      return top, left, h, w
  return _center_box_with_ratio(height, width, ratio_range)


def _center_box_with_ratio(height: int, width: int, ratio_range) -> Box:
  aspect = width / height
  if aspect < ratio_range[0]:  # too tall: keep width, cut height
    w, h = width, min(height, max(1, int(round(width / ratio_range[0]))))
  elif aspect > ratio_range[1]:  # too wide: keep height, cut width
    w, h = min(width, max(1, int(round(height * ratio_range[1])))), height
  else:
    w, h = width, height
  return (height - h) // 2, (width - w) // 2, h, w


# Eval resampling filters by the names timm's pretrained configs use. PIL's
# filters are antialiased: when shrinking, the kernel widens with the scale.
EVAL_INTERPOLATIONS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def eval_crop_geometry(height: int, width: int, image_size: int,
                       crop_fraction: float = 0.875) -> tuple[tuple[int, int], tuple[int, int]]:
  """The reference eval's resize and crop: ((resized_height, resized_width), (top, left)).

  torchvision's `Resize(floor(image_size / crop_fraction))` then
  `CenterCrop(image_size)` (timm's eval with `crop_pct`): the shorter side
  becomes 256 for 224 / 0.875, the longer side is truncated to an integer,
  and the crop offset is rounded half to even, as both libraries do.
  """
  check_crop_fraction(crop_fraction)
  short = math.floor(image_size / crop_fraction)
  if width <= height:
    resized = (int(short * height / width), short)
  else:
    resized = (short, int(short * width / height))
  top, left = (int(round((side - image_size) / 2.0)) for side in resized)
  return resized, (top, left)


def eval_resize_crop(pixels: np.ndarray, image_size: int, crop_fraction: float = 0.875,
                     interpolation: str = "bilinear") -> np.ndarray:
  """The reference eval transform (resize the shorter side, center-crop) on decoded pixels,
  exactly as torchvision's Resize + CenterCrop do it on a PIL image: the whole image resized,
  then cropped. (Resampling only the cropped window, PIL's `resize(box=...)`, is cheaper but
  rounds differently: one grey level on up to 0.03% of the values of scikit-image's photos.)
  """
  check_interpolation(interpolation)
  height, width = pixels.shape[:2]
  (resized_h, resized_w), (top, left) = eval_crop_geometry(height, width, image_size, crop_fraction)
  image = Image.fromarray(pixels).resize((resized_w, resized_h), EVAL_INTERPOLATIONS[interpolation])
  return np.asarray(image.crop((left, top, left + image_size, top + image_size)))


# The one check of each eval option: here, where they are used (a caller of these functions
# may never run config_io.validate), and from config_io.validate before a run writes anything.
def check_crop_fraction(crop_fraction: float) -> None:
  if not 0 < crop_fraction <= 1:
    raise InvalidValueError(f"data.eval_crop_fraction must be in (0, 1], got {crop_fraction}")


def check_interpolation(interpolation: str) -> None:
  if interpolation not in EVAL_INTERPOLATIONS:
    raise InvalidValueError(f"data.eval_interpolation must be one of {sorted(EVAL_INTERPOLATIONS)}, "
                            f"got {interpolation!r}")


def _decode_crop_resize(data: bytes, image_size: int, box_fn, fast_dct: bool = False) -> np.ndarray:
  """Decode only as many pixels as the crop needs, then resize the crop.

  `box_fn(height, width)` gives the crop box in full-resolution coordinates.
  """
  pixels = decode.ppm_pixels(data)
  if pixels is not None:  # a prepared shard's raw record: nothing to decode
    return _resize_box(pixels, box_fn(*pixels.shape[:2]), image_size)
  size = decode.jpeg_size(data)
  if size is None:
    # Not a baseline JPEG header (PNG, garbage): decode fully (PIL path)
    # or raise CorruptImageError.
    pixels = decode_jpeg(data)
    return _resize_box(pixels, box_fn(*pixels.shape[:2]), image_size)
  height, width = size
  top, left, h, w = box_fn(height, width)
  # Smallest decode in which the crop still spans >= image_size pixels on
  # both axes (or the full size if the crop is smaller than that already),
  # so the reduced decode never adds upsampling.
  min_height = min(height, math.ceil(height * image_size / h))
  min_width = min(width, math.ceil(width * image_size / w))
  if decode._jpeg_region is not None:
    factor = decode.dct_factor(height, width, min_height, min_width)
    crop = decode.decode_region(data, height, width, (top, left, h, w), factor, fast_dct, _scale_box)
    if crop is not None:
      return _resize(crop, image_size)
  pixels = decode_jpeg(data, min_height, min_width, fast_dct)
  box = _scale_box((top, left, h, w), height, width, pixels.shape[:2])
  return _resize_box(pixels, box, image_size)


def _scale_box(box: Box, height: int, width: int, shape) -> Box:
  """`box` of a height x width image, in the pixels of its `shape` rescale.

  Both decode paths map the box with this, so they crop the same pixels; at
  the full size it returns the box unchanged.
  """
  scale_y, scale_x = shape[0] / height, shape[1] / width
  top, left, h, w = box
  top, left = min(round(top * scale_y), shape[0] - 1), min(round(left * scale_x), shape[1] - 1)
  h = min(max(1, round(h * scale_y)), shape[0] - top)
  w = min(max(1, round(w * scale_x)), shape[1] - left)
  return top, left, h, w


def _resize_box(pixels: np.ndarray, box: Box, image_size: int) -> np.ndarray:
  top, left, h, w = box
  return _resize(pixels[top:top + h, left:left + w], image_size)


def _resize(crop: np.ndarray, image_size: int) -> np.ndarray:
  """Resize a crop to image_size x image_size.

  Bilinear, as TF's ImageNet pipelines resize. Bilinear reads 2x2 pixels, so
  shrinking by 2x or more would skip pixels (aliasing); those crops use area
  averaging instead. They are rare: a reduced DCT decode has already done
  most of any large shrink.
  """
  if cv2 is None:
    return np.asarray(Image.fromarray(crop).resize((image_size, image_size),
                                                   Image.Resampling.BILINEAR))
  shrink = max(crop.shape[:2]) / image_size
  interpolation = cv2.INTER_AREA if shrink >= 2 else cv2.INTER_LINEAR
  return cv2.resize(crop, (image_size, image_size), interpolation=interpolation)


def flip_left_right(image: np.ndarray) -> np.ndarray:
  """The mirror image, contiguous. OpenCV's flip: numpy's copy of a reversed view, pixel by
  pixel, took 335 us for 224x224x3 against OpenCV's 9 (a quarter of a small image's transform)."""
  if cv2 is None:
    return np.ascontiguousarray(image[:, ::-1])
  return cv2.flip(image, 1)


# A record's fields that say where it came from or why it could not be read (decode.read_file,
# the sources' `path`): for messages, never part of an example.
_NOTES = ("image", "path", "read_error", "index")


def carried(record: dict) -> dict:
  """The record's fields besides its image and notes, into the example as they are (what a
  task's sources give with the image: classification's label), integers as int32."""
  return {k: np.int32(v) if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) else v
          for k, v in record.items() if k not in _NOTES}


def _output(image: np.ndarray, element: dict, ok: bool) -> dict[str, np.ndarray]:
  return {"image": image, **carried(element), "mask": np.bool_(ok), "corrupt": np.int32(not ok)}


_LOG = logging.getLogger("jaxnet")


def _warn_unreadable(element: dict[str, Any], err: Exception) -> None:
  where = element.get("path") or f"record {element.get('index', '?')}"
  _LOG.warning("skipping an unreadable image, %s: %s", where, err)


def decoded(element: dict[str, Any], warn: bool = True) -> np.ndarray | None:
  """A record's whole image (decode.decode_record), or None when it is unreadable, warned
  about unless `warn` is off (predict names its unreadable images itself). On None the
  transform returns its blank example, masked out and counted: the batch keeps its shape
  and one bad file does not end the run. The decode of every transform that starts from the
  whole image: EvalDecodeCrop's here, and the tasks' own."""
  try:
    return decode.decode_record(element)
  except CorruptImageError as err:
    if warn:
      _warn_unreadable(element, err)
    return None


def _blank_output(element: dict[str, Any], image_size: int) -> dict[str, np.ndarray]:
  # Keep the batch shape static: the train step masks this example out
  # and counts it, instead of the whole run dying on one bad file.
  blank = np.zeros((image_size, image_size, 3), np.uint8)
  return _output(blank, element, ok=False)


class TrainDecodeCrop(grain.RandomMapTransform):
  """Decode + random-resized-crop + resize to image_size + random h-flip."""

  def __init__(self, image_size: int, area_range=(0.08, 1.0),
               ratio_range=(3 / 4, 4 / 3)):
    self.image_size = image_size
    self.area_range = area_range
    self.ratio_range = ratio_range

  def random_map(self, element: dict[str, Any], rng: np.random.Generator):
    def box_fn(height, width):
      return random_resized_crop_box(rng, height, width,
                                     self.area_range, self.ratio_range)
    try:
      if element.get("read_error"):  # the source could not read the file (decode.read_file)
        raise CorruptImageError(element["read_error"])
      image = _decode_crop_resize(element["image"], self.image_size, box_fn, fast_dct=True)
    except CorruptImageError as err:
      _warn_unreadable(element, err)
      return _blank_output(element, self.image_size)
    if rng.random() < 0.5:
      image = flip_left_right(image)
    return _output(image, element, ok=True)


class EvalDecodeCrop(grain.MapTransform):
  """Deterministic decode + the reference eval resize and center crop (`eval_resize_crop`).

  Unlike training, eval decodes the whole image at full resolution: a reduced
  DCT decode or a crop-first resize would change pixels, and pretrained
  weights are scored with exactly torchvision's / timm's eval transform.
  """

  def __init__(self, image_size: int, crop_fraction: float = 0.875, interpolation: str = "bilinear",
               warn: bool = True):
    self.image_size = image_size
    self.crop_fraction = crop_fraction
    self.interpolation = interpolation
    self.warn = warn  # False: the caller names the unreadable images itself
    # Bad values fail here, in the main process, rather than in a Grain worker.
    check_crop_fraction(crop_fraction)
    check_interpolation(interpolation)

  def map(self, element: dict[str, Any]):
    pixels = decoded(element, self.warn)
    if pixels is None:
      return _blank_output(element, self.image_size)
    image = eval_resize_crop(pixels, self.image_size, self.crop_fraction, self.interpolation)
    return _output(image, element, ok=True)
