"""Image and mask moved together, on the host (Grain workers), to image_size x image_size.

  train  resize by image_size / the longer side times a random factor in
         segmentation.scale_range (image bilinear, mask nearest), pad to at least image_size
         (image 0, mask the ignore label), crop image_size at random, flip horizontally half
         the time: torchvision's reference recipe (RandomResize, RandomCrop with the target
         padded with 255, RandomHorizontalFlip), its scales taken from the longer side.
  eval   the whole image resized so its longer side is image_size, padded at the bottom and
         right; the padding's mask is the ignore label, so it counts nowhere, whatever the
         image's size. The metrics are taken at this resolution, as torchvision's reference
         takes them at its resized 520 pixels.

An example is {"image" uint8 (S, S, 3), "labels" uint8 (S, S), "mask", "corrupt", "scale"
(the resize factor), "source_size" (height, width)}; an unreadable image is all ignore,
masked and counted.
"""

from typing import Any

import grain.python as grain
import numpy as np
from PIL import Image

from jaxnet.core.data import transforms
from jaxnet.core.tasks.segmentation.data import read_mask


def example(image, labels, scale: float, source_size, ok: bool) -> dict:
  return {"image": image, "labels": labels, "scale": np.float32(scale),
          "source_size": np.array(source_size, np.int32), "mask": np.bool_(ok), "corrupt": np.int32(not ok)}


def resize(pixels, labels, scale: float):
  height, width = pixels.shape[:2]
  size = (max(1, round(width * scale)), max(1, round(height * scale)))
  image = np.asarray(Image.fromarray(pixels).resize(size, Image.Resampling.BILINEAR))
  return image, np.asarray(Image.fromarray(labels).resize(size, Image.Resampling.NEAREST))


class SegmentationTransform(grain.RandomMapTransform):
  def __init__(self, image_size: int, train: bool, scale_range=(1.0, 1.0), ignore_label: int = 255,
               warn: bool = True):
    self.image_size, self.train, self.scale_range = image_size, train, tuple(scale_range)
    self.ignore_label = ignore_label
    self.warn = warn  # False: the caller names an unreadable image itself (predict)

  def map(self, element: dict[str, Any]):
    """Eval's transform draws nothing: the same output for any generator."""
    assert not self.train
    return self.random_map(element, np.random.default_rng(0))

  def random_map(self, element: dict[str, Any], rng: np.random.Generator):
    size = self.image_size
    pixels = transforms.decoded(element, self.warn)
    if pixels is None:
      return example(np.zeros((size, size, 3), np.uint8), np.full((size, size), self.ignore_label, np.uint8),
                     1.0, (0, 0), ok=False)
    height, width = pixels.shape[:2]
    mask_png = element.get("mask_png")
    labels = (read_mask(mask_png) if mask_png is not None
              else np.full((height, width), self.ignore_label, np.uint8))  # predict: no mask
    scale = size / max(height, width)
    if self.train:
      scale *= rng.uniform(*self.scale_range)
    image, labels = resize(pixels, labels, scale)
    new_h, new_w = labels.shape
    canvas_h, canvas_w = (max(new_h, size), max(new_w, size)) if self.train else (size, size)
    padded_image = np.zeros((canvas_h, canvas_w, 3), np.uint8)
    padded_labels = np.full((canvas_h, canvas_w), self.ignore_label, np.uint8)
    padded_image[:new_h, :new_w], padded_labels[:new_h, :new_w] = image[:canvas_h, :canvas_w], labels[:canvas_h, :canvas_w]
    top = int(rng.integers(0, canvas_h - size + 1))
    left = int(rng.integers(0, canvas_w - size + 1))
    image = padded_image[top:top + size, left:left + size]
    labels = padded_labels[top:top + size, left:left + size]
    if self.train and rng.random() < 0.5:
      image, labels = image[:, ::-1], labels[:, ::-1]
    return example(np.ascontiguousarray(image), np.ascontiguousarray(labels), scale, (height, width), ok=True)
