"""A trained model out of jaxnet: the serialized jax function, its int8 version, and ONNX.

The exported function is `logits = f(images)`:
  images  uint8 (batch, H, W, C), the preprocessed images (jaxnet/tools/predictor.py:
          resize, center crop); batch is symbolic, so any batch size runs the same file
  logits  float32 (batch, num_classes)
Normalization and the model in eval mode (BN running statistics, EMA params when the run
kept an EMA) are inside: it is `steps.make_logits_fn`, the function the eval step runs.

- jax (`save`): jax.export's serialization, params baked in as constants, so the file alone
  is the model; no jaxnet, Flax or checkpoint is needed to run it, only jax:
      exported = jax.export.deserialize(bytearray(open(FILE, "rb").read()))
      logits = exported.call(images)
  FILE.json beside it records the input shape and the class names. `platforms` lists the
  backends to lower for (default: the one exporting).
- jax int8 (`qwix_quantize`): qwix post-training quantization; every convolution and dense
  layer computes in int8: weights quantized once, one scale per output channel; activations
  on the fly, one scale per image from its own range (dynamic: no calibration set).
- ONNX (`save_onnx`), for onnxruntime, TensorRT, OpenVINO or Triton: the same function in
  fp32 whatever precision the run trained in, input "images", output "logits"; the model's
  metadata_props record how to make the input (image size, channels, mean/std, the eval
  crop and interpolation) and the class names (METADATA_KEYS). ResNets and ViTs are
  written op by op in the form runtimes run fastest (`resnet_onnx`, `vit_onnx`: NCHW, BN
  folded, MatMul, LayerNormalization, fusable GELU); other models (AlexNet) go through
  jax2onnx (docs/deploy.md says why it is installed with --no-deps), handed the model as a
  jaxpr of lax primitives, whose output is then adjusted: NHWC max pools onnxruntime can
  run (_repair_max_pools), ReLU in the form onnxruntime fuses into convolutions
  (_relus_as_relu), no scalar Gemm biases, which onnxruntime's quantizer rejects
  (_drop_zero_scalar_gemm_biases).
- ONNX int8 (`save_onnx_int8`): onnxruntime's quantize_static in the QDQ format: int8
  weights with one scale per output channel, uint8 activations (onnxruntime's recommended
  pair on x86 CPUs) whose ranges come from running the fp32 model on N images of the
  workdir's train split (or a folder of the user's images), preprocessed as eval
  preprocesses (no augmentation); LayerNorms stay fp32. onnxruntime's pre-processing
  (shape inference, constant folding) runs first.
Every file is written under a temporary name beside its target and renamed when complete.
"""

import importlib
import json
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from jaxnet.core import steps
from jaxnet.core.errors import UserError
from jaxnet.core.metrics import write_atomically, write_file_atomically
from jaxnet.core.state import get_policy

# The optional packages: the onnx extra holds qwix too. jax2onnx is installed apart because
# it pins orbax-checkpoint<0.11.37, which jaxnet's orbax-checkpoint>=0.12.8 rules out; it
# never imports orbax.
INSTALL = "pip install -e '.[onnx]'"
ONNX_INSTALL = "pip install -e '.[onnx]' && pip install --no-deps 'jax2onnx==0.17.1'"


def export(predictor, platforms=None) -> "jax.export.Exported":
  """The Predictor's eval-mode function with its variables baked in, batch-polymorphic."""
  variables = predictor.variables
  logits_fn = predictor.logits_fn

  def infer(images):
    return logits_fn(variables, images)

  batch = jax.export.symbolic_shape("b")[0]
  spec = jax.ShapeDtypeStruct((batch, *predictor.image_shape), jnp.uint8)
  return jax.export.export(jax.jit(infer), platforms=platforms)(spec)


def save(predictor, path: str, platforms=None, quantization: str | None = None) -> None:
  """Writes the serialized function to `path` and its description to `path`.json, each whole
  or not at all (a failure leaves both as they were)."""
  exported = export(predictor, platforms)
  data = exported.serialize()
  metadata = {"image_shape": list(predictor.image_shape), "dtype": "uint8",
              "class_names": predictor.class_names, "platforms": list(exported.platforms),
              "workdir": _run_name(predictor), "step": predictor.step}
  if quantization:
    metadata["quantization"] = quantization

  def write_bytes(tmp):
    with open(tmp, "wb") as f:
      f.write(data)
  write_file_atomically(path, write_bytes)
  write_atomically(path + ".json", json.dumps(metadata, indent=2))


