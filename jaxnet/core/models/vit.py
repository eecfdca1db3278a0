"""Vision Transformer (Dosovitskiy et al. 2021) in NHWC, two flavours in one module.

  flavour="timm"   timm/DeiT style: a class token and a learned position
                   embedding (over the class token too); the head reads the
                   class token after the final LayerNorm. Parameter counts equal
                   timm's vit_{tiny,small,base,large}_patch16_224
                   and vit_huge_patch14_224.
  flavour="plain"  big_vision's "plain ViT" baseline (Beyer et al. 2022, the
                   vit_s16_i1k recipe): no class token, a fixed 2-D sin-cos
                   position embedding, global average pooling after the final
                   LayerNorm, then a tanh pre-logits layer of width D.

Both: pre-LayerNorm blocks (eps 1e-6), exact (erf) GELU, the head zero-initialised
(every class starts equally likely). Patches come from a strided convolution
on the NHWC image. Matmuls run in the compute dtype; LayerNorm statistics,
attention softmax, pooling and the head in fp32.

Attention goes through `jax.nn.dot_product_attention`: on a GPU with bf16/fp16
compute it asks for cuDNN's fused (flash) kernel, and falls back to XLA's
implementation where cuDNN refuses the shapes; elsewhere it is XLA's.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxnet.core.errors import InvalidValueError
from jaxnet.core.models import register, target_platform

LN_EPS = 1e-6


def posemb_sincos_2d(h: int, w: int, width: int, temperature: float = 10_000.0) -> np.ndarray:
  """Fixed (1, h*w, width) embedding: sin and cos of the row and column index at
  width/4 frequencies spaced geometrically from 1 to 1/temperature."""
  if width % 4:
    raise InvalidValueError(f"the sin-cos position embedding needs a width divisible by 4, got {width}")
  rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
  freqs = 1.0 / temperature ** (np.arange(width // 4) / max(width // 4 - 1, 1))
  r = rows.reshape(-1, 1) * freqs
  c = cols.reshape(-1, 1) * freqs
  return np.concatenate([np.sin(c), np.cos(c), np.sin(r), np.cos(r)], axis=1)[None].astype(np.float32)


def attention(q, k, v):
  """softmax(q k^T / sqrt(d)) v over (batch, tokens, heads, head_dim); softmax in fp32."""
  if target_platform() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16):
    try:
      return jax.nn.dot_product_attention(q, k, v, implementation="cudnn")
    except (NotImplementedError, RuntimeError, ValueError):
      pass  # cuDNN version or shapes it does not support: XLA's below
  return jax.nn.dot_product_attention(q, k, v, implementation="xla")


def _qkv_init(key, shape, dtype=jnp.float32):
  """Xavier-uniform for each of the q, k and v (D, D) blocks of the fused (D, 3D)
  kernel, as if they were three separate projections (big_vision's init)."""
  d = shape[0]
  init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=0, out_axis=2,
                                          batch_axis=(1,))
  return init(key, (d, 3, shape[1] // 3), dtype).reshape(shape)


class SelfAttention(nn.Module):
  num_heads: int
  dtype: Any

  @nn.compact
  def __call__(self, x):
    batch, tokens, width = x.shape
    head_dim = width // self.num_heads
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=jnp.float32,
                              kernel_init=nn.initializers.xavier_uniform())
    # One fused projection, output laid out (3, heads, head_dim) as timm's qkv.
    qkv = dense(3 * width, kernel_init=_qkv_init, name="qkv")(x)
    qkv = qkv.reshape(batch, tokens, 3, self.num_heads, head_dim)
    out = attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
    return dense(width, name="proj")(out.reshape(batch, tokens, width))


class Block(nn.Module):
  num_heads: int
  mlp_dim: int
  dtype: Any

  @nn.compact
  def __call__(self, x):
    norm = functools.partial(nn.LayerNorm, epsilon=LN_EPS, dtype=self.dtype, param_dtype=jnp.float32)
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=jnp.float32,
                              kernel_init=nn.initializers.xavier_uniform())
    x = x + SelfAttention(self.num_heads, self.dtype, name="attn")(norm(name="norm1")(x))
    y = nn.gelu(dense(self.mlp_dim, name="fc1")(norm(name="norm2")(x)), approximate=False)
    return x + dense(x.shape[-1], name="fc2")(y)


