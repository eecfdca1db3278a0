"""Write a synthetic ImageNet-style JPEG folder that a small CNN can learn.

    python -m jaxnet.cli.make_imagefolder DIR --classes 10 --per-class 50

gives DIR/train/class_XXX/*.jpg and DIR/val/class_XXX/*.jpg. Images are
ImageNet-like in size (widths 400-600, heights 300-450, a quarter of them
portrait), JPEG quality 90 with 4:2:0 chroma subsampling (as camera and web
JPEGs, ImageNet's among them, are stored), so decode costs are realistic. Each class has
its own colour, stripe orientation and stripe frequency; per-image jitter,
random phase and pixel noise keep it from being trivial. The cues survive
random-resized crops and flips, so accuracy well above chance is reachable.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import simplejpeg

# Additive recurrence with the 3D generalised golden ratio (the "R3"
# low-discrepancy sequence): classes get well-spread (hue, angle, frequency)
# triples for any class count, with no two axes correlated.
_R3 = (0.8191725134, 0.6710436067, 0.5497004779)


def class_name(k: int) -> str:
  return f"class_{k:03d}"


def _class_style(k: int):
  """Per-class colour (RGB in [0,1]), stripe angle (rad), stripes per 100px."""
  hue, angle_unit, frequency_unit = ((0.5 + k * a) % 1.0 for a in _R3)
  rgb = 0.5 + 0.45 * np.cos(2 * np.pi * (hue + np.array([0.0, 1 / 3, 2 / 3])))
  angle = angle_unit * np.pi
  frequency = 2.0 + 6.0 * frequency_unit
  return rgb, angle, frequency


def synth_image(rng: np.random.Generator, k: int, noise: float = 0.05) -> np.ndarray:
  """One uint8 HxWx3 image of class k; `noise` is the luminance noise's std."""
  width, height = int(rng.integers(400, 601)), int(rng.integers(300, 451))
  if rng.random() < 0.25:
    width, height = height, width  # portrait
  rgb, angle, frequency = _class_style(k)
  angle += rng.normal(0, 0.08)
  frequency *= rng.uniform(0.85, 1.15)
  # float32 throughout: about half the time of float64, precision is moot.
  ys = np.arange(height, dtype=np.float32)[:, None]
  xs = np.arange(width, dtype=np.float32)[None, :]
  along = xs * np.float32(np.cos(angle)) + ys * np.float32(np.sin(angle))
  phase = np.float32(rng.uniform(0, 2 * np.pi))
  stripes = np.sin(along * np.float32(2 * np.pi * frequency / 100) + phase)
  # Luminance noise shared across channels (cheaper than per-channel).
  luminance = 0.55 + 0.35 * stripes
  luminance += rng.standard_normal((height, width), dtype=np.float32) * np.float32(noise)
  colour = np.clip(rgb + rng.normal(0, 0.06, 3), 0, 1).astype(np.float32) * 255
  image = luminance[..., None] * colour
  return np.clip(image, 0, 255, out=image).astype(np.uint8)


def make_imagefolder(root: str, classes: int, per_class: int,
                     val_per_class: int | None = None, seed: int = 0,
                     verbose: bool = True, noise: float = 0.05) -> str:
  """Generate the folder and return `root`. Deterministic in `seed`."""
  if val_per_class is None:
    val_per_class = max(1, per_class // 5)
  rng = np.random.default_rng(seed)
  total = classes * (per_class + val_per_class)
  done, start = 0, time.perf_counter()
  for split, count in (("train", per_class), ("val", val_per_class)):
    for k in range(classes):
      class_dir = os.path.join(root, split, class_name(k))
      os.makedirs(class_dir, exist_ok=True)
      for i in range(count):
        pixels = synth_image(rng, k, noise)
        jpeg = simplejpeg.encode_jpeg(pixels, quality=90, colorspace="RGB", colorsubsampling="420")
        with open(os.path.join(class_dir, f"{split}_{k:03d}_{i:05d}.jpg"), "wb") as f:
          f.write(jpeg)
      done += count
      if verbose and (k == classes - 1 or k % max(1, classes // 10) == 0):
        rate = done / (time.perf_counter() - start)
        print(f"{split}: class {k + 1}/{classes}, {done}/{total} images "
              f"({rate:.0f} images/s)", flush=True)
  return root
