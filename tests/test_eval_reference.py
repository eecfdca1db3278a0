"""jaxnet's eval preprocessing equals torchvision's reference transform on real photographs.

The reference (tests/reference_eval.py) is torchvision's Resize + CenterCrop
done with PIL; experiments/make_reference_logits.py checks it against
torchvision itself (identical pixels). The photographs are scikit-image's
bundled samples, stored as JPEG (what ImageFolder and tfds hold) and as PNG.
"""

import io

import numpy as np
import pytest
import simplejpeg
import skimage.data
from PIL import Image

from jaxnet.tools import predictor as preprocess
from jaxnet.core.config import base_config
from jaxnet.core.data.transforms import EvalDecodeCrop
from tests.reference_eval import resize_center_crop

PHOTOS = ("chelsea", "coffee", "astronaut")  # 451x300, 600x400, 512x512


def encoded(name: str, fmt: str) -> bytes:
  pixels = getattr(skimage.data, name)()
  if fmt == "jpeg":
    return simplejpeg.encode_jpeg(pixels, quality=95, colorspace="RGB", colorsubsampling="420")
  buffer = io.BytesIO()
  Image.fromarray(pixels).save(buffer, format="PNG")
  return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["jpeg", "png"])
@pytest.mark.parametrize("photo", PHOTOS)
@pytest.mark.parametrize("crop_fraction, interpolation", [(0.875, "bilinear"), (0.95, "bicubic")],
                         ids=["torchvision", "timm-a1"])
def test_eval_transform_matches_reference(photo, fmt, crop_fraction, interpolation):
  data = encoded(photo, fmt)
  ours = EvalDecodeCrop(224, crop_fraction, interpolation).map({"image": data, "label": 0})["image"]
  reference = resize_center_crop(Image.open(io.BytesIO(data)), 224, crop_fraction, interpolation)
  assert ours.shape == reference.shape == (224, 224, 3)
  # Bit for bit: the README says eval preprocessing is torchvision's. (Resizing only the crop's
  # window, as jaxnet did before 2026-11-26, was off by one grey level on up to 0.03% of values.)
  np.testing.assert_array_equal(ours, reference)


def test_predict_preprocessing_uses_the_configured_interpolation(tmp_path):
  path = tmp_path / "coffee.jpg"
  path.write_bytes(encoded("coffee", "jpeg"))
  config = base_config()
  config.data.source, config.image_size = "imagefolder", 224
  config.data.eval_crop_fraction, config.data.eval_interpolation = 0.95, "bicubic"
  ours = preprocess.load_image(str(path), config, channels=3)
  reference = resize_center_crop(Image.open(path), 224, 0.95, "bicubic")
  np.testing.assert_array_equal(ours, reference)
  bilinear = resize_center_crop(Image.open(path), 224, 0.95, "bilinear")
  assert np.abs(bilinear.astype(int) - reference).mean() > 1.0  # the filter choice is visible


def test_unknown_interpolation_is_refused():
  with pytest.raises(ValueError, match="eval_interpolation must be one of"):
    EvalDecodeCrop(224, 0.875, "lanczos")
