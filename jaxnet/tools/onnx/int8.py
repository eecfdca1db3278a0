"""ONNX int8 (`save_onnx_int8`): onnxruntime's quantize_static in the QDQ format: int8 weights
with one scale per output channel, int8 activations (S8S8) whose ranges come from running the fp32 model on N images of the workdir's train split
(or a folder of the user's images), preprocessed as eval preprocesses (no augmentation);
LayerNorms stay fp32. onnxruntime's pre-processing (shape inference, constant folding) runs
first."""

import os
import tempfile

import numpy as np

from jaxnet.core.errors import UserError
from jaxnet.core.metrics import write_file_atomically
from jaxnet.tools.onnx import require, to_onnx


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
  """num_images uint8 images of the train split, preprocessed as eval does (the task's eval
  transform where it has one: a segmenter's whole image, resized and padded): drawn in a fixed
  random order (seed), unreadable files passed over (and named, in one line) until there are
  enough. A UserError with the number that would work when the split has too few."""
  from jaxnet.core.data import pipeline
  config = predictor.config
  if num_images < 1:
    raise UserError(f"--calibration-images={num_images}: give at least 1")
  if config.data.source == "synthetic":
    # Random pixels would set the int8 ranges, silently: imported weights get this source when
    # there is no dataset (python -m jaxnet.cli.weights import --config.data.source=synthetic).
    raise UserError(f"--calibration-images={num_images} calibrates on train images, and the workdir "
                    f"{predictor.workdir} has data.source=synthetic (random pixels): pass "
                    f"--calibration-images=DIR, a folder of images like those the model will see")
  source = predictor.task.make_source(config, "train")  # the task's train data
  if len(source) < num_images:
    raise UserError(f"--calibration-images={num_images}, but the train split of "
                    f"{predictor.workdir} has only {len(source)} images; pass "
                    f"--calibration-images={len(source)} or fewer")
  transform = predictor.task.transform(source, config.image_size, False, config)  # None: an image's own
  order = np.random.default_rng(seed).permutation(len(source))
  images, unreadable, chunk = [], [], 64
  for start in range(0, len(order), chunk):
    indices = order[start:start + chunk]
    taken = 0
    for batch in pipeline.eval_batches(_Subset(source, indices), global_batch_size=chunk,
                                       image_size=config.image_size, warn_corrupt=False,
                                       crop_fraction=config.data.eval_crop_fraction,
                                       interpolation=config.data.eval_interpolation, transform=transform):
      n = min(len(indices) - taken, len(batch["mask"]))  # the rest of the batch is padding
      images += list(batch["image"][:n][batch["mask"][:n]])
      unreadable += [getattr(source, "path", str)(int(i)) for i, ok in
                     zip(indices[taken:taken + n], batch["mask"][:n]) if not ok]
      taken += n
    if len(images) >= num_images:
      break
  if unreadable:
    shown = ", ".join(unreadable[:5]) + (f" and {len(unreadable) - 5} more" if len(unreadable) > 5 else "")
    print(f"note: calibration passed over {len(unreadable)} unreadable train file(s): {shown}", flush=True)
  if len(images) < num_images:
    fix = (f"pass --calibration-images={len(images)} or fewer" if images else
           "fix or remove the unreadable files")
    raise UserError(f"--calibration-images={num_images}, but only {len(images)} of the "
                    f"{len(source)} train images of {predictor.workdir} are readable: {fix}")
  return np.stack(images[:num_images])


class _Reader:
  """quantize_static's CalibrationDataReader protocol over a uint8 array, in batches."""

  # Small batches: the calibrator's session returns every activation of a batch, and its peak
  # memory follows the batch (ResNet-50 at 224px, 256 images: 2.6 GiB at 8, 7.6 GiB at 32).
  def __init__(self, images: np.ndarray, batch_size: int = 8):
    self.batches = iter([images[i:i + batch_size] for i in range(0, len(images), batch_size)])

  def get_next(self):
    batch = next(self.batches, None)
    return None if batch is None else {"images": batch}


