"""Image bytes -> uint8 RGB pixels, for the input pipeline's transforms (transforms.py).

JPEGs are decoded by libjpeg-turbo through simplejpeg, optionally at 1/2, 1/4 or 1/8
scale in the DCT; the optional C extension `_jpeg_region` decodes only a crop's rows and
block columns (as TF's decode_and_crop_jpeg does). Why these: docs/data.md ("Decoder
choice") and experiments/RESULTS.md (experiments/bench_input.py).

PIL stays as the fallback for anything libjpeg-turbo rejects (PNGs saved as
.jpg, JPEGs with recoverable libjpeg warnings that the strict decoders
refuse). Data neither can decode raises `CorruptImageError`; the Grain
transforms turn that into a masked zero image instead of killing the run.
"""

from __future__ import annotations

import io
import os
import re

import numpy as np
import simplejpeg
from PIL import Image

from jaxnet.core.data.bit_depth import to_8bit

try:  # optional C extension (setup.py): decodes only the crop
  from jaxnet.core.data import _jpeg_region
except ImportError:
  _jpeg_region = None

# Headers claiming more pixels than this are rejected before decoding: a
# forged or broken header could otherwise make one worker allocate gigabytes.
# Same limit at which PIL raises DecompressionBombError.
MAX_PIXELS = 2 * Image.MAX_IMAGE_PIXELS


class CorruptImageError(ValueError):
  """The bytes are not a decodable image (truncated, garbage, unknown format)."""


