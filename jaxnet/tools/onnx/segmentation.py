"""FCN and DeepLabV3 as ONNX graphs written op by op: the dilated backbone as resnet.py writes
it, the head with each BN folded into its convolution, the class logits upsampled by Resize."""

import jax
import numpy as np

from jaxnet.core.models.segmentation import Segmenter, backbone
from jaxnet.tools.onnx.graph import Graph
from jaxnet.tools.onnx.resnet import resnet_layers

MODEL = Segmenter
OUTPUTS = "output logits (batch, image_size, image_size, classes), one row of class logits per pixel"


def notes(predictor) -> dict:
  """A segmenter graph's input (the segmentation task's eval transform) and output."""
  return {
      "jaxnet.input": ("images: uint8 NHWC (batch, image_size, image_size, channels), each image resized "
                       "(bilinear, aspect kept) so its longer side is image_size, at the top left, zero "
                       "padding after, as jaxnet/core/tasks/segmentation/transforms.py's eval transform; "
                       "normalization is inside"),
      "jaxnet.eval_crop_fraction": "not used", "jaxnet.eval_interpolation": "not used",
      "jaxnet.outputs": ("logits (batch, image_size, image_size, classes): float32 class logits per pixel, "
                         "NHWC as jaxnet's model returns them, from the main head only (an auxiliary head "
                         "is not exported); their argmax over the last axis is the predicted mask (the "
                         "padding's pixels included: crop them off)")}


def write(predictor):
  """A jaxnet FCN or DeepLabV3 in eval mode as ONNX: the ResNet with its last two stages dilated
  (`resnet_layers`), the head (FCN: conv, ReLU; DeepLabV3: the ASPP's four convolutions and its
  image-mean branch, Expand-ed back over the map, concatenated and projected, then conv, ReLU),
  the 1x1 class convolution, and Resize (linear, half_pixel: torch's bilinear with
  align_corners=False) to the input's size, transposed to NHWC. Dropout is the identity and
  the auxiliary head is left out: eval and predict read only the main head's logits, and
  torchvision's second output would cost 6.5% of the compute for a tensor no caller reads
  (docs/deploy.md). Logits within 1e-5 of the model's (tests/test_onnx_export.py)."""
  model, config = predictor.model, predictor.config
  params = jax.device_get(predictor.variables["params"])
  stats = jax.device_get(predictor.variables["batch_stats"])
  g = Graph(config)
  x = resnet_layers(g, backbone(model), params["backbone"], stats["backbone"], prefix="backbone/")[-1]

  def conv_bn_relu(x, head, name, dilation=1):
    """`head`'s convolution `name`_conv (or conv) with its BN folded in, then ReLU."""
    conv, bn = (f"{name}_conv", f"{name}_bn") if name else ("conv", "bn")
    kernel = np.asarray(params[head][conv]["kernel"], np.float32)
    scale, running = params[head][bn], stats[head][bn]
    s = np.asarray(scale["scale"]) / np.sqrt(np.asarray(running["var"]) + model.bn_epsilon)
    y = g.conv(x, f"{head}/{conv}", kernel * s, np.asarray(scale["bias"]) - np.asarray(running["mean"]) * s,
               dilation=dilation)
    return g.node("Relu", [y], f"{head}/{conv}/relu")

  if "fcn_head" in params:
    x = conv_bn_relu(x, "fcn_head", "")
  else:
    head = "deeplab_head"
    branches = [conv_bn_relu(x, head, "aspp0")]
    branches += [conv_bn_relu(x, head, f"aspp{i + 1}", rate) for i, rate in enumerate(model.atrous_rates)]
    pooled = conv_bn_relu(g.node("GlobalAveragePool", [x], f"{head}/pool"), head, "pool")
    map_size = g.node("Shape", [x], f"{head}/map_size", start=2)  # (h, w) of the map
    shape = g.node("Concat", [g.constant(f"{head}/ones", [1, 1], np.int64), map_size], f"{head}/pool_shape", axis=0)
    branches.append(g.node("Expand", [pooled, shape], f"{head}/pool_expand"))  # bilinear from 1x1
    x = g.node("Concat", branches, f"{head}/concat", axis=1)
    x = conv_bn_relu(conv_bn_relu(x, head, "project"), head, "")
  out = params["class_logits"]["out"]
  x = g.conv(x, "class_logits/out", out["kernel"], out["bias"])
  size = config.image_size
  # All four sizes, (batch, classes) from the map: onnxruntime's layout transformer (it moves
  # an int8 model's convolutions to NHWC) mishandles a Resize with `axes`, refusing the model.
  kept = g.node("Shape", [x], "upsample/batch_classes", start=0, end=2)
  sizes = g.node("Concat", [kept, g.constant("upsample/size", [size, size], np.int64)], "upsample/sizes", axis=0)
  x = g.node("Resize", [x, "", "", sizes], "upsample", mode="linear", coordinate_transformation_mode="half_pixel")
  g.node("Transpose", [x], "logits", perm=[0, 2, 3, 1])
  return g.model(predictor, [("logits", ["batch", size, size, predictor.num_classes])])

