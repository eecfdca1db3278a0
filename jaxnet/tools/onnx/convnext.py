"""ConvNeXts as ONNX graphs written op by op: the residual stream NCHW, each block's channel
MLP channels-last between two Transposes (as torch.onnx.export writes torchvision's), so that
LayerNormalization, MatMul and the erf GELU are the ops runtimes fuse and quantize."""

import jax
import numpy as np

from jaxnet.core.models.convnext import LN_EPS, ConvNeXt
from jaxnet.tools.onnx.graph import Graph, nchw_input

MODEL = ConvNeXt
TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def gelu(g: Graph, x, name):
  """Exact GELU, x * 0.5 * (1 + erf(x / sqrt(2))), in the order onnxruntime fuses into one Gelu."""
  erf = g.node("Erf", [g.node("Div", [x, g.constant("gelu/sqrt2", np.sqrt(2.0))], f"{name}/div")], f"{name}/erf")
  one_plus = g.node("Add", [erf, g.constant("gelu/one", 1.0)], f"{name}/add")
  return g.node("Mul", [g.node("Mul", [x, one_plus], f"{name}/mul"), g.constant("gelu/half", 0.5)], name)


def write(predictor):
  """A jaxnet ConvNeXt as ONNX: the normalisation folded into the stem convolution (unpadded,
  so exactly), convolutions NCHW (the 7x7 depthwise ones grouped), every LayerNorm a
  LayerNormalization over the last axis of a channels-last view, dense layers MatMul + Add
  with each block's layer scale folded into its second one, then GlobalAveragePool, the head's
  LayerNormalization and Gemm."""
  model, params = predictor.model, jax.device_get(predictor.variables["params"])
  g = Graph(predictor.config)

  def layer_norm(x, module):
    layer = params[module]
    return g.node("LayerNormalization", [x, g.constant(module + "/scale", layer["scale"]),
                                         g.constant(module + "/bias", layer["bias"])],
                  module, axis=-1, epsilon=LN_EPS)

  def channels_last_norm(x, module):
    """LayerNorm over the channels of an NCHW map."""
    y = layer_norm(g.node("Transpose", [x], module + "/nhwc", perm=TO_NHWC), module)
    return g.node("Transpose", [y], module + "/nchw", perm=TO_NCHW)

  def dense(x, name, kernel, bias):
    y = g.node("MatMul", [x, g.constant(name + "/W", kernel)], name + "/matmul")
    return g.node("Add", [y, g.constant(name + "/B", bias)], name)

  scale, shift = g.normalization
  stem = params["stem_conv"]
  kernel = np.asarray(stem["kernel"], np.float32)  # (4, 4, C, D)
  bias = np.asarray(stem["bias"], np.float32) + np.einsum("ijcd,c->d", kernel, shift)
  x = g.conv(nchw_input(g), "stem_conv", kernel * scale[:, None], bias, stride=kernel.shape[0], pads=[0] * 4)
  x = channels_last_norm(x, "stem_norm")
  for stage, depth in enumerate(model.depths):
    if stage > 0:
      x = channels_last_norm(x, f"downsample{stage + 1}_norm")
      down = params[f"downsample{stage + 1}_conv"]
      x = g.conv(x, f"downsample{stage + 1}_conv", down["kernel"], down["bias"], stride=2, pads=[0] * 4)
    for b in range(depth):
      block = f"stage{stage + 1}_block{b + 1}"
      p = params[block]
      width = p["dwconv"]["kernel"].shape[-1]
      y = g.conv(x, f"{block}/dwconv", p["dwconv"]["kernel"], p["dwconv"]["bias"], groups=width)
      y = g.node("Transpose", [y], f"{block}/nhwc", perm=TO_NHWC)
      y = g.node("LayerNormalization", [y, g.constant(f"{block}/norm/scale", p["norm"]["scale"]),
                                        g.constant(f"{block}/norm/bias", p["norm"]["bias"])],
                 f"{block}/norm", axis=-1, epsilon=LN_EPS)
      y = gelu(g, dense(y, f"{block}/fc1", p["fc1"]["kernel"], p["fc1"]["bias"]), f"{block}/gelu")
      gamma = np.asarray(p["layer_scale"], np.float32)  # gamma * (y W + b) = y (W gamma) + b gamma
      y = dense(y, f"{block}/fc2", np.asarray(p["fc2"]["kernel"], np.float32) * gamma,
                np.asarray(p["fc2"]["bias"], np.float32) * gamma)
      y = g.node("Transpose", [y], f"{block}/nchw", perm=TO_NCHW)
      x = g.node("Add", [x, y], f"{block}/out")
  x = g.node("Flatten", [g.node("GlobalAveragePool", [x], "pool")], "flatten", axis=1)
  x = layer_norm(x, "head_norm")
  g.gemm(x, "head", params["head"], out="logits")
  return g.model(predictor, [("logits", ["batch", predictor.num_classes])])
