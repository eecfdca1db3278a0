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


def _torchvision_eval(path, image_size: int, crop_fraction: float) -> np.ndarray:
  """torchvision's Resize(floor(image_size / crop_fraction)) + CenterCrop(image_size), written
  out on PIL (bilinear): the eval preprocessing the records name."""
  import math
  image = Image.open(path).convert("RGB")
  width, height = image.size
  short = math.floor(image_size / crop_fraction)
  size = (short, int(short * height / width)) if width <= height else (int(short * width / height), short)
  resized = image.resize(size, Image.Resampling.BILINEAR)
  left, top = (int(round((side - image_size) / 2.0)) for side in size)
  return np.asarray(resized.crop((left, top, left + image_size, top + image_size)))


def test_predict_eval_export_metadata_and_calibration_see_the_same_pixels(tmp_path):
  """One eval preprocessing whatever the data source (issue 46): a synthetic-data workdir (what
  imported weights get when there is no dataset) resized files straight to image_size, no crop,
  while its config, preprocessing.json and ONNX metadata recorded a 0.875 center crop."""
  import jax
  from jaxnet.core import models
  from jaxnet.tools import onnx as onnx_export
  from jaxnet.tools.onnx import int8 as onnx_int8
  y, x = np.mgrid[:300, :400]
  rings = 127.5 * (1 + np.sin(np.hypot(y - 150, x - 200) / 8))
  pixels = np.stack([rings, rings[::-1], rings[:, ::-1]], -1).astype(np.uint8)
  for split in ("train", "val"):
    (tmp_path / split / "cat").mkdir(parents=True)
    Image.fromarray(pixels).save(tmp_path / split / "cat" / "photo.jpg", quality=90)
  path = tmp_path / "val" / "cat" / "photo.jpg"
  model = models.create("resnet_tiny", num_classes=3)
  variables = model.init(jax.random.PRNGKey(0), np.zeros((1, 32, 32, 3), np.float32), train=False)
  for source in ("synthetic", "imagefolder", "digits"):
    config = base_config()
    config.data.source, config.image_size, config.data.eval_crop_fraction = source, 32, 0.875
    predictor = preprocess.Predictor(config, model, variables, num_classes=3)
    predicted = predictor.preprocess([str(path)])[0]
    (evaluated,) = pipeline.eval_batches(ImageFolderSource(str(tmp_path), "val"), global_batch_size=1,
                                         image_size=32, crop_fraction=config.data.eval_crop_fraction,
                                         interpolation=config.data.eval_interpolation)
    recorded = onnx_export.metadata(predictor)
    assert (recorded["jaxnet.eval_crop_fraction"], recorded["jaxnet.eval_interpolation"]) == ("0.875", "bilinear")
    reference = _torchvision_eval(path, int(recorded["jaxnet.image_size"]), float(recorded["jaxnet.eval_crop_fraction"]))
    calibration = onnx_int8.calibration_folder(predictor, str(tmp_path / "val"))[0]
    assert predicted.shape == (32, 32, 3), source
    for name, seen in (("eval", evaluated["image"][0]), ("calibration", calibration)):
      np.testing.assert_array_equal(predicted, seen, err_msg=f"{source}: predict and {name}")
    # JPEG decoders agree to within a grey level or two; the crop and scale show as tens.
    assert np.abs(predicted.astype(int) - reference).mean() < 1.5, source
    straight = np.asarray(Image.open(path).convert("RGB").resize((32, 32), Image.Resampling.BILINEAR))
    assert np.abs(predicted.astype(int) - straight).mean() > 10, source


def test_int8_calibration_refuses_random_pixels_of_a_synthetic_workdir(tmp_path):
  """Weights imported with data.source=synthetic: a count of calibration images took random
  pixels as the int8 ranges' sample, silently (issue 46, a hole of the same class)."""
  import jax
  import pytest
  from jaxnet.core import models
  from jaxnet.core.errors import UserError
  from jaxnet.tools import onnx as onnx_export
  from jaxnet.tools.onnx import int8 as onnx_int8
  model = models.create("resnet_tiny", num_classes=3)
  variables = model.init(jax.random.PRNGKey(0), np.zeros((1, 16, 16, 3), np.float32), train=False)
  config = base_config()
  config.data.source, config.image_size = "synthetic", 16
  predictor = preprocess.Predictor(config, model, variables, num_classes=3, workdir=str(tmp_path))
  with pytest.raises(UserError) as e:
    onnx_int8.calibration_images(predictor, 8)
  assert str(e.value) == (f"--calibration-images=8 calibrates on train images, and the workdir {tmp_path} has "
                          f"data.source=synthetic (random pixels): pass --calibration-images=DIR, a folder "
                          f"of images like those the model will see")
