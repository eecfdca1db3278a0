"""A trained model out of jaxnet as ONNX, for onnxruntime, TensorRT, OpenVINO or Triton.

- ONNX (`save_onnx`): the model's eval-mode function in fp32 whatever precision the run
  trained in, input "images", output "logits" (a detector: its head's outputs and anchors);
  the model's metadata_props record how to make the input (image size, channels, mean/std,
  the eval crop and interpolation) and the class names (METADATA_KEYS). Each model family
  has its writer (`FAMILIES`): ResNets, ViTs and RetinaNets are written op by op in the form
  runtimes run fastest (resnet.py, vit.py, retinanet.py: NCHW, BN folded, MatMul,
  LayerNormalization, fusable GELU; graph.py the builder they share); other models (AlexNet)
  go through jax2onnx (via_jax2onnx.py; docs/deploy.md says why it is installed with
  --no-deps).
- ONNX int8 (int8.py, `save_onnx_int8`): onnxruntime's quantize_static in the QDQ format,
  calibrated on the workdir's train images or a folder of the user's.
Every file is written under a temporary name beside its target and renamed when complete.
"""

import importlib
import json

import jax.numpy as jnp

from jaxnet.core.errors import UserError
from jaxnet.core.metrics import write_file_atomically
from jaxnet.core import steps
from jaxnet.core.state import get_policy
from jaxnet.tools.export import run_name

# jax2onnx is installed apart because it pins orbax-checkpoint<0.11.37, which jaxnet's
# orbax-checkpoint>=0.12.8 rules out; it never imports orbax.
ONNX_INSTALL = "pip install -e '.[onnx]' && pip install --no-deps 'jax2onnx==0.17.1'"


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


def fp32_logits_fn(predictor):
  """`images -> logits` in fp32 with the predictor's variables closed over."""
  model = predictor.model.clone(dtype=jnp.float32) if hasattr(predictor.model, "dtype") else predictor.model
  logits_fn = steps.make_logits_fn(model, get_policy("fp32"),
                                   mean=tuple(predictor.config.data.mean),
                                   std=tuple(predictor.config.data.std))
  variables = predictor.variables
  return lambda images: logits_fn(variables, images)


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


def family(predictor):
  """(the ONNX writer of the predictor's model family, its metadata beside the common keys):
  ResNets', ViTs' and RetinaNets' graphs are written directly, any other model's through
  jax2onnx."""
  from jaxnet.core.models.resnet import ResNet
  from jaxnet.core.models.retinanet import RetinaNet
  from jaxnet.core.models.vit import ViT
  from jaxnet.tools.onnx import resnet, retinanet, via_jax2onnx, vit
  no_notes = lambda predictor: {}
  families = {ResNet: (resnet.resnet_onnx, no_notes), ViT: (vit.vit_onnx, no_notes),
              RetinaNet: (retinanet.retinanet_onnx, retinanet.retinanet_notes)}
  return families.get(type(predictor.model), (via_jax2onnx.via_jax2onnx, no_notes))


def onnx_outputs(predictor) -> str:
  """The outputs of the predictor's ONNX graph, in a few words."""
  return ("outputs class_logits, box_deltas and anchors" if "jaxnet.outputs" in family(predictor)[1](predictor)
          else "output logits")


def to_onnx(predictor):
  """The predictor's eval-mode fp32 function as an onnx.ModelProto with a dynamic batch
  (`family`: written directly, or through jax2onnx)."""
  writer = family(predictor)[0]
  (onnx,) = require("onnx")
  model = writer(predictor)
  onnx.helper.set_model_props(model, metadata(predictor))
  onnx.checker.check_model(model)
  return model


def save_onnx(predictor, path: str) -> None:
  """Writes the fp32 ONNX model to path (a temporary file renamed at the end)."""
  (onnx,) = require("onnx", "jax2onnx")[:1]
  model = to_onnx(predictor)
  write_file_atomically(path, lambda tmp: onnx.save_model(model, tmp))
