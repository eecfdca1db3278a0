"""torchvision's reference ImageNet eval transform, written with PIL alone.

`Resize(floor(size / crop_fraction))` (the shorter side; PIL resampling, which
antialiases) then `CenterCrop(size)`, step by step as torchvision does it, for
tests that compare jaxnet's eval preprocessing against it.
experiments/make_reference_logits.py checks that this function and torchvision's
own transform give identical pixels.
"""

import math

import numpy as np
from PIL import Image

FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def resize_center_crop(image: Image.Image, size: int = 224, crop_fraction: float = 0.875,
                       interpolation: str = "bilinear") -> np.ndarray:
  short = math.floor(size / crop_fraction)
  width, height = image.size
  if width <= height:
    new_w, new_h = short, int(short * height / width)
  else:
    new_h, new_w = short, int(short * width / height)
  resized = image.convert("RGB").resize((new_w, new_h), FILTERS[interpolation])
  top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
  return np.asarray(resized.crop((left, top, left + size, top + size)))
