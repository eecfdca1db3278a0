"""Prediction preprocessing equals what eval saw, for JPEG sources too."""

import io

import numpy as np
from PIL import Image

from jaxnet import preprocess
from jaxnet.config_base import base_config
from jaxnet.data.transforms import EvalDecodeCrop


def test_jpeg_file_is_preprocessed_like_the_eval_pipeline(tmp_path):
  rng = np.random.default_rng(0)
  pixels = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
  path = tmp_path / "photo.jpg"
  Image.fromarray(pixels).save(path, quality=90)
  config = base_config()
  config.data.source, config.image_size = "imagefolder", 32
  got = preprocess.load_image(str(path), config, channels=3)
  want = EvalDecodeCrop(32, config.data.eval_crop_fraction).map(
      {"image": path.read_bytes(), "label": np.int32(0)})["image"]
  assert got.shape == (32, 32, 3) and got.dtype == np.uint8
  np.testing.assert_array_equal(got, want)
  # The same image given as an array goes through the same decode path (PNG, lossless).
  assert preprocess.load_image(np.asarray(Image.open(io.BytesIO(path.read_bytes()))), config, 3).shape == (32, 32, 3)
