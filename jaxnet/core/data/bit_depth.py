"""16-bit images scaled to the 8 bits the models see, instead of clipped.

PIL's convert() from a 16-bit grayscale mode ("I;16", as PIL opens a 16-bit
PNG) to "L" or "RGB" clips every value above 255: a 16-bit photograph came out
99.6% white, in training and in predict alike. Scaling maps 0..65535 onto
0..255 (65535 / 255 = 257 exactly), rounded to the nearest level.
"""

import numpy as np
from PIL import Image

# PIL's 16-bit grayscale modes; older Pillow versions opened 16-bit PNGs as "I"
# (32-bit integers holding 0..65535), which is only read as 16-bit for PNGs.
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


def scale_16_to_8(values: np.ndarray) -> np.ndarray:
  """0..65535 -> 0..255, rounded to nearest (exactly round(v / 257)), as uint8."""
  values = np.clip(np.asarray(values, np.int64), 0, 65535)
  return ((values + 128) // 257).astype(np.uint8)


def to_8bit(image: Image.Image) -> Image.Image:
  """A 16-bit grayscale image as an 8-bit "L" image; any other image unchanged."""
  if image.mode in _SIXTEEN_BIT_MODES or (image.mode == "I" and image.format == "PNG"):
    return Image.fromarray(scale_16_to_8(np.asarray(image)), "L")
  return image
