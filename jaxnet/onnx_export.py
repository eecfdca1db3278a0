"""A trained model as an ONNX file, for onnxruntime, TensorRT, OpenVINO or Triton.

  python -m jaxnet.export --workdir=DIR --format=onnx --out=model.onnx [--int8]

The graph is the eval-mode function `jaxnet.export` serializes (steps.make_logits_fn:
BN running statistics, the EMA params when the run kept an EMA, normalization
inside), always in fp32 whatever precision the run trained in:
  input  "images"  uint8 (batch, H, W, C), NHWC, the preprocessed images
                   (jaxnet/preprocess.py: resize, center crop); batch is dynamic
  output "logits"  float32 (batch, num_classes)
The model's metadata_props record how to make the input (image size, channels,
mean/std, the eval crop and interpolation) and the class names (METADATA_KEYS).

The converter is jax2onnx (docs/deploy.md says why it is installed with --no-deps).
It is handed the model as a jaxpr of lax primitives rather than as Flax modules,
so its Flax-level rewrites (whose signatures differ from ours) are never involved.
Its output is then adjusted: NHWC max pools onnxruntime can run (_repair_max_pools),
BN and ReLU in the forms onnxruntime fuses into convolutions (_make_fusable), no
scalar Gemm biases, which onnxruntime's quantizer rejects (_drop_zero_scalar_gemm_biases).
"""

import importlib
import json


from jaxnet import errors
from jaxnet.metrics import replace_atomically

# Installed in two commands because jax2onnx pins orbax-checkpoint<0.11.37, which
# jaxnet's orbax-checkpoint>=0.12.8 rules out; jax2onnx never imports orbax.
INSTALL = "pip install -e '.[onnx]' && pip install --no-deps 'jax2onnx==0.17.1'"
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
      raise errors.UserError(f"--format=onnx needs the package {e.name or name}, which is not "
                             f"installed: {INSTALL}") from None
  return loaded


def quiet_converter_logs() -> None:
  """For command-line entry points only (it sets process-wide log levels): jax2onnx
  imports every plugin it ships and logs a warning with a traceback for each one whose
  package (equinox, dm-pix: other libraries' layers, never used for jaxnet models) is
  absent."""
  import logging
  logging.getLogger("jax2onnx").setLevel(logging.ERROR)


def fp32_logits_fn(predictor):
  """`images -> logits` in fp32 with the predictor's variables closed over."""
  import jax.numpy as jnp
  from jaxnet import precision, steps
  model = predictor.model.clone(dtype=jnp.float32) if hasattr(predictor.model, "dtype") else predictor.model
  logits_fn = steps.make_logits_fn(model, precision.get_policy("fp32"),
                                   mean=tuple(predictor.config.data.mean),
                                   std=tuple(predictor.config.data.std))
  variables = predictor.variables
  return lambda images: logits_fn(variables, images)


def metadata(predictor) -> dict:
  c = predictor.config
  return {
      "jaxnet.input": "images: uint8 NHWC (batch, image_size, image_size, channels), "
                      "resized and center-cropped as in jaxnet/preprocess.py; normalization is inside",
      "jaxnet.image_size": str(c.image_size),
      "jaxnet.channels": str(predictor.channels),
      "jaxnet.mean": json.dumps(list(c.data.mean)),
      "jaxnet.std": json.dumps(list(c.data.std)),
      "jaxnet.eval_crop_fraction": str(c.data.eval_crop_fraction),
      "jaxnet.eval_interpolation": str(c.data.eval_interpolation),
      "jaxnet.class_names": json.dumps(predictor.class_names),
      "jaxnet.model": c.model.name,
      "jaxnet.step": str(predictor.step),
      "jaxnet.ema": str(c.ema_decay > 0).lower(),
      "jaxnet.workdir": str(predictor.workdir),
  }


def to_onnx(predictor):
  """The predictor's eval-mode fp32 function as an onnx.ModelProto with a dynamic batch."""
  import jax
  import jax.extend
  import jax.numpy as jnp
  (jax2onnx, onnx) = require("jax2onnx", "onnx")
  fn = fp32_logits_fn(predictor)
  spec = jax.ShapeDtypeStruct(jax.export.symbolic_shape("batch")
                              + tuple(predictor.image_shape), jnp.uint8)
  # Traced to lax primitives first: jax2onnx then converts primitives only.
  with jax.disable_jit():  # inlines nested jits: jax2onnx 0.17's jit lowering fails on jax 0.12
    closed = jax.make_jaxpr(fn)(spec)
  as_fun = jax.extend.core.jaxpr_as_fun(closed)
  try:
    model = jax2onnx.to_onnx(lambda images: as_fun(images)[0], [spec], opset=OPSET,
                             model_name=predictor.config.model.name,
                             input_names=["images"], output_names=["logits"])
  except NotImplementedError as e:  # jax2onnx's answer to a primitive it has no lowering for
    first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise errors.UserError(f"model {predictor.config.model.name} cannot be exported to ONNX: "
                           f"jax2onnx says: {first_line}; --format=jax exports any model") from None
  _repair_max_pools(model, onnx)
  _make_fusable(model, onnx)
  _drop_zero_scalar_gemm_biases(model, onnx)  # also drops the initializers left unused
  onnx.helper.set_model_props(model, metadata(predictor))
  onnx.checker.check_model(model)
  return model


