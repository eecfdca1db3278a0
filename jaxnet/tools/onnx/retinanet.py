"""RetinaNets as ONNX graphs written op by op: the backbone as resnet.py writes it, the
pyramid and the shared heads; outputs the raw class logits, box deltas and the anchors."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxnet.core.models.retinanet import RetinaNet
from jaxnet.tools.onnx.graph import Graph
from jaxnet.tools.onnx.resnet import resnet_layers

MODEL = RetinaNet
OUTPUTS = "outputs class_logits, box_deltas and anchors"


def notes(predictor) -> dict:
  """A RetinaNet graph's input and outputs (its writer, `write`, stops before decoding)."""
  c = predictor.config
  return {
      "jaxnet.input": ("images: uint8 NHWC (batch, image_size, image_size, channels), each image "
                       "resized (bilinear, aspect kept) so its longer side is image_size, at the "
                       "top left, zero padding after, as jaxnet/core/tasks/detection/coco.py's eval "
                       "transform; normalization is inside"),
      "jaxnet.eval_crop_fraction": "not used", "jaxnet.eval_interpolation": "not used",
      "jaxnet.outputs": (
          "class_logits (batch, anchors, classes): sigmoid logits; box_deltas (batch, anchors, 4): "
          "dx, dy, dw, dh against anchors (x0, y0, x1, y1 in the input's pixels) as torchvision's "
          "BoxCoder with weights (1, 1, 1, 1), dw and dh clamped at log(1000/16) before exp; anchors "
          "(anchors, 4). jaxnet's detections (jaxnet/core/tasks/detection/__init__.py detect): per pyramid level "
          f"the best {c.detection.candidates_per_level} (anchor, class) sigmoid scores above 0.05, their "
          f"boxes decoded and clipped to the image, NMS per class at IoU 0.5, at most "
          f"{c.detection.max_detections} detections"),
  }


def write(predictor):
  """A jaxnet RetinaNet's raw outputs as ONNX: the ResNet (`resnet_layers`), the pyramid
  (1x1 lateral and 3x3 output convolutions, nearest upsampling as ONNX's Resize with
  torch's floor(i * h / H) source index, P6 and P7) and the two heads shared by the levels;
  outputs `class_logits` (batch, anchors, classes) and `box_deltas` (batch, anchors, 4) in
  the anchors' order (level, row, column, anchor), and `anchors` (anchors, 4), x0 y0 x1 y1 in
  the input's pixels, to decode the deltas with (docs/detection.md). Decoding and NMS stay
  outside the graph."""
  from jaxnet.core.models.retinanet import anchors
  model, config = predictor.model, predictor.config
  params = jax.device_get(predictor.variables["params"])
  g = Graph(config)
  c3, c4, c5 = resnet_layers(g, model, params["backbone"], jax.device_get(predictor.variables["batch_stats"])["backbone"],
                              prefix="backbone/")[1:]

  def conv(x, name, out=None, stride=1, relu=False):
    """Layer `name`'s convolution (the heads' are shared by the levels: one set of weights)."""
    y = g.conv(x, out or name, params[name]["kernel"], params[name]["bias"], stride, weights=name)
    return g.node("Relu", [y], (out or name) + "/relu") if relu else y

  # The levels' sizes, from the model itself: what the anchors and the upsampling need.
  size = config.image_size
  found = []
  jax.eval_shape(lambda: found.append(model.apply(predictor.variables, jnp.zeros((1, size, size, len(g.normalization[0]))),
                                                  train=False)["levels"]))
  levels = found[0]
  inner = conv(c5, "fpn_inner2")
  p5 = conv(inner, "fpn_layer2")
  pyramid = [p5]
  for i, c in ((1, c4), (0, c3)):
    big_h, big_w = levels[i]
    up = g.node("Resize", [inner, "", "", g.constant(f"fpn_up{i}/sizes", [big_h, big_w], np.int64)],
                f"fpn_up{i}", axes=[2, 3], mode="nearest", coordinate_transformation_mode="asymmetric",
                nearest_mode="floor")
    inner = g.node("Add", [conv(c, f"fpn_inner{i}"), up], f"fpn_sum{i}")
    pyramid.insert(0, conv(inner, f"fpn_layer{i}"))
  p6 = conv(p5, "p6", stride=2)
  p7 = conv(g.node("Relu", [p6], "p6/relu"), "p7", stride=2)
  pyramid += [p6, p7]

  outputs = {"class_logits": [], "box_deltas": []}
  for level, p in enumerate(pyramid):
    for head, convs, out, width in (("cls", "cls_conv", "cls_logits", model.num_classes),
                                    ("box", "box_conv", "box_reg", 4)):
      x = p
      for i in range(model.head_convs):
        x = conv(x, f"{convs}{i}", out=f"{head}{level}/conv{i}", relu=True)
      x = g.node("Transpose", [conv(x, out, out=f"{head}{level}/out")], f"{head}{level}/nhwc", perm=[0, 2, 3, 1])
      shape = g.constant(f"{head}/shape", [0, -1, width], np.int64)
      outputs["class_logits" if head == "cls" else "box_deltas"].append(
          g.node("Reshape", [x, shape], f"{head}{level}/anchors"))
  for name, parts in outputs.items():
    g.node("Concat", parts, name, axis=1)
  anchor_boxes = anchors(size, levels, model.anchor_base)
  g.node("Identity", [g.constant("anchor_boxes", anchor_boxes)], "anchors")
  return g.model(predictor, [("class_logits", ["batch", len(anchor_boxes), model.num_classes]),
                             ("box_deltas", ["batch", len(anchor_boxes), 4]),
                             ("anchors", [len(anchor_boxes), 4])])
