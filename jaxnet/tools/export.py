"""A trained model out of jaxnet as a jax function: the serialized function and its int8 version.
(ONNX, and its int8 version: jaxnet/tools/onnx/.)

The exported function is `outputs = f(images)`:
  images   uint8 (batch, H, W, C), the preprocessed images (the task's preprocess: a
           classifier's resize and center crop); batch is symbolic, so any batch size runs
           the same file
  outputs  the task's (jaxnet/core/tasks): a classifier's logits float32 (batch, num_classes)
Normalization and the model in eval mode (BN running statistics, EMA params when the run
kept an EMA) are inside: it is the task's predict function, the one the eval step runs.

- jax (`save`): jax.export's serialization, params baked in as constants, so the file alone
  is the model; no jaxnet, Flax or checkpoint is needed to run it, only jax:
      exported = jax.export.deserialize(bytearray(open(FILE, "rb").read()))
      logits = exported.call(images)
  FILE.json beside it records the input shape and the class names. `platforms` lists the
  backends to lower for (default: the one exporting).
- jax int8 (`qwix_quantize`): qwix post-training quantization; every convolution and dense
  layer computes in int8: weights quantized once, one scale per output channel; activations
  on the fly, one scale per image from its own range (dynamic: no calibration set).
Every file is written under a temporary name beside its target and renamed when complete.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxnet.core.errors import UserError
from jaxnet.core.metrics import write_atomically, write_file_atomically

# The optional packages: the onnx extra holds qwix too.
INSTALL = "pip install -e '.[onnx]'"


def export(predictor, platforms=None) -> "jax.export.Exported":
  """The Predictor's eval-mode function with its variables baked in, batch-polymorphic."""
  variables, predict_fn = predictor.variables, predictor.predict_fn

  def infer(images):
    return predict_fn(variables, images)

  batch = jax.export.symbolic_shape("b")[0]
  spec = jax.ShapeDtypeStruct((batch, *predictor.image_shape), jnp.uint8)
  return jax.export.export(jax.jit(infer), platforms=platforms)(spec)


def save(predictor, path: str, platforms=None, quantization: str | None = None) -> None:
  """Writes the serialized function to `path` and its description to `path`.json, each whole
  or not at all (a failure leaves both as they were)."""
  exported = export(predictor, platforms)
  data = exported.serialize()
  metadata = {"image_shape": list(predictor.image_shape), "dtype": "uint8",
              "class_names": predictor.class_names, "platforms": list(exported.platforms),
              "workdir": run_name(predictor), "step": predictor.step}
  if quantization:
    metadata["quantization"] = quantization

  def write_bytes(tmp):
    with open(tmp, "wb") as f:
      f.write(data)
  write_file_atomically(path, write_bytes)
  write_atomically(path + ".json", json.dumps(metadata, indent=2))


def run_name(predictor) -> str:
  """The workdir's name, not its path: an exported file names no folder of this machine."""
  return os.path.basename(os.path.normpath(str(predictor.workdir)))


class ExportedModel:
  """A loaded export: call it on a uint8 (batch, H, W, C) array to get float32 logits."""

  def __init__(self, exported, metadata: dict | None = None):
    self.exported = exported
    self.metadata = metadata or {}
    self.class_names = self.metadata.get("class_names")
    self.image_shape = tuple(exported.in_avals[0].shape[1:])

  def __call__(self, images) -> jax.Array:
    images = np.asarray(images)
    if images.dtype != np.uint8:  # a cast would silently wrap or truncate pixel values
      raise TypeError(f"images must be uint8 (batch, {', '.join(map(str, self.image_shape))}), "
                      f"got {images.dtype}")
    return self.exported.call(images)


def load(path: str) -> ExportedModel:
  with open(path, "rb") as f:
    exported = jax.export.deserialize(bytearray(f.read()))
  try:
    with open(path + ".json") as f:
      metadata = json.load(f)
  except FileNotFoundError:  # the metadata is a convenience; the function stands alone
    metadata = None
  return ExportedModel(exported, metadata)


# --- int8 served by jax: qwix ------------------------------------------------------------

QWIX_DESCRIPTION = ("int8 (qwix PTQ): weights one scale per output channel, activations one scale "
               "per image, dynamic")


def qwix_quantize(predictor):
  """The predictor with int8 weights and activations in every conv and dense layer."""
  try:
    import qwix
  except ImportError:
    raise UserError(f"--format=jax --int8 needs the package qwix, which is not installed: "
                           f"{INSTALL}") from None
  from jaxnet.tools.predictor import Predictor
  rule = qwix.QtRule(module_path=".*", weight_qtype="int8", act_qtype="int8")
  model = qwix.quantize_model(predictor.model, qwix.PtqProvider([rule]))
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                             jnp.zeros((1, *predictor.image_shape)), train=False))
  variables = dict(predictor.variables)
  variables["params"] = qwix.quantize_params(predictor.variables["params"], shapes["params"])
  return Predictor(predictor.config, model, variables, num_classes=predictor.num_classes,
                   class_names=predictor.class_names, step=predictor.step, workdir=predictor.workdir)