def _repair_max_pools(model, onnx) -> None:
  """jax2onnx lowers an NHWC max pool (window (1, k, k, 1)) as a 4-D MaxPool over
  Unsqueeze(Unsqueeze(x)), which onnxruntime rejects ("Unsupported pooling size").
  Rewrites each as Transpose(NCHW) -> 2-D MaxPool -> Transpose(NHWC); MaxPool's
  padding never wins the max, like the -inf padding of lax.reduce_window_max."""
  graph = model.graph
  helper = onnx.helper
  producer = {out: node for node in graph.node for out in node.output}
  nodes = list(graph.node)
  for node in nodes:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    kernel = list(attrs.get("kernel_shape", []))
    if node.op_type != "MaxPool" or len(kernel) != 4:
      continue
    strides = list(attrs.get("strides", [1] * 4))
    pads = list(attrs.get("pads", [0] * 8))
    unsq1 = producer.get(node.input[0])
    unsq0 = producer.get(unsq1.input[0]) if unsq1 is not None else None
    squeeze = [n for n in nodes if node.output[0] in n.input]
    if (kernel[0] != 1 or kernel[3] != 1 or strides[0] != 1 or strides[3] != 1
        or pads[0] or pads[3] or pads[4] or pads[7] or "dilations" in attrs
        or unsq1 is None or unsq1.op_type != "Unsqueeze" or unsq0 is None
        or unsq0.op_type != "Unsqueeze" or len(squeeze) != 1 or squeeze[0].op_type != "Squeeze"):
      raise errors.UserError(f"ONNX export: an unexpected max pool {node.name} (kernel {kernel}); "
                             "this model's pooling is not supported by --format=onnx")
    x, y = unsq0.input[0], squeeze[0].output[0]
    nchw = node.name + "_nchw"
    replacement = [
        helper.make_node("Transpose", [x], [nchw], perm=[0, 3, 1, 2], name=nchw),
        helper.make_node("MaxPool", [nchw], [node.name + "_pooled"], name=node.name,
                         kernel_shape=kernel[1:3], strides=strides[1:3],
                         pads=[pads[1], pads[2], pads[5], pads[6]]),
        helper.make_node("Transpose", [node.name + "_pooled"], [y], perm=[0, 2, 3, 1],
                         name=node.name + "_nhwc"),
    ]
    at = list(graph.node).index(unsq0)
    for old in (unsq0, unsq1, node, squeeze[0]):
      graph.node.remove(old)
    for offset, new in enumerate(replacement):
      graph.node.insert(at + offset, new)
  # The intermediate values' recorded shapes may name removed outputs; drop them all.
  del graph.value_info[:]


def _make_fusable(model, onnx) -> None:
  """Rewrites two jax spellings into the ones onnxruntime fuses into a convolution:
  BN's x - mean (Sub of a constant) becomes x + (-mean), an Add it folds into the Conv's
  bias like the Mul and Add after it; ReLU's max(x, 0) becomes Relu, which it fuses into
  the Conv. Exact: x - m and x + (-m) round alike, and max(x, 0) is relu(x)."""
  graph = model.graph
  initializers = {i.name: i for i in graph.initializer}
  array = onnx.numpy_helper.to_array
  for node in graph.node:
    constant = initializers.get(node.input[-1]) if len(node.input) == 2 else None
    if constant is None:
      continue
    if node.op_type == "Sub":
      negated = onnx.numpy_helper.from_array(-array(constant), name=constant.name + "_negated")
      if negated.name not in initializers:
        graph.initializer.append(negated)
        initializers[negated.name] = negated
      node.op_type = "Add"
      node.input[1] = negated.name
    elif node.op_type == "Max" and array(constant).ndim == 0 and array(constant) == 0:
      node.op_type = "Relu"
      del node.input[1]


def _drop_zero_scalar_gemm_biases(model, onnx) -> None:
  """jax2onnx gives each Gemm without a bias a scalar 0 as its bias C; onnxruntime's
  per-channel quantizer indexes C per output channel and fails on a scalar. C is
  optional in ONNX, and adding 0 is no change: remove it."""
  graph = model.graph
  initializers = {i.name: i for i in graph.initializer}
  for node in graph.node:
    if node.op_type != "Gemm" or len(node.input) < 3 or node.input[2] not in initializers:
      continue
    bias = onnx.numpy_helper.to_array(initializers[node.input[2]])
    if bias.ndim == 0 and bias == 0:
      del node.input[2]
  used = {name for node in graph.node for name in node.input}
  for initializer in [i for i in graph.initializer if i.name not in used]:
    graph.initializer.remove(initializer)


def save(predictor, path: str) -> None:
  """Writes the fp32 ONNX model to path (a temporary file renamed at the end)."""
  (onnx,) = require("onnx", "jax2onnx")[:1]
  model = to_onnx(predictor)
  replace_atomically(path, lambda tmp: onnx.save_model(model, tmp))
