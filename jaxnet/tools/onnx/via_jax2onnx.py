"""Models without a writer of their own (AlexNet) through jax2onnx: handed the model as a
jaxpr of lax primitives, whose output is then adjusted: NHWC max pools onnxruntime can run
(_repair_max_pools), ReLU in the form onnxruntime fuses into convolutions (_relus_as_relu),
no scalar Gemm biases, which onnxruntime's quantizer rejects (_drop_zero_scalar_gemm_biases)."""

import jax.numpy as jnp

from jaxnet.core.errors import UserError
from jaxnet.tools.onnx import OPSET, fp32_logits_fn, require


def via_jax2onnx(predictor):
  """The model's graph as jax2onnx converts its jaxpr, adjusted where onnxruntime needs it."""
  import jax.extend
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
    raise UserError(f"model {predictor.config.model.name} cannot be exported to ONNX: "
                           f"jax2onnx says: {first_line}; --format=jax exports any model") from None
  _repair_max_pools(model, onnx)
  _relus_as_relu(model, onnx)
  _drop_zero_scalar_gemm_biases(model, onnx)  # also drops the initializers left unused
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
      raise UserError(f"ONNX export: an unexpected max pool {node.name} (kernel {kernel}); "
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


def _relus_as_relu(model, onnx) -> None:
  """jax spells ReLU max(x, 0); as Relu onnxruntime fuses it into the convolution before it.
  Exact: max(x, 0) is relu(x)."""
  initializers = {i.name: i for i in model.graph.initializer}
  for node in model.graph.node:
    zero = initializers.get(node.input[-1]) if node.op_type == "Max" and len(node.input) == 2 else None
    if zero is not None and onnx.numpy_helper.to_array(zero).ndim == 0 and onnx.numpy_helper.to_array(zero) == 0:
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
