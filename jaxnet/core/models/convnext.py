"""ConvNeXt (Liu et al. 2022) in NHWC, the architecture of torchvision's `convnext_*`.

A stem (4x4 stride-4 convolution, then LayerNorm over channels), four stages of
blocks separated by downsampling (LayerNorm, then a 2x2 stride-2 convolution), and
a head (global average pool, LayerNorm, Dense). A block is

    x + drop_path(gamma * fc2(gelu(fc1(norm(dwconv7x7(x))))))

with exact (erf) GELU, fc1 widening 4x, `gamma` a learned per-channel layer scale
(starting at 1e-6, so each block starts near the identity) and drop_path the
stochastic depth, its rate rising linearly from 0 at the first block to
`stochastic_depth` at the last. Every LayerNorm has eps 1e-6. In NHWC a
"channels-last" LayerNorm is flax's nn.LayerNorm as it is, so no layout changes
are needed anywhere. With torchvision's weights (jaxnet/tools/weights/
convnext_names.py) the eval logits are torchvision's (tests/test_convnext_efficientnet.py).

Matmuls and convolutions run in the compute dtype; LayerNorm statistics, the pooling and
the head in fp32. Stochastic depth draws from the `dropout` stream, which the train
step derives from the seed and the step, so a resumed run drops the same blocks.
"""

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from jaxnet.core.errors import InvalidValueError
from jaxnet.core.models import drop_path, register

LN_EPS = 1e-6
# Truncated normal, std 0.02, for every convolution and dense layer (biases zero).
weight_init = nn.initializers.truncated_normal(0.02)


class ConvNeXtBlock(nn.Module):
  drop_rate: float
  layer_scale: float
  dtype: Any

  @nn.compact
  def __call__(self, x, train: bool):
    width = x.shape[-1]
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=jnp.float32, kernel_init=weight_init)
    y = nn.Conv(width, (7, 7), padding=[(3, 3), (3, 3)], feature_group_count=width, dtype=self.dtype,
                param_dtype=jnp.float32, kernel_init=weight_init, name="dwconv")(x)
    y = nn.LayerNorm(epsilon=LN_EPS, dtype=self.dtype, param_dtype=jnp.float32, name="norm")(y)
    y = nn.gelu(dense(4 * width, name="fc1")(y), approximate=False)
    y = dense(width, name="fc2")(y)
    gamma = self.param("layer_scale", nn.initializers.constant(self.layer_scale), (width,), jnp.float32)
    y = y * gamma.astype(self.dtype)
    return x + drop_path(y, self.drop_rate, train)


class ConvNeXt(nn.Module):
  depths: Sequence[int] = (3, 3, 9, 3)            # blocks per stage
  widths: Sequence[int] = (96, 192, 384, 768)     # channels per stage
  num_classes: int = 1000
  stochastic_depth: float = 0.1                   # drop rate of the last block (linear from 0)
  layer_scale: float = 1e-6                       # the layer scales' initial value
  dtype: Any = jnp.float32                        # compute dtype

  @nn.compact
  def __call__(self, x, train: bool):
    if len(self.depths) != len(self.widths):
      raise InvalidValueError(f"ConvNeXt depths {tuple(self.depths)} and widths {tuple(self.widths)} "
                              "need one entry per stage each")
    smallest = 4 * 2 ** (len(self.depths) - 1)  # the stem's and the downsamplings' strides
    if min(x.shape[1:3]) < smallest:  # a stage of no pixels: its mean is NaN
      raise InvalidValueError(f"ConvNeXt of {len(self.depths)} stages needs images of at least {smallest}x{smallest} "
                              f"pixels, got {x.shape[1]}x{x.shape[2]}; raise config.image_size")
    conv = functools.partial(nn.Conv, dtype=self.dtype, param_dtype=jnp.float32, kernel_init=weight_init)
    norm = functools.partial(nn.LayerNorm, epsilon=LN_EPS, dtype=self.dtype, param_dtype=jnp.float32)
    x = conv(self.widths[0], (4, 4), (4, 4), padding="VALID", name="stem_conv")(x.astype(self.dtype))
    x = norm(name="stem_norm")(x)
    total, index = sum(self.depths), 0
    for stage, (depth, width) in enumerate(zip(self.depths, self.widths)):
      if stage > 0:
        x = norm(name=f"downsample{stage + 1}_norm")(x)
        x = conv(width, (2, 2), (2, 2), padding="VALID", name=f"downsample{stage + 1}_conv")(x)
      for b in range(depth):
        rate = self.stochastic_depth * index / max(total - 1, 1)
        x = ConvNeXtBlock(rate, self.layer_scale, self.dtype, name=f"stage{stage + 1}_block{b + 1}")(x, train)
        index += 1
    x = jnp.mean(x, axis=(1, 2), dtype=jnp.float32)
    x = nn.LayerNorm(epsilon=LN_EPS, dtype=jnp.float32, param_dtype=jnp.float32, name="head_norm")(x)
    # The classifier runs in fp32: it is tiny and its logits feed an fp32 loss.
    return nn.Dense(self.num_classes, dtype=jnp.float32, param_dtype=jnp.float32, kernel_init=weight_init,
                    name="head")(x)


# (depths, widths, stochastic depth of torchvision's ImageNet recipe) of the four sizes.
SIZES = {
    "tiny": ((3, 3, 9, 3), (96, 192, 384, 768), 0.1),
    "small": ((3, 3, 27, 3), (96, 192, 384, 768), 0.4),
    "base": ((3, 3, 27, 3), (128, 256, 512, 1024), 0.5),
    "large": ((3, 3, 27, 3), (192, 384, 768, 1536), 0.5),
}

for _size, (_depths, _widths, _drop) in SIZES.items():
  register(f"convnext_{_size}")(functools.partial(ConvNeXt, depths=_depths, widths=_widths,
                                                   stochastic_depth=_drop))

# Two stages of one and two blocks, 16 and 32 channels (26,394 parameters at 10 classes): tests and
# CPU runs on 16-32 px images (the stem's stride 4 and one downsampling: 16 px ends at 2x2).
register("convnext_mini")(functools.partial(ConvNeXt, depths=(1, 2), widths=(16, 32), stochastic_depth=0.1))
