"""A trained model out of jaxnet as ONNX, for onnxruntime, TensorRT, OpenVINO or Triton.

- ONNX (`save_onnx`): the model's eval-mode function in fp32 whatever precision the run
  trained in, input "images", output "logits" (a detector: its head's outputs and anchors);
  the model's metadata_props record how to make the input (image size, channels, mean/std,
  the eval crop and interpolation) and the class names (METADATA_KEYS). Each model family
  has its writer, a module of this package naming the model class it writes (`MODEL`), its
  `write(predictor)` and optionally its `notes(predictor)` (metadata of its own) and
  `OUTPUTS` (its graph's outputs in a few words, when not logits): the graph
  op by op in the form runtimes run fastest (NCHW, BN folded, MatMul, LayerNormalization,
  fusable GELU; graph.py is the builder they share). A new family is a new module here.
- ONNX int8 (int8.py, `save_onnx_int8`): onnxruntime's quantize_static in the QDQ format,
  calibrated on the workdir's train images or a folder of the user's.
Every file is written under a temporary name beside its target and renamed when complete.
"""

import importlib
import json
import pkgutil


from jaxnet.core.errors import UserError
from jaxnet.core.metrics import write_file_atomically
from jaxnet.tools.export import run_name

ONNX_INSTALL = "pip install -e '.[onnx]'"


OPSET = 21  # onnxruntime >= 1.20 runs it; quantize_static's QDQ needs >= 13


METADATA_KEYS = ("jaxnet.input", "jaxnet.image_size", "jaxnet.channels", "jaxnet.mean", "jaxnet.std",
                 "jaxnet.eval_crop_fraction", "jaxnet.eval_interpolation", "jaxnet.class_names",
                 "jaxnet.model", "jaxnet.step", "jaxnet.ema", "jaxnet.workdir")


def require(*modules: str):
  """Imports the optional ONNX packages, or a UserError with the install line."""
  loaded = []
  for name in modules:
    try:
      loaded.append(importlib.import_module(name))
    except ImportError as e:
      raise UserError(f"--format=onnx needs the package {e.name or name}, which is not "
                      f"installed: {ONNX_INSTALL}") from None
  return loaded


def metadata(predictor) -> dict:
  c = predictor.config
  props = {
      "jaxnet.input": "images: uint8 NHWC (batch, image_size, image_size, channels), "
                      "resized and center-cropped as in jaxnet/tools/predictor.py; normalization is inside",
      "jaxnet.image_size": str(c.image_size),
      "jaxnet.channels": str(predictor.image_shape[-1]),
      "jaxnet.mean": json.dumps(list(c.data.mean)),
      "jaxnet.std": json.dumps(list(c.data.std)),
      "jaxnet.eval_crop_fraction": str(c.data.eval_crop_fraction),
      "jaxnet.eval_interpolation": str(c.data.eval_interpolation),
      "jaxnet.class_names": json.dumps(predictor.class_names),
      "jaxnet.model": c.model.name,
      "jaxnet.step": str(predictor.step),
      "jaxnet.ema": str(c.ema_decay > 0).lower(),
      "jaxnet.workdir": run_name(predictor),
  }
  props.update(family(predictor)[1](predictor))
  return props


def writers() -> dict:
  """{model class: its writer module}: every module of this package that names a `MODEL`."""
  modules = (importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__))
  return {module.MODEL: module for module in modules if hasattr(module, "MODEL")}


def family(predictor):
  """(the ONNX writer of the predictor's model family, its metadata beside the common keys);
  a model no module writes is one UserError."""
  module = writers().get(type(predictor.model))
  if module is None:
    raise UserError(f"model {predictor.config.model.name} cannot be exported to ONNX: no module of "
                    f"jaxnet/tools/onnx/ writes {type(predictor.model).__name__}; --format=jax exports any model")
  return module.write, getattr(module, "notes", lambda predictor: {})


def onnx_outputs(predictor) -> str:
  """The outputs of the predictor's ONNX graph, in a few words: its writer's OUTPUTS."""
  return getattr(writers()[type(predictor.model)], "OUTPUTS", "output logits")


def to_onnx(predictor):
  """The predictor's eval-mode fp32 model as an onnx.ModelProto with a dynamic batch, written
  by its family's module."""
  writer = family(predictor)[0]
  (onnx,) = require("onnx")
  model = writer(predictor)
  onnx.helper.set_model_props(model, metadata(predictor))
  onnx.checker.check_model(model)
  return model


def save_onnx(predictor, path: str) -> None:
  """Writes the fp32 ONNX model to path (a temporary file renamed at the end)."""
  (onnx,) = require("onnx")
  model = to_onnx(predictor)
  write_file_atomically(path, lambda tmp: onnx.save_model(model, tmp))