def decode_jpeg(data: bytes, min_height: int | None = None,
                min_width: int | None = None, fast_dct: bool = False) -> np.ndarray:
  """Decode JPEG bytes to a uint8 HxWx3 RGB array.

  With `min_height`/`min_width` the image may come back downscaled by 1/2,
  1/4 or 1/8 in the DCT (cheaper than a full decode), but never below those
  sizes. Other M/8 scales are avoided on purpose: libjpeg-turbo decodes 7/8
  or 6/8 slower than full size. `fast_dct` uses libjpeg-turbo's fast integer
  IDCT (TF's ImageNet input pipelines use the same, `INTEGER_FAST`): ~19%
  faster decodes for a difference of a few intensity levels, fine under
  augmentation; eval keeps the accurate IDCT.
  """
  scaled = {}
  if min_height or min_width:
    try:
      height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
      height = width = 0  # not a JPEG simplejpeg reads: PIL path below
    factor = dct_factor(height, width, min_height or 1, min_width or 1)
    if factor > 1:
      # simplejpeg picks the smallest M/8 scale meeting these minimums,
      # which is exactly 1/factor.
      scaled = {"min_height": -(-height // factor),
                "min_width": -(-width // factor)}
  try:
    return simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=fast_dct, **scaled)
  except (ValueError, TypeError) as err:
    turbo_error = err
  return _decode_with_pil(data, min_height, min_width, turbo_error)


def dct_factor(height: int, width: int, min_height: int, min_width: int) -> int:
  """Largest of 8, 4, 2 that keeps the decoded image >= the minimums, else 1."""
  for factor in (8, 4, 2):
    if height // factor >= min_height and width // factor >= min_width:
      return factor
  return 1


def _decode_with_pil(data, min_height, min_width, turbo_error) -> np.ndarray:
  try:
    with Image.open(io.BytesIO(data)) as image:
      if min_height or min_width:
        # draft() picks the largest JPEG scale keeping size >= request;
        # it is a no-op for non-JPEG formats.
        image.draft("RGB", (min_width or 1, min_height or 1))
      # convert() forces the full decode, which is where truncation shows;
      # 16-bit grayscale is scaled to 8 bits first (convert would clip it).
      array = np.asarray(to_8bit(image).convert("RGB"))
  except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
    raise CorruptImageError(
        f"cannot decode {len(data)} bytes as an image "
        f"(simplejpeg: {turbo_error}; PIL: {err})") from err
  return array


def jpeg_size(data: bytes) -> tuple[int, int] | None:
  """(height, width) from a JPEG header; None for other data (PNG, garbage).

  Headers claiming more than MAX_PIXELS are refused before anything is decoded.
  """
  try:
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
  except ValueError:
    return None
  if height * width > MAX_PIXELS:
    raise CorruptImageError(f"JPEG header claims {width}x{height} pixels")
  return height, width


def decode_full(data: bytes) -> np.ndarray:
  """Whole-image accurate decode (decode_jpeg's PIL path takes non-JPEG data); a prepared
  shard's raw record (binary PPM) is its pixels as they are."""
  pixels = ppm_pixels(data)
  if pixels is not None:
    return pixels
  jpeg_size(data)
  return decode_jpeg(data)


_PPM_HEADER = re.compile(rb"P6\s+(\d+)\s+(\d+)\s+255\s")


def ppm_bytes(pixels: np.ndarray) -> bytes:
  """uint8 HxWx3 RGB pixels as a binary PPM (P6, maxval 255)."""
  height, width = pixels.shape[:2]
  return b"P6\n%d %d\n255\n" % (width, height) + np.ascontiguousarray(pixels, np.uint8).tobytes()


def ppm_pixels(data) -> np.ndarray | None:
  """The pixels of a binary PPM with maxval 255 (ppm_bytes: prepared shards' raw records), a
  read-only view of `data` (nothing is decoded or copied); None for other data. A PPM whose
  pixels are cut short raises CorruptImageError."""
  if data[:2] != b"P6":
    return None
  header = _PPM_HEADER.match(bytes(data[:64]))
  if header is None:
    return None  # another PPM flavour (comments, 16-bit): PIL's path decodes it
  width, height = int(header[1]), int(header[2])
  if height * width > MAX_PIXELS or len(data) - header.end() < height * width * 3:
    raise CorruptImageError(f"PPM of {width}x{height} pixels holds {len(data) - header.end()} bytes of them")
  return np.frombuffer(data, np.uint8, height * width * 3, header.end()).reshape(height, width, 3)


def decode_region(data: bytes, height: int, width: int, box, factor: int, fast_dct: bool,
                  scale_box) -> np.ndarray | None:
  """Only the crop, decoded at 1/factor scale by libjpeg-turbo; None if it refuses.
  `scale_box` maps `box` into the reduced image, as the crop's other decode path does.

  A JPEG without its end-of-image marker is truncated: it takes the full
  decode path, which reports it corrupt, even when the crop lies in the
  intact part (so a broken file is counted whichever crop is drawn).
  """
  if not data.rstrip(b"\0").endswith(b"\xff\xd9"):
    return None
  # libjpeg's scaled size is the ceiling of size / factor.
  shape = (-(-height // factor), -(-width // factor))
  top, left, h, w = scale_box(box, height, width, shape)
  try:
    rows = _jpeg_region.decode_region(data, top, left, h, w, factor, fast_dct)
  except ValueError:
    return None  # CMYK, corrupt data, ...: the full decode decides
  return np.frombuffer(rows, np.uint8).reshape(h, w, 3)


def read_file(path: str) -> dict:
  """A source's read of an image file: {"image": bytes}, or, when it cannot be read (gone
  since the source listed it, no permission), empty bytes and {"read_error": why}, so the
  transform masks and counts it and its warning says why ("not found"), not that 0 bytes
  would not decode."""
  try:
    with open(path, "rb") as f:
      return {"image": f.read()}
  except FileNotFoundError:
    return {"image": b"", "read_error": "not found"}
  except OSError as e:
    return {"image": b"", "read_error": f"cannot be read ({os.strerror(e.errno) if e.errno else e})"}


def decode_record(element: dict) -> np.ndarray:
  """decode_full of a record's image, or CorruptImageError with its read_error (read_file)."""
  if element.get("read_error"):
    raise CorruptImageError(element["read_error"])
  return decode_full(element["image"])