def _run_name(predictor) -> str:
  """The workdir's name, not its path: an exported file names no folder of this machine."""
  return os.path.basename(os.path.normpath(str(predictor.workdir)))


class ExportedModel:
  """A loaded export: call it on a uint8 (batch, H, W, C) array to get float32 logits."""

  def __init__(self, exported, metadata: dict | None = None):
    self.exported = exported
    self.metadata = metadata or {}
    self.class_names = self.metadata.get("class_names")
    self.image_shape = tuple(exported.in_avals[0].shape[1:])

  def __call__(self, images) -> jax.Array:
    images = np.asarray(images)
    if images.dtype != np.uint8:  # a cast would silently wrap or truncate pixel values
      raise TypeError(f"images must be uint8 (batch, {', '.join(map(str, self.image_shape))}), "
                      f"got {images.dtype}")
    return self.exported.call(images)


def load(path: str) -> ExportedModel:
  with open(path, "rb") as f:
    exported = jax.export.deserialize(bytearray(f.read()))
  try:
    with open(path + ".json") as f:
      metadata = json.load(f)
  except FileNotFoundError:  # the metadata is a convenience; the function stands alone
    metadata = None
  return ExportedModel(exported, metadata)


# --- int8 served by jax: qwix ------------------------------------------------------------

QWIX_DESCRIPTION = ("int8 (qwix PTQ): weights one scale per output channel, activations one scale "
               "per image, dynamic")


def qwix_quantize(predictor):
  """The predictor with int8 weights and activations in every conv and dense layer."""
  try:
    import qwix
  except ImportError:
    raise UserError(f"--format=jax --int8 needs the package qwix, which is not installed: "
                           f"{INSTALL}") from None
  from jaxnet.tools.predictor import Predictor
  rule = qwix.QtRule(module_path=".*", weight_qtype="int8", act_qtype="int8")
  model = qwix.quantize_model(predictor.model, qwix.PtqProvider([rule]))
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                             jnp.zeros((1, *predictor.image_shape)), train=False))
  variables = dict(predictor.variables)
  variables["params"] = qwix.quantize_params(predictor.variables["params"], shapes["params"])
  return Predictor(predictor.config, model, variables, num_classes=predictor.num_classes,
                   class_names=predictor.class_names, step=predictor.step, workdir=predictor.workdir)


# --- ONNX ------------------------------------------------------------------------------

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
      "jaxnet.workdir": _run_name(predictor),
  }
  if getattr(predictor.model, "TASK", None) == "detection":
    props["jaxnet.input"] = ("images: uint8 NHWC (batch, image_size, image_size, channels), each image "
                             "resized (bilinear, aspect kept) so its longer side is image_size, at the "
                             "top left, zero padding after, as jaxnet/core/data/coco.py's eval "
                             "transform; normalization is inside")
    props["jaxnet.eval_crop_fraction"] = props["jaxnet.eval_interpolation"] = "not used"
    props["jaxnet.outputs"] = (
        "class_logits (batch, anchors, classes): sigmoid logits; box_deltas (batch, anchors, 4): "
        "dx, dy, dw, dh against anchors (x0, y0, x1, y1 in the input's pixels) as torchvision's "
        "BoxCoder with weights (1, 1, 1, 1), dw and dh clamped at log(1000/16) before exp; anchors "
        "(anchors, 4). jaxnet's detections (jaxnet/core/detection.py detect): per pyramid level the "
        f"best {c.detection.candidates_per_level} (anchor, class) sigmoid scores above 0.05, their boxes "
        f"decoded and clipped to the image, NMS per class at IoU 0.5, at most "
        f"{c.detection.max_detections} detections")
  return props


def to_onnx(predictor):
  """The predictor's eval-mode fp32 function as an onnx.ModelProto with a dynamic batch:
  ResNets', ViTs' and RetinaNets' graphs written directly, any other model through jax2onnx."""
  from jaxnet.core.models.resnet import ResNet
  from jaxnet.core.models.retinanet import RetinaNet
  from jaxnet.core.models.vit import ViT
  writer = {ResNet: resnet_onnx, ViT: vit_onnx, RetinaNet: retinanet_onnx}.get(type(predictor.model), _jax2onnx)
  (onnx,) = require("onnx")
  model = writer(predictor)
  onnx.helper.set_model_props(model, metadata(predictor))
  onnx.checker.check_model(model)
  return model


