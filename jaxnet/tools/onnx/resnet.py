"""ResNets as ONNX graphs written op by op: NCHW, each BN folded into its convolution."""

import jax
import numpy as np

from jaxnet.core.models.resnet import ResNet
from jaxnet.tools.onnx.graph import Graph, at, nchw_input

MODEL = ResNet


def resnet_layers(g: Graph, model, params, stats, prefix: str = "") -> list[str]:
  """A ResNet (its stem and stages, parameters under `params`) on the images: each stage's
  output. The uint8 NHWC input transposed once and cast; each BN folded into its
  convolution's weights and bias (eval mode: running statistics); the normalisation one Add
  per channel with its scale folded into the stem convolution (the shift cannot fold: the
  stem pads with zeros of normalised pixels)."""
  def conv_bn(x, path, bn_path, stride=1, input_scale=1.0, dilation=1):
    """conv (HWIO kernel, padded dilation * (k // 2) per side) then BN folded in: W * s,
    b - mean * s; `input_scale` (per input channel) multiplies the input first, folded into W."""
    kernel = np.asarray(at(params, path)["kernel"], np.float32)
    kernel = kernel * np.broadcast_to(np.asarray(input_scale, np.float32), kernel.shape[2:3])[:, None]
    bn, running = at(params, bn_path), at(stats, bn_path)
    s = np.asarray(bn["scale"]) / np.sqrt(np.asarray(running["var"]) + model.bn_epsilon)
    return g.conv(x, prefix + "/".join(path), kernel * s,
                  np.asarray(bn["bias"]) - np.asarray(running["mean"]) * s, stride, dilation=dilation)

  scale, shift = g.normalization
  channels = len(scale)
  x = g.node("Add", [nchw_input(g), g.constant("normalize/shift", (shift / scale).reshape(1, channels, 1, 1))],
             "normalize/add")
  x = g.node("Relu", [conv_bn(x, ("stem_conv",), ("stem_bn",), stride=2 if model.stem == "imagenet" else 1,
                              input_scale=scale)], prefix + "stem_relu")
  if model.stem == "imagenet":
    x = g.node("MaxPool", [x], prefix + "stem_pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
  bottleneck = "Conv_2" in params["stage1_block1"]  # BottleneckBlock: three convolutions
  # A detector passes itself (its backbone's fields: no dilation); a segmenter its dilated ResNet.
  dilate = tuple(getattr(model, "dilate_stages", ())) or (False,) * (len(model.stage_sizes) - 1)
  stages, dilation = [], 1
  for stage, blocks in enumerate(model.stage_sizes):
    stage_stride, previous = (2 if stage > 0 else 1), dilation
    if stage > 0 and dilate[stage - 1]:  # the stride replaced by dilation, as the model's
      dilation, stage_stride = dilation * stage_stride, 1
    for b in range(blocks):
      block = f"stage{stage + 1}_block{b + 1}"
      stride, block_dilation = (stage_stride, previous) if b == 0 else (1, dilation)
      convs = 3 if bottleneck else 2
      y = x
      for i in range(convs):  # v1.5: the stride on the 3x3 (a bottleneck's second) convolution
        conv_stride = stride if i == (1 if bottleneck else 0) else 1
        three = not bottleneck or i == 1  # the 3x3 convolutions are the dilated ones
        y = conv_bn(y, (block, f"Conv_{i}"), (block, f"BatchNorm_{i}"), conv_stride,
                    dilation=block_dilation if three else 1)
        if i < convs - 1:
          y = g.node("Relu", [y], f"{prefix}{block}/relu_{i}")
      shortcut = (conv_bn(x, (block, "proj_conv"), (block, "proj_bn"), stride) if "proj_conv" in params[block]
                  else x)
      x = g.node("Relu", [g.node("Add", [y, shortcut], f"{prefix}{block}/add")], f"{prefix}{block}/out")
    stages.append(x)
  return stages


def write(predictor):
  """A jaxnet ResNet as ONNX in the form runtimes run fastest (and torch.onnx.export writes):
  NCHW throughout (`resnet_layers`), Conv/Relu/Add/MaxPool, then GlobalAveragePool,
  Flatten, Gemm. The same computation as the eval step's, in another order of rounding
  (logits within 1e-4: tests/test_onnx_export.py)."""
  params = jax.device_get(predictor.variables["params"])
  g = Graph(predictor.config)
  x = resnet_layers(g, predictor.model, params, jax.device_get(predictor.variables["batch_stats"]))[-1]
  x = g.node("Flatten", [g.node("GlobalAveragePool", [x], "pool")], "flatten", axis=1)
  g.gemm(x, "head", params["head"], out="logits")
  return g.model(predictor, [("logits", ["batch", predictor.num_classes])])
