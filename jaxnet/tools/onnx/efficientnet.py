"""EfficientNets (B0-B7, V2) as ONNX graphs written op by op: NCHW, each BN folded into its
convolution, depthwise convolutions grouped, SiLU as x * Sigmoid(x), squeeze-excitation as
GlobalAveragePool and two 1x1 convolutions."""

import re

import jax
import numpy as np

from jaxnet.core.models.efficientnet import EfficientNet
from jaxnet.tools.onnx.graph import Graph, nchw_input

MODEL = EfficientNet


def write(predictor):
  """A jaxnet EfficientNet as ONNX in the form runtimes run fastest: the normalisation one Add
  per channel with its scale folded into the stem convolution (the shift cannot fold: the stem
  pads with zeros of normalised pixels), every convolution with its BN folded in (eval mode:
  running statistics), then GlobalAveragePool, Flatten, Gemm (dropout is off in eval)."""
  model = predictor.model
  params = jax.device_get(predictor.variables["params"])
  stats = jax.device_get(predictor.variables["batch_stats"])
  g = Graph(predictor.config)

  def silu(x, name):
    return g.node("Mul", [x, g.node("Sigmoid", [x], name + "/sigmoid")], name)

  def conv_bn(x, path, stride=1, act=True, input_scale=1.0, depthwise=False):
    """The ConvBN at `path` (a tuple of module names): its BN folded into the convolution,
    W * s and b - mean * s with s = scale / sqrt(var + eps); `input_scale` per input channel
    folded into W too."""
    layer, running = params, stats
    for key in path:
      layer, running = layer[key], running[key]
    kernel = np.asarray(layer["conv"]["kernel"], np.float32)
    kernel = kernel * np.broadcast_to(np.asarray(input_scale, np.float32), kernel.shape[2:3])[:, None]
    s = np.asarray(layer["bn"]["scale"]) / np.sqrt(np.asarray(running["bn"]["var"]) + model.bn_epsilon)
    name = "/".join(path)
    y = g.conv(x, name + "/conv", kernel * s, np.asarray(layer["bn"]["bias"]) - np.asarray(running["bn"]["mean"]) * s,
               stride, pads=[(kernel.shape[0] - 1) // 2] * 4, groups=kernel.shape[-1] if depthwise else 1)
    return silu(y, name + "/silu") if act else y

  def squeeze_excitation(x, block, layer):
    p, name = params[block][layer], f"{block}/{layer}"
    s = g.node("GlobalAveragePool", [x], name + "/pool")
    s = silu(g.conv(s, name + "/fc1", p["fc1"]["kernel"], p["fc1"]["bias"], pads=[0] * 4), name + "/fc1_silu")
    gate = g.node("Sigmoid", [g.conv(s, name + "/fc2", p["fc2"]["kernel"], p["fc2"]["bias"], pads=[0] * 4)],
                  name + "/gate")
    return g.node("Mul", [x, gate], name)

  scale, shift = g.normalization
  channels = len(scale)
  x = g.node("Add", [nchw_input(g), g.constant("normalize/shift", (shift / scale).reshape(1, channels, 1, 1))],
             "normalize/add")
  x = conv_bn(x, ("stem",), stride=2, input_scale=scale)
  for i, stage in enumerate(model.stages):
    for b in range(stage.blocks):
      block, stride = f"stage{i + 1}_block{b + 1}", stage.stride if b == 0 else 1
      y = x
      # The block's layers in order, as the model names them: role then place (efficientnet.py).
      layers = sorted(params[block], key=_place)
      for layer in layers:
        role = layer.rstrip("0123456789")
        if role == "se":
          y = squeeze_excitation(y, block, layer)
        else:
          y = conv_bn(y, (block, layer), stride if role in ("fused", "depthwise") else 1, act=role != "project",
                      depthwise=role == "depthwise")
      # A residual iff the shapes agree: stride 1 and the block's input width its output width.
      first = params[block][layers[0]]["conv"]["kernel"]
      in_width = first.shape[-1] if layers[0].startswith("depthwise") else first.shape[2]
      if stride == 1 and in_width == stage.out_width:
        y = g.node("Add", [x, y], f"{block}/out")
      x = y
  x = conv_bn(x, (f"stage{len(model.stages) + 1}_head",))
  x = g.node("Flatten", [g.node("GlobalAveragePool", [x], "pool")], "flatten", axis=1)
  g.gemm(x, "head", params["head"], out="logits")
  return g.model(predictor, [("logits", ["batch", predictor.num_classes])])


def _place(layer: str) -> int:
  """A block layer's place in the block: the number its name ends with (`depthwise1` -> 1)."""
  return int(re.search(r"\d+$", layer)[0])
