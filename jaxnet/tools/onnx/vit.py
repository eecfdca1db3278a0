"""ViTs as ONNX graphs written op by op: MatMul, LayerNormalization, a GELU runtimes fuse,
the normalisation folded into the patch convolution."""

import jax
import numpy as np

from jaxnet.core.models.vit import ViT
from jaxnet.tools.onnx.graph import Graph, at, nchw_input

MODEL = ViT


def write(predictor):
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
  g = Graph(config)

  def dense(x, path, layer=None):
    layer, name = layer or at(params, path), "/".join(path)
    y = g.node("MatMul", [x, g.constant(name + "/W", layer["kernel"])], name + "/matmul")
    return g.node("Add", [y, g.constant(name + "/B", layer["bias"])], name)

  def layer_norm(x, path):
    layer, name = at(params, path), "/".join(path)
    return g.node("LayerNormalization", [x, g.constant(name + "/scale", layer["scale"]),
                                         g.constant(name + "/bias", layer["bias"])],
                  name, axis=-1, epsilon=LN_EPS)

  shape = lambda name, dims: g.constant(name, dims, np.int64)
  scale, shift = g.normalization
  embed = params["patch_embed"]
  kernel = np.asarray(embed["kernel"], np.float32)  # (p, p, C, D)
  bias = np.asarray(embed["bias"], np.float32) + np.einsum("ijcd,c->d", kernel, shift)
  p = kernel.shape[0]
  x = g.conv(nchw_input(g), "patch_embed", kernel * scale[:, None], bias, stride=p, pads=[0] * 4)
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
