"""AlexNets as ONNX graphs written op by op, in NCHW as torchvision's export writes them."""

import jax
import numpy as np

from jaxnet.core.models.alexnet import AlexNet, pool_bins
from jaxnet.tools.onnx.graph import Graph, nchw_input

MODEL = AlexNet
POOL = 6  # the adaptive average pool's side, before fc1


def feature_side(image_size: int) -> int:
  """The side of conv5's pooled map: conv1 (11x11, stride 4, pad 2), then three 3x3 stride-2
  max pools (the other convolutions keep the size)."""
  side = (image_size + 4 - 11) // 4 + 1
  for _ in range(3):
    side = (side - 3) // 2 + 1
  return side


def write(predictor):
  """A jaxnet AlexNet as ONNX: the normalisation's scale folded into conv1 and its shift one
  Add (conv1 pads with zeros of normalised pixels), Conv/Relu/MaxPool in NCHW, the adaptive
  pool as two MatMuls with constant matrices (none at 224 px, where the map is already 6x6),
  fc1's rows permuted from jaxnet's (h, w, c) flattening to NCHW's (c, h, w), three Gemms.
  Dropout is the identity in eval mode."""
  params = jax.device_get(predictor.variables["params"])
  g = Graph(predictor.config)
  scale, shift = g.normalization
  channels = len(scale)
  x = g.node("Add", [nchw_input(g), g.constant("normalize/shift", (shift / scale).reshape(1, channels, 1, 1))],
             "normalize/add")
  geometry = {"conv1": (4, 2), "conv2": (1, 2), "conv3": (1, 1), "conv4": (1, 1), "conv5": (1, 1)}
  for name, (stride, pad) in geometry.items():
    kernel = np.asarray(params[name]["kernel"], np.float32)
    if name == "conv1":
      kernel = kernel * scale[:, None]  # (H, W, in, out): the input channels' scale
    x = g.node("Relu", [g.conv(x, name, kernel, params[name]["bias"], stride, pads=[pad] * 4)], name + "/relu")
    if name in ("conv1", "conv2", "conv5"):
      x = g.node("MaxPool", [x], name + "/pool", kernel_shape=[3, 3], strides=[2, 2])
  side = feature_side(predictor.config.image_size)
  if side != POOL:
    m = pool_bins(POOL, side)
    x = g.node("MatMul", [x, g.constant("avgpool/W", m.T)], "avgpool/w")        # (N, C, side, 6)
    x = g.node("MatMul", [g.constant("avgpool/H", m), x], "avgpool/h")          # (N, C, 6, 6)
  x = g.node("Flatten", [x], "flatten", axis=1)
  fc1 = params["fc1"]["kernel"]
  fc1 = np.asarray(fc1).reshape(POOL, POOL, -1, fc1.shape[1]).transpose(2, 0, 1, 3).reshape(fc1.shape)
  x = g.node("Relu", [g.gemm(x, "fc1", {"kernel": fc1, "bias": params["fc1"]["bias"]})], "fc1/relu")
  x = g.node("Relu", [g.gemm(x, "fc2", params["fc2"])], "fc2/relu")
  g.gemm(x, "head", params["head"], out="logits")
  return g.model(predictor, [("logits", ["batch", predictor.num_classes])])
