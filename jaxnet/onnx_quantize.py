"""Static int8 post-training quantization of an exported ONNX model (`export --int8`).

onnxruntime's quantize_static in the QDQ format: int8 weights with one scale per
output channel, uint8 activations (onnxruntime's recommended pair on x86 CPUs) whose
ranges come from running the fp32 model on N images of the workdir's train split,
preprocessed as eval preprocesses (resize, center crop; no augmentation). Before
quantizing, onnxruntime's pre-processing folds the graph (BN into the convolutions,
constants, shapes), so fewer tensors need quantizing.
"""

import os
import tempfile

import numpy as np

from jaxnet import errors, onnx_export
from jaxnet.metrics import replace_atomically

DEFAULT_CALIBRATION_IMAGES = 256  # onnxruntime's examples use a few hundred


class _Subset:
  """Records `indices` of a source, with the source's attributes eval_batches reads."""

  def __init__(self, source, indices):
    self.source, self.indices = source, list(indices)
    self.encoded = source.encoded

  def __len__(self):
    return len(self.indices)

  def __getitem__(self, i):
    return self.source[self.indices[i]]


def calibration_images(predictor, num_images: int, seed: int = 0) -> np.ndarray:
  """num_images uint8 images drawn (without replacement, fixed seed) from the train split."""
  from jaxnet.data import pipeline, sources
  config = predictor.config
  if num_images < 1:
    raise errors.UserError(f"--calibration-images={num_images}: give at least 1")
  source = sources.make_source(config.data, "train", config.image_size)
  if len(source) < num_images:
    raise errors.UserError(f"--calibration-images={num_images}, but the train split of "
                           f"{predictor.workdir} has only {len(source)} images; pass "
                           f"--calibration-images={len(source)} or fewer")
  indices = np.sort(np.random.default_rng(seed).choice(len(source), num_images, replace=False))
  images = []
  for batch in pipeline.eval_batches(_Subset(source, indices), global_batch_size=64,
                                     image_size=config.image_size,
                                     crop_fraction=config.data.eval_crop_fraction,
                                     interpolation=config.data.eval_interpolation):
    images.append(batch["image"][batch["mask"]])  # padding and unreadable JPEGs left out
  images = np.concatenate(images)
  if len(images) < num_images:
    raise errors.UserError(f"--calibration-images={num_images}, but only {len(images)} of the drawn "
                           f"train images could be decoded; pass --calibration-images={len(images)}")
  return images


class _Reader:
  """quantize_static's CalibrationDataReader protocol over a uint8 array, in batches."""

  def __init__(self, images: np.ndarray, batch_size: int = 32):
    self.batches = iter([images[i:i + batch_size] for i in range(0, len(images), batch_size)])

  def get_next(self):
    batch = next(self.batches, None)
    return None if batch is None else {"images": batch}


def quantize(model, images: np.ndarray):
  """An fp32 onnx.ModelProto -> its int8 QDQ version, calibrated on `images`."""
  onnx, quantization, shape_inference = onnx_export.require(
      "onnx", "onnxruntime.quantization", "onnxruntime.quantization.shape_inference")
  with tempfile.TemporaryDirectory() as tmp:
    fp32, prepared, int8 = (os.path.join(tmp, n) for n in ("fp32.onnx", "prepared.onnx", "int8.onnx"))
    onnx.save_model(model, fp32)
    shape_inference.quant_pre_process(fp32, prepared)
    quantization.quantize_static(
        prepared, int8, _Reader(images),
        quant_format=quantization.QuantFormat.QDQ, per_channel=True,
        activation_type=quantization.QuantType.QUInt8, weight_type=quantization.QuantType.QInt8,
        calibrate_method=quantization.CalibrationMethod.MinMax)
    quantized = onnx.load_model(int8)
  del quantized.metadata_props[:]
  props = {p.key: p.value for p in model.metadata_props}
  props["jaxnet.quantization"] = (f"int8 QDQ (onnxruntime quantize_static), per-channel weights, "
                                  f"MinMax calibration on {len(images)} train images")
  onnx.helper.set_model_props(quantized, props)
  return quantized


def save_int8(predictor, path: str, num_images: int = DEFAULT_CALIBRATION_IMAGES) -> None:
  """Exports, quantizes and writes the int8 model to path (nothing at path on failure)."""
  (onnx,) = onnx_export.require("onnx", "jax2onnx", "onnxruntime.quantization")[:1]
  images = calibration_images(predictor, num_images)  # fails early, before the export
  quantized = quantize(onnx_export.to_onnx(predictor), images)
  replace_atomically(path, lambda tmp: onnx.save_model(quantized, tmp))