def quantize_onnx(model, images: np.ndarray, of: str = "train images", symbolic_shapes: bool = True):
  """An fp32 onnx.ModelProto -> its int8 QDQ version, calibrated on `images`.
  `symbolic_shapes=False` skips the pre-processing's symbolic shape inference, for graphs it
  fails on (torch.onnx.export's ViT: experiments/bench_inference.py)."""
  onnx, quantization, shape_inference = require(
      "onnx", "onnxruntime.quantization", "onnxruntime.quantization.shape_inference")
  with tempfile.TemporaryDirectory() as tmp:
    fp32, prepared, int8 = (os.path.join(tmp, n) for n in ("fp32.onnx", "prepared.onnx", "int8.onnx"))
    onnx.save_model(model, fp32)
    shape_inference.quant_pre_process(fp32, prepared, skip_symbolic_shape=not symbolic_shapes)
    quantization.quantize_static(
        prepared, int8, _Reader(images),
        quant_format=quantization.QuantFormat.QDQ, per_channel=True,
        # S8S8, not U8S8: onnxruntime runs U8S8 on x86 CPUs without VNNI with an instruction
        # that saturates its int16 sums (its documentation's caveat), which took a digits
        # ResNet from 0.9889 to 0.7827 top-1 on this project's AMD EPYC (no VNNI); S8S8 holds
        # on every CPU.
        activation_type=quantization.QuantType.QInt8, weight_type=quantization.QuantType.QInt8,
        calibrate_method=quantization.CalibrationMethod.MinMax,
        nodes_to_exclude=fp32_nodes(model))
    quantized = onnx.load_model(int8)
  del quantized.metadata_props[:]
  props = {p.key: p.value for p in model.metadata_props}
  props["jaxnet.quantization"] = (f"int8 QDQ (onnxruntime quantize_static), per-channel weights, "
                                  f"MinMax calibration on {len(images)} {of}")
  onnx.helper.set_model_props(quantized, props)
  return quantized


def fp32_nodes(model) -> list[str]:
  """The nodes an int8 model keeps in fp32: the input's cast and normalisation (everything
  before the first Conv, MatMul or Gemm: quantized, they would cost a requantization of the
  whole image and its precision), LayerNorms (their statistics lose too much in 8 bits,
  and the quantizer has no per-channel axis for their 1-D scale) and Resize (a segmenter's
  upsampling of its logits: interpolated in int8 they are rounded to the 8-bit grid again, and
  its class maps agreed with the float model's on 97.9% of the pixels against 98.7% in float:
  docs/segmentation.md)."""
  names, first_layer_seen = [], False
  for node in model.graph.node:  # in topological order
    first_layer_seen = first_layer_seen or node.op_type in ("Conv", "MatMul", "Gemm")
    if not first_layer_seen or node.op_type in ("LayerNormalization", "Resize"):
      names.append(node.name)
  return names


def calibration_folder(predictor, folder: str) -> np.ndarray:
  """Every image file under `folder` (any layout: the deployment's own photos), preprocessed
  as eval does; unreadable files passed over and named in one line."""
  from jaxnet.core.data.imagefolder import EXTENSIONS_TEXT, is_image_name
  from jaxnet.tools.predictor import ImageReadError
  if not os.path.isdir(folder):
    raise UserError(f"--calibration-images={folder}: no such folder (give a folder of images, or a count "
                    f"of train images)")
  files = sorted(os.path.join(root, name) for root, dirs, names in os.walk(folder)
                 for name in names if is_image_name(name))
  images, unreadable = [], []
  for path in files:
    try:
      images.append(predictor.preprocess([path])[0])
    except ImageReadError:
      unreadable.append(os.path.relpath(path, folder))
  if unreadable:
    shown = ", ".join(unreadable[:5]) + (f" and {len(unreadable) - 5} more" if len(unreadable) > 5 else "")
    print(f"note: calibration passed over {len(unreadable)} unreadable file(s) of {folder}: {shown}", flush=True)
  if not images:
    raise UserError(f"--calibration-images={folder} holds no readable {EXTENSIONS_TEXT} image")
  return np.stack(images)


def save_onnx_int8(predictor, path: str, calibration=DEFAULT_CALIBRATION_IMAGES) -> None:
  """Exports, quantizes and writes the int8 model to path (nothing at path on failure).
  `calibration`: a number of train images, or a folder of images."""
  (onnx,) = require("onnx", "onnxruntime.quantization")[:1]
  from_folder = isinstance(calibration, str)
  images = (calibration_folder(predictor, calibration) if from_folder
            else calibration_images(predictor, calibration))  # fails early, before the export
  of = f"images of {os.path.basename(os.path.normpath(calibration))}" if from_folder else "train images"
  quantized = quantize_onnx(to_onnx(predictor), images, of)
  write_file_atomically(path, lambda tmp: onnx.save_model(quantized, tmp))