class ViT(nn.Module):
  ATTENTION = True  # models.declared: the GPU plan names how its attention was lowered
  num_classes: int = 1000
  patch_size: int = 16
  width: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  flavour: str = "timm"               # timm | plain
  dtype: Any = jnp.float32            # compute dtype

  @property
  def image_multiple(self) -> int:
    """models.image_multiple: the image is cut into patch_size x patch_size patches."""
    return self.patch_size

  @nn.compact
  def __call__(self, x, train: bool):
    del train  # no dropout or batch norm: train and eval compute the same function
    if self.flavour not in ("timm", "plain"):
      raise InvalidValueError(f"ViT flavour {self.flavour!r}: use 'timm' or 'plain' (config.model.flavour)")
    p = self.patch_size
    if x.shape[1] % p or x.shape[2] % p:
      raise InvalidValueError(f"image {x.shape[1]}x{x.shape[2]} is not a multiple of the patch size {p}")
    x = nn.Conv(self.width, (p, p), strides=(p, p), padding="VALID", dtype=self.dtype,
                param_dtype=jnp.float32, name="patch_embed")(x.astype(self.dtype))
    n, h, w, _ = x.shape
    x = x.reshape(n, h * w, self.width)

    if self.flavour == "timm":
      cls = self.param("cls_token", nn.initializers.zeros, (1, 1, self.width), jnp.float32)
      x = jnp.concatenate([jnp.broadcast_to(cls.astype(self.dtype), (n, 1, self.width)), x], axis=1)
      shape = (1, h * w + 1, self.width)
      if self.has_variable("params", "pos_embed"):
        made = self.get_variable("params", "pos_embed").shape
        if made != shape:
          raise InvalidValueError(
              f"this ViT's learned position embedding is for {made[1] - 1} patches, the "
              f"{x.shape} input has {h * w}: evaluate at the image size it was trained at, or "
              f"train with config.model.flavour=plain (fixed sin-cos embedding, any size)")
      pos = self.param("pos_embed", nn.initializers.normal(0.02), shape, jnp.float32)
    else:
      pos = jnp.asarray(posemb_sincos_2d(h, w, self.width))
    x = x + pos.astype(self.dtype)

    for i in range(self.depth):
      x = Block(self.num_heads, self.mlp_dim, self.dtype, name=f"block{i}")(x)
    x = nn.LayerNorm(epsilon=LN_EPS, dtype=jnp.float32, param_dtype=jnp.float32, name="norm")(x)

    if self.flavour == "timm":
      x = x[:, 0]
    else:
      x = jnp.mean(x, axis=1)
      x = jnp.tanh(nn.Dense(self.width, dtype=jnp.float32, param_dtype=jnp.float32,
                            name="pre_logits")(x))
    return nn.Dense(self.num_classes, dtype=jnp.float32, param_dtype=jnp.float32,
                    kernel_init=nn.initializers.zeros, name="head")(x)


# (width, depth, heads, mlp) of the standard sizes (Touvron et al. 2021 for Ti and S).
SIZES = {"ti": (192, 12, 3, 768), "s": (384, 12, 6, 1536), "b": (768, 12, 12, 3072),
         "l": (1024, 24, 16, 4096)}

for _size, (_width, _depth, _heads, _mlp) in SIZES.items():
  register(f"vit_{_size}16")(functools.partial(
      ViT, patch_size=16, width=_width, depth=_depth, num_heads=_heads, mlp_dim=_mlp))
# ViT-H/14 (Dosovitskiy et al. 2021; timm's vit_huge_patch14_224): 632 M parameters, whose
# fp32 params and Adam moments (7.6 GB) are what FSDP (config.mesh.fsdp) splits over the GPUs.
register("vit_h14")(functools.partial(ViT, patch_size=14, width=1280, depth=32, num_heads=16, mlp_dim=5120))

# Two blocks of width 32 on 4x4 patches (~19k parameters on digits): tests and CPU runs on 16px images.
register("vit_mini")(functools.partial(ViT, patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64))
