"""Prediction preprocessing equals what eval saw, for JPEG sources too."""

import io

import numpy as np
from PIL import Image

from jaxnet.tools import predictor as preprocess
from jaxnet.core.config import base_config
from jaxnet.core.data import pipeline
from jaxnet.core.data.imagefolder import ImageFolderSource
from jaxnet.core.data.transforms import EvalDecodeCrop


def test_jpeg_file_is_preprocessed_like_the_eval_pipeline(tmp_path):
  # Rings around the center: crops of different fractions of it look clearly different.
  y, x = np.mgrid[:300, :400]
  rings = 127.5 * (1 + np.sin(np.hypot(y - 150, x - 200) / 8))
  pixels = np.repeat(rings[..., None], 3, -1).astype(np.uint8)
  for split in ("train", "val"):
    (tmp_path / split / "cat").mkdir(parents=True)
    Image.fromarray(pixels).save(tmp_path / split / "cat" / "photo.jpg", quality=90)
  path = tmp_path / "val" / "cat" / "photo.jpg"
  config = base_config()
  # Not the default crop, so a preprocessing that ignored the config would differ.
  config.data.source, config.image_size, config.data.eval_crop_fraction = "imagefolder", 32, 0.5
  got = preprocess.load_image(str(path), config, channels=3)
  # What eval sees: the eval pipeline, given the config's crop as train.py gives it.
  (seen,) = pipeline.eval_batches(ImageFolderSource(str(tmp_path), "val"), global_batch_size=1,
                                  image_size=32, crop_fraction=config.data.eval_crop_fraction)
  assert got.shape == (32, 32, 3) and got.dtype == np.uint8
  np.testing.assert_array_equal(got, seen["image"][0])
  default_crop = EvalDecodeCrop(32).map({"image": path.read_bytes(), "label": np.int32(0)})["image"]
  assert np.abs(got.astype(int) - default_crop).mean() > 40  # the crop fraction shows (measured: 89)
  # The same image given as an array goes through the same decode path (PNG, lossless).
  assert preprocess.load_image(np.asarray(Image.open(io.BytesIO(path.read_bytes()))), config, 3).shape == (32, 32, 3)