def _jax2onnx(predictor):
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


# --- graphs written as a runtime wants them: ResNets and ViTs ------------------------------

class _Graph:
  """An ONNX graph being written: nodes in order, weights as fp32 initializers."""

  def __init__(self, config):
    from onnx import helper, numpy_helper
    self.helper, self.numpy_helper = helper, numpy_helper
    self.nodes, self.weights, self.names = [], [], set()
    self.normalization = _normalization(config)

  def constant(self, name, value, dtype=np.float32):
    """An initializer, written once however many nodes use it (a detector's shared heads)."""
    if name not in self.names:
      self.names.add(name)
      self.weights.append(self.numpy_helper.from_array(np.asarray(value, dtype), name))
    return name

  def node(self, op, inputs, name, **attrs):
    self.nodes.append(self.helper.make_node(op, list(inputs), [name], name=name, **attrs))
    return name

  def conv(self, x, name, kernel, bias, stride=1, pads=None, weights=None):
    """A square convolution of the HWIO `kernel` (written OIHW), padded k // 2 per side unless
    `pads` says otherwise; its weights named after `weights` (default: `name`)."""
    k, weights = kernel.shape[0], weights or name
    return self.node("Conv", [x, self.constant(weights + "/W", np.asarray(kernel, np.float32).transpose(3, 2, 0, 1)),
                              self.constant(weights + "/B", bias)],
                     name, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4 if pads is None else pads)

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


def _nchw_input(g: _Graph) -> str:
  """The uint8 NHWC images as float NCHW: one Transpose (of bytes, 4x fewer than floats), one Cast."""
  from onnx import TensorProto
  return g.node("Cast", [g.node("Transpose", ["images"], "images_nchw", perm=[0, 3, 1, 2])],
                "images_float", to=TensorProto.FLOAT)


def _normalization(config):
  """normalize(x) = x * scale + shift per channel, on uint8 pixel values (steps.normalize)."""
  mean, std = np.asarray(config.data.mean, np.float32), np.asarray(config.data.std, np.float32)
  return 1 / (255 * std), -mean / std


