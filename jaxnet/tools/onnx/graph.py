"""The ONNX graph builder the directly written families share (resnet.py, vit.py, retinanet.py,
convnext.py, efficientnet.py)."""

import numpy as np

from jaxnet.tools.onnx import OPSET


class Graph:
  """An ONNX graph being written: nodes in order, weights as fp32 initializers."""

  def __init__(self, config):
    from onnx import helper, numpy_helper
    self.helper, self.numpy_helper = helper, numpy_helper
    self.nodes, self.weights, self.names = [], [], set()
    self.normalization = normalization(config)

  def constant(self, name, value, dtype=np.float32):
    """An initializer, written once however many nodes use it (a detector's shared heads)."""
    if name not in self.names:
      self.names.add(name)
      self.weights.append(self.numpy_helper.from_array(np.asarray(value, dtype), name))
    return name

  def node(self, op, inputs, name, **attrs):
    self.nodes.append(self.helper.make_node(op, list(inputs), [name], name=name, **attrs))
    return name

  def conv(self, x, name, kernel, bias, stride=1, pads=None, weights=None, groups=1, dilation=1):
    """A square convolution of the HWIO `kernel` (written OIHW), padded dilation * (k // 2) per
    side unless `pads` says otherwise; its weights named after `weights` (default: `name`).
    `groups`: as flax's feature_group_count (a depthwise convolution's is its channel count)."""
    k, weights = kernel.shape[0], weights or name
    extra = {"group": groups} if groups > 1 else {}
    if dilation > 1:
      extra["dilations"] = [dilation, dilation]
    return self.node("Conv", [x, self.constant(weights + "/W", np.asarray(kernel, np.float32).transpose(3, 2, 0, 1)),
                              self.constant(weights + "/B", bias)],
                     name, kernel_shape=[k, k], strides=[stride, stride],
                     pads=[dilation * (k // 2)] * 4 if pads is None else pads, **extra)

  def gemm(self, x, name, layer, out=None):
    """A dense layer ({"kernel", "bias"}) on (batch, features), its weights named after `name`,
    its output `out` (default: `name`)."""
    return self.node("Gemm", [x, self.constant(name + "/W", layer["kernel"]), self.constant(name + "/B", layer["bias"])],
                     out or name)

  def model(self, predictor, outputs):
    """The graph as a model: input uint8 "images" (batch, size, size, channels); `outputs`
    [(name, shape)], float32."""
    from onnx import TensorProto
    size, helper, channels = predictor.config.image_size, self.helper, len(self.normalization[0])
    graph = helper.make_graph(
        self.nodes, predictor.config.model.name,
        [helper.make_tensor_value_info("images", TensorProto.UINT8, ["batch", size, size, channels])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs],
        initializer=self.weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="jaxnet")


def nchw_input(g: Graph) -> str:
  """The uint8 NHWC images as float NCHW: one Transpose (of bytes, 4x fewer than floats), one Cast."""
  from onnx import TensorProto
  return g.node("Cast", [g.node("Transpose", ["images"], "images_nchw", perm=[0, 3, 1, 2])],
                "images_float", to=TensorProto.FLOAT)


def normalization(config):
  """normalize(x) = x * scale + shift per channel, on uint8 pixel values (steps.normalize)."""
  mean, std = np.asarray(config.data.mean, np.float32), np.asarray(config.data.std, np.float32)
  return 1 / (255 * std), -mean / std


def at(tree, path):
  for key in path:
    tree = tree[key]
  return tree