def _resnet_layers(g: _Graph, model, params, stats, prefix: str = "") -> list[str]:
  """A ResNet (its stem and stages, parameters under `params`) on the images: each stage's
  output. The uint8 NHWC input transposed once and cast; each BN folded into its
  convolution's weights and bias (eval mode: running statistics); the normalisation one Add
  per channel with its scale folded into the stem convolution (the shift cannot fold: the
  stem pads with zeros of normalised pixels)."""
  def conv_bn(x, path, bn_path, stride=1, input_scale=1.0):
    """conv (HWIO kernel, padded k // 2 per side) then BN folded in: W * s, b - mean * s;
    `input_scale` (per input channel) multiplies the input first, folded into W."""
    kernel = np.asarray(_at(params, path)["kernel"], np.float32)
    kernel = kernel * np.broadcast_to(np.asarray(input_scale, np.float32), kernel.shape[2:3])[:, None]
    bn, running = _at(params, bn_path), _at(stats, bn_path)
    s = np.asarray(bn["scale"]) / np.sqrt(np.asarray(running["var"]) + model.bn_epsilon)
    return g.conv(x, prefix + "/".join(path), kernel * s,
                  np.asarray(bn["bias"]) - np.asarray(running["mean"]) * s, stride)

  scale, shift = g.normalization
  channels = len(scale)
  x = g.node("Add", [_nchw_input(g), g.constant("normalize/shift", (shift / scale).reshape(1, channels, 1, 1))],
             "normalize/add")
  x = g.node("Relu", [conv_bn(x, ("stem_conv",), ("stem_bn",), stride=2 if model.stem == "imagenet" else 1,
                              input_scale=scale)], prefix + "stem_relu")
  if model.stem == "imagenet":
    x = g.node("MaxPool", [x], prefix + "stem_pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
  bottleneck = "Conv_2" in params["stage1_block1"]  # BottleneckBlock: three convolutions
  stages = []
  for stage, blocks in enumerate(model.stage_sizes):
    for b in range(blocks):
      block = f"stage{stage + 1}_block{b + 1}"
      stride = 2 if stage > 0 and b == 0 else 1
      convs = 3 if bottleneck else 2
      y = x
      for i in range(convs):  # v1.5: the stride on the 3x3 (a bottleneck's second) convolution
        conv_stride = stride if i == (1 if bottleneck else 0) else 1
        y = conv_bn(y, (block, f"Conv_{i}"), (block, f"BatchNorm_{i}"), conv_stride)
        if i < convs - 1:
          y = g.node("Relu", [y], f"{prefix}{block}/relu_{i}")
      shortcut = (conv_bn(x, (block, "proj_conv"), (block, "proj_bn"), stride) if "proj_conv" in params[block]
                  else x)
      x = g.node("Relu", [g.node("Add", [y, shortcut], f"{prefix}{block}/add")], f"{prefix}{block}/out")
    stages.append(x)
  return stages


def resnet_onnx(predictor):
  """A jaxnet ResNet as ONNX in the form runtimes run fastest (and torch.onnx.export writes):
  NCHW throughout (`_resnet_layers`), Conv/Relu/Add/MaxPool, then GlobalAveragePool,
  Flatten, Gemm. The same computation as the eval step's, in another order of rounding
  (logits within 1e-4: tests/test_onnx_export.py)."""
  params = jax.device_get(predictor.variables["params"])
  g = _Graph(predictor.config)
  x = _resnet_layers(g, predictor.model, params, jax.device_get(predictor.variables["batch_stats"]))[-1]
  x = g.node("Flatten", [g.node("GlobalAveragePool", [x], "pool")], "flatten", axis=1)
  g.gemm(x, "head", params["head"], out="logits")
  return g.model(predictor, [("logits", ["batch", predictor.num_classes])])


def retinanet_onnx(predictor):
  """A jaxnet RetinaNet's raw outputs as ONNX: the ResNet (`_resnet_layers`), the pyramid
  (1x1 lateral and 3x3 output convolutions, nearest upsampling as ONNX's Resize with
  torch's floor(i * h / H) source index, P6 and P7) and the two heads shared by the levels;
  outputs `class_logits` (batch, anchors, classes) and `box_deltas` (batch, anchors, 4) in
  the anchors' order (level, row, column, anchor), and `anchors` (anchors, 4), x0 y0 x1 y1 in
  the input's pixels, to decode the deltas with (docs/detection.md). Decoding and NMS stay
  outside the graph."""
  from jaxnet.core import detection
  model, config = predictor.model, predictor.config
  params = jax.device_get(predictor.variables["params"])
  g = _Graph(config)
  c3, c4, c5 = _resnet_layers(g, model, params["backbone"], jax.device_get(predictor.variables["batch_stats"])["backbone"],
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
    (h, w), (big_h, big_w) = levels[i + 1], levels[i]
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
  anchor_boxes = detection.anchors(size, levels, model.anchor_base)
  g.node("Identity", [g.constant("anchor_boxes", anchor_boxes)], "anchors")
  return g.model(predictor, [("class_logits", ["batch", len(anchor_boxes), model.num_classes]),
                             ("box_deltas", ["batch", len(anchor_boxes), 4]),
                             ("anchors", [len(anchor_boxes), 4])])


def vit_onnx(predictor):
  """A jaxnet ViT as ONNX in the ops runtimes fuse: the normalisation folded into the patch
  convolution (unpadded, so exactly), MatMul+Add for every dense layer, LayerNormalization
  (opset 17), attention as MatMul/Softmax/MatMul with 1/sqrt(head_dim) folded into the
  query weights, and GELU in the erf form onnxruntime fuses into one Gelu kernel. Dense
  layers stay MatMuls, which onnxruntime's static quantizer turns into int8 MatMuls."""
  from jaxnet.core.models.vit import LN_EPS, posemb_sincos_2d
  model, config = predictor.model, predictor.config
  params = jax.device_get(predictor.variables["params"])
  width, heads = model.width, model.num_heads
  head_dim = width // heads
  g = _Graph(config)

  def dense(x, path, layer=None):
    layer, name = layer or _at(params, path), "/".join(path)
    y = g.node("MatMul", [x, g.constant(name + "/W", layer["kernel"])], name + "/matmul")
    return g.node("Add", [y, g.constant(name + "/B", layer["bias"])], name)

  def layer_norm(x, path):
    layer, name = _at(params, path), "/".join(path)
    return g.node("LayerNormalization", [x, g.constant(name + "/scale", layer["scale"]),
                                         g.constant(name + "/bias", layer["bias"])],
                  name, axis=-1, epsilon=LN_EPS)

  shape = lambda name, dims: g.constant(name, dims, np.int64)
  scale, shift = g.normalization
  embed = params["patch_embed"]
  kernel = np.asarray(embed["kernel"], np.float32)  # (p, p, C, D)
  bias = np.asarray(embed["bias"], np.float32) + np.einsum("ijcd,c->d", kernel, shift)
  p = kernel.shape[0]
  x = g.conv(_nchw_input(g), "patch_embed", kernel * scale[:, None], bias, stride=p, pads=[0] * 4)
  x = g.node("Reshape", [x, shape("shape/b_d_n", [0, width, -1])], "patches")
  x = g.node("Transpose", [x], "tokens", perm=[0, 2, 1])  # (batch, patches, width)
  if model.flavour == "timm":
    batch = g.node("Shape", [x], "batch_size", start=0, end=1)
    cls_shape = g.node("Concat", [batch, shape("shape/1_d", [1, width])], "cls_shape", axis=0)
    cls = g.node("Expand", [g.constant("cls_token", params["cls_token"]), cls_shape], "cls_tokens")
    x = g.node("Concat", [cls, x], "with_cls", axis=1)
    position = params["pos_embed"]
  else:
    side = config.image_size // p
    position = posemb_sincos_2d(side, side, width)
  x = g.node("Add", [x, g.constant("pos_embed", position)], "embedded")

  # q's columns scaled by 1/sqrt(head_dim): the attention's scaling, done on the weights.
  for i in range(model.depth):
    block = f"block{i}"
    qkv = params[block]["attn"]["qkv"]
    q_scale = np.concatenate([np.full(width, head_dim ** -0.5), np.ones(2 * width)]).astype(np.float32)
    y = dense(layer_norm(x, (block, "norm1")), (block, "attn", "qkv"),
              {"kernel": np.asarray(qkv["kernel"]) * q_scale, "bias": np.asarray(qkv["bias"]) * q_scale})
    y = g.node("Reshape", [y, shape(f"{block}/shape_qkv", [0, 0, 3, heads, head_dim])], f"{block}/attn/split_heads")
    y = g.node("Transpose", [y], f"{block}/attn/qkv_heads", perm=[2, 0, 3, 1, 4])  # (3, b, heads, n, dh)
    q, k, v = (g.node("Gather", [y, shape(f"{block}/index_{part}", part)], f"{block}/attn/{name}", axis=0)
               for part, name in enumerate("qkv"))
    k = g.node("Transpose", [k], f"{block}/attn/k_transposed", perm=[0, 1, 3, 2])
    weights = g.node("Softmax", [g.node("MatMul", [q, k], f"{block}/attn/scores")], f"{block}/attn/weights", axis=-1)
    y = g.node("MatMul", [weights, v], f"{block}/attn/mixed")
    y = g.node("Transpose", [y], f"{block}/attn/merge_heads", perm=[0, 2, 1, 3])
    y = g.node("Reshape", [y, shape(f"{block}/shape_merged", [0, 0, width])], f"{block}/attn/merged")
    x = g.node("Add", [x, dense(y, (block, "attn", "proj"))], f"{block}/attn_out")
    y = dense(layer_norm(x, (block, "norm2")), (block, "fc1"))
    # exact GELU, x * 0.5 * (1 + erf(x / sqrt(2))), in the order onnxruntime's fusion matches
    erf = g.node("Erf", [g.node("Div", [y, g.constant(f"{block}/sqrt2", np.sqrt(2.0))], f"{block}/gelu/div")],
                 f"{block}/gelu/erf")
    one_plus = g.node("Add", [erf, g.constant(f"{block}/one", 1.0)], f"{block}/gelu/add")
    y = g.node("Mul", [g.node("Mul", [y, one_plus], f"{block}/gelu/mul"), g.constant(f"{block}/half", 0.5)],
               f"{block}/gelu")
    x = g.node("Add", [x, dense(y, (block, "fc2"))], f"{block}/out")
  x = layer_norm(x, ("norm",))
  if model.flavour == "timm":
    x = g.node("Gather", [x, shape("index_cls", 0)], "cls_out", axis=1)
  else:
    x = g.node("ReduceMean", [x, shape("axes_tokens", [1])], "pooled", keepdims=0)
    x = g.node("Tanh", [g.gemm(x, "pre_logits", params["pre_logits"], out="pre_logits/gemm")], "pre_logits")
  g.gemm(x, "head", params["head"], out="logits")
  return g.model(predictor, [("logits", ["batch", predictor.num_classes])])


def _at(tree, path):
  for key in path:
    tree = tree[key]
  return tree


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


def save_onnx(predictor, path: str) -> None:
  """Writes the fp32 ONNX model to path (a temporary file renamed at the end)."""
  (onnx,) = require("onnx", "jax2onnx")[:1]
  model = to_onnx(predictor)
  write_file_atomically(path, lambda tmp: onnx.save_model(model, tmp))


# --- ONNX int8: static quantization ----------------------------------------------------

DEFAULT_CALIBRATION_IMAGES = 256  # onnxruntime's examples use a few hundred


class _Subset:
  """Records `indices` of a source, with the source's attributes eval_batches reads."""

  def __init__(self, source, indices):
    self.source, self.indices = source, list(indices)
    self.encoded = source.encoded

  def __len__(self):
    return len(self.indices)

  def __getitem__(self, i):
    return self.source[self.indices[i]]


def calibration_images(predictor, num_images: int, seed: int = 0) -> np.ndarray:
  """num_images uint8 images of the train split, preprocessed as eval does: drawn in a fixed
  random order (seed), unreadable files passed over (and named, in one line) until there are
  enough. A UserError with the number that would work when the split has too few."""
  from jaxnet.core.data import pipeline, sources
  config = predictor.config
  if num_images < 1:
    raise UserError(f"--calibration-images={num_images}: give at least 1")
  if config.data.source == "synthetic":
    # Random pixels would set the int8 ranges, silently: imported weights get this source when
    # there is no dataset (python -m jaxnet.cli.weights import --config.data.source=synthetic).
    raise UserError(f"--calibration-images={num_images} calibrates on train images, and the workdir "
                    f"{predictor.workdir} has data.source=synthetic (random pixels): pass "
                    f"--calibration-images=DIR, a folder of images like those the model will see")
  source = sources.make_source(config.data, "train", config.image_size)
  if len(source) < num_images:
    raise UserError(f"--calibration-images={num_images}, but the train split of "
                    f"{predictor.workdir} has only {len(source)} images; pass "
                    f"--calibration-images={len(source)} or fewer")
  order = np.random.default_rng(seed).permutation(len(source))
  images, unreadable, chunk = [], [], 64
  for start in range(0, len(order), chunk):
    indices = order[start:start + chunk]
    taken = 0
    for batch in pipeline.eval_batches(_Subset(source, indices), global_batch_size=chunk,
                                       image_size=config.image_size, warn_corrupt=False,
                                       crop_fraction=config.data.eval_crop_fraction,
                                       interpolation=config.data.eval_interpolation):
      n = min(len(indices) - taken, len(batch["mask"]))  # the rest of the batch is padding
      images += list(batch["image"][:n][batch["mask"][:n]])
      unreadable += [getattr(source, "path", str)(int(i)) for i, ok in
                     zip(indices[taken:taken + n], batch["mask"][:n]) if not ok]
      taken += n
    if len(images) >= num_images:
      break
  if unreadable:
    shown = ", ".join(unreadable[:5]) + (f" and {len(unreadable) - 5} more" if len(unreadable) > 5 else "")
    print(f"note: calibration passed over {len(unreadable)} unreadable train file(s): {shown}", flush=True)
  if len(images) < num_images:
    fix = (f"pass --calibration-images={len(images)} or fewer" if images else
           "fix or remove the unreadable files")
    raise UserError(f"--calibration-images={num_images}, but only {len(images)} of the "
                    f"{len(source)} train images of {predictor.workdir} are readable: {fix}")
  return np.stack(images[:num_images])


class _Reader:
  """quantize_static's CalibrationDataReader protocol over a uint8 array, in batches."""

  # Small batches: the calibrator's session returns every activation of a batch, and its peak
  # memory follows the batch (ResNet-50 at 224px, 256 images: 2.6 GiB at 8, 7.6 GiB at 32).
  def __init__(self, images: np.ndarray, batch_size: int = 8):
    self.batches = iter([images[i:i + batch_size] for i in range(0, len(images), batch_size)])

  def get_next(self):
    batch = next(self.batches, None)
    return None if batch is None else {"images": batch}


def quantize_onnx(model, images: np.ndarray, of: str = "train images", symbolic_shapes: bool = True):
  """An fp32 onnx.ModelProto -> its int8 QDQ version, calibrated on `images`.
  `symbolic_shapes=False` skips the pre-processing's symbolic shape inference, for graphs it
  fails on (torch.onnx.export's ViT: experiments/bench_inference.py)."""
  onnx, quantization, shape_inference = require(
      "onnx", "onnxruntime.quantization", "onnxruntime.quantization.shape_inference")
  with tempfile.TemporaryDirectory() as tmp:
    fp32, prepared, int8 = (os.path.join(tmp, n) for n in ("fp32.onnx", "prepared.onnx", "int8.onnx"))
    onnx.save_model(model, fp32)
    shape_inference.quant_pre_process(fp32, prepared, skip_symbolic_shape=not symbolic_shapes)
    quantization.quantize_static(
        prepared, int8, _Reader(images),
        quant_format=quantization.QuantFormat.QDQ, per_channel=True,
        activation_type=quantization.QuantType.QUInt8, weight_type=quantization.QuantType.QInt8,
        calibrate_method=quantization.CalibrationMethod.MinMax,
        nodes_to_exclude=fp32_nodes(model))
    quantized = onnx.load_model(int8)
  del quantized.metadata_props[:]
  props = {p.key: p.value for p in model.metadata_props}
  props["jaxnet.quantization"] = (f"int8 QDQ (onnxruntime quantize_static), per-channel weights, "
                                  f"MinMax calibration on {len(images)} {of}")
  onnx.helper.set_model_props(quantized, props)
  return quantized


def fp32_nodes(model) -> list[str]:
  """The nodes an int8 model keeps in fp32: the input's cast and normalisation (everything
  before the first Conv, MatMul or Gemm: quantized, they would cost a requantization of the
  whole image and its precision) and LayerNorms (their statistics lose too much in 8 bits,
  and the quantizer has no per-channel axis for their 1-D scale)."""
  names, first_layer_seen = [], False
  for node in model.graph.node:  # in topological order
    first_layer_seen = first_layer_seen or node.op_type in ("Conv", "MatMul", "Gemm")
    if not first_layer_seen or node.op_type == "LayerNormalization":
      names.append(node.name)
  return names


def calibration_folder(predictor, folder: str) -> np.ndarray:
  """Every image file under `folder` (any layout: the deployment's own photos), preprocessed
  as eval does; unreadable files passed over and named in one line."""
  from jaxnet.core.data.imagefolder import EXTENSIONS_TEXT, is_image_name
  from jaxnet.tools.predictor import ImageReadError
  if not os.path.isdir(folder):
    raise UserError(f"--calibration-images={folder}: no such folder (give a folder of images, or a count "
                    f"of train images)")
  files = sorted(os.path.join(root, name) for root, dirs, names in os.walk(folder)
                 for name in names if is_image_name(name))
  images, unreadable = [], []
  for path in files:
    try:
      images.append(predictor.preprocess([path])[0])
    except ImageReadError:
      unreadable.append(os.path.relpath(path, folder))
  if unreadable:
    shown = ", ".join(unreadable[:5]) + (f" and {len(unreadable) - 5} more" if len(unreadable) > 5 else "")
    print(f"note: calibration passed over {len(unreadable)} unreadable file(s) of {folder}: {shown}", flush=True)
  if not images:
    raise UserError(f"--calibration-images={folder} holds no readable {EXTENSIONS_TEXT} image")
  return np.stack(images)


def save_onnx_int8(predictor, path: str, calibration=DEFAULT_CALIBRATION_IMAGES) -> None:
  """Exports, quantizes and writes the int8 model to path (nothing at path on failure).
  `calibration`: a number of train images, or a folder of images."""
  (onnx,) = require("onnx", "jax2onnx", "onnxruntime.quantization")[:1]
  from_folder = isinstance(calibration, str)
  images = (calibration_folder(predictor, calibration) if from_folder
            else calibration_images(predictor, calibration))  # fails early, before the export
  of = f"images of {os.path.basename(os.path.normpath(calibration))}" if from_folder else "train images"
  quantized = quantize_onnx(to_onnx(predictor), images, of)
  write_file_atomically(path, lambda tmp: onnx.save_model(quantized, tmp))
