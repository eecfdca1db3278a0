"""EfficientNet B0-B7 (Tan & Le 2019) and EfficientNetV2-S/M/L (Tan & Le 2021) in NHWC, the
architectures of torchvision's `efficientnet_*`.

A stem (3x3 stride-2 convolution, BN, SiLU), stages of inverted-residual blocks, a 1x1
convolution to the head width (BN, SiLU), global average pooling, dropout and a Dense.

  MBConv       [1x1 expand, BN, SiLU] -> kxk depthwise, BN, SiLU -> squeeze-excitation
               -> 1x1 project, BN
  FusedMBConv  (V2's early stages) kxk expand, BN, SiLU -> [1x1 project, BN]
               (without expansion: the kxk convolution alone, BN, SiLU)

Squeeze-excitation gates each channel by sigmoid(fc2(silu(fc1(mean over H, W)))), fc1
narrowing to a quarter of the block's *input* width. A block whose input and output
shapes agree adds its input back, after stochastic depth whose rate rises linearly from 0
at the first block by `stochastic_depth` / (number of blocks) per block. Convolutions pad
(k - 1) // 2 on every side, as torchvision does (not "SAME").

B1-B7 scale B0's widths (rounded to multiples of 8, never down by more than 10%) and
depths (rounded up); V2 lists its stages outright. BN eps is 1e-5 with momentum 0.9 for
B0-B4, but 1e-3 with momentum 0.99 for B5-B7, and 1e-3 with momentum 0.9 for V2
(torchvision's settings, which its weights were trained with).

Convolutions run in the compute dtype; BN statistics, the squeeze-excitation gate (a
mean and a sigmoid over the whole map), the pooling and the head in fp32. Stochastic
depth draws from the `dropout` stream, which the train step derives from the seed and
the step, so a resumed run drops the same blocks.
"""

import dataclasses
import functools
import math
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from jaxnet.core.errors import InvalidValueError
from jaxnet.core.models import drop_path, register
from jaxnet.core.models.batchnorm import BatchNorm

# He-normal fan-out for the convolutions (as torchvision); the classifier uniform in
# +-1/sqrt(classes), biases zero.
conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stage: `blocks` blocks of `kind` ("mb" or "fused"), the first with stride `stride`
  and input `in_width`, all with `expand` times wider inner convolutions of size `kernel`."""
  kind: str
  expand: int
  kernel: int
  stride: int
  in_width: int
  out_width: int
  blocks: int


def round_width(width: float, divisor: int = 8) -> int:
  """`width` to the nearest multiple of `divisor` (at least `divisor`), one more step up if
  rounding took off more than 10% (the channel rounding of the MobileNet/EfficientNet papers)."""
  rounded = max(divisor, int(width + divisor / 2) // divisor * divisor)
  return rounded + divisor if rounded < 0.9 * width else rounded


def scaled(stages: Sequence[Stage], width_mult: float, depth_mult: float) -> tuple[Stage, ...]:
  """B0's stages widened and deepened by the compound-scaling multipliers."""
  return tuple(dataclasses.replace(s, in_width=round_width(s.in_width * width_mult),
                                   out_width=round_width(s.out_width * width_mult),
                                   blocks=int(math.ceil(s.blocks * depth_mult))) for s in stages)


def _pad(kernel: int):
  return [((kernel - 1) // 2, (kernel - 1) // 2)] * 2


class ConvBN(nn.Module):
  """A bias-free convolution, then BN, then SiLU unless `act` is False."""
  features: int
  kernel: int
  stride: int = 1
  groups: int = 1
  act: bool = True
  norm: Any = BatchNorm
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool):
    k, s = self.kernel, self.stride
    x = nn.Conv(self.features, (k, k), (s, s), padding=_pad(k), feature_group_count=self.groups, use_bias=False,
                kernel_init=conv_init, dtype=self.dtype, param_dtype=jnp.float32, name="conv")(x)
    x = self.norm(name="bn")(x, train)
    return nn.silu(x) if self.act else x


class SqueezeExcitation(nn.Module):
  """x times a per-channel gate from its spatial mean, all of it in fp32 but the product."""
  squeeze: int
  dtype: Any

  @nn.compact
  def __call__(self, x):
    conv1x1 = functools.partial(nn.Conv, kernel_size=(1, 1), dtype=jnp.float32, param_dtype=jnp.float32,
                                kernel_init=conv_init)
    s = jnp.mean(x, axis=(1, 2), keepdims=True, dtype=jnp.float32)
    s = nn.silu(conv1x1(self.squeeze, name="fc1")(s))
    gate = nn.sigmoid(conv1x1(x.shape[-1], name="fc2")(s))
    return x * gate.astype(self.dtype)


class MBConv(nn.Module):
  """One block. Its layers are named by role and by their place in torchvision's block
  (`expand0`, `depthwise1`, `se2`, `project3`; `fused0`, `project1`), so that the weights'
  names follow from the names alone."""
  stage: Stage
  stride: int
  drop_rate: float
  norm: Any
  dtype: Any

  @nn.compact
  def __call__(self, x, train: bool):
    width, s = x.shape[-1], self.stage
    inner = round_width(width * s.expand)
    conv_bn = functools.partial(ConvBN, norm=self.norm, dtype=self.dtype)
    layers = []  # (role, the layer's constructor), named in order below
    if s.kind == "fused":
      if inner != width:
        layers += [("fused", functools.partial(conv_bn, inner, s.kernel, self.stride)), ("project", functools.partial(conv_bn, s.out_width, 1, act=False))]
      else:
        layers += [("fused", functools.partial(conv_bn, s.out_width, s.kernel, self.stride))]
    elif s.kind == "mb":
      if inner != width:
        layers += [("expand", functools.partial(conv_bn, inner, 1))]
      layers += [("depthwise", functools.partial(conv_bn, inner, s.kernel, self.stride, groups=inner)),
                 ("se", functools.partial(SqueezeExcitation, max(1, width // 4), self.dtype)),
                 ("project", functools.partial(conv_bn, s.out_width, 1, act=False))]
    else:
      raise InvalidValueError(f"EfficientNet block kind {s.kind!r}: use 'mb' or 'fused'")
    y = x
    for i, (role, layer) in enumerate(layers):
      layer = layer(name=f"{role}{i}")
      y = layer(y) if role == "se" else layer(y, train)
    if self.stride == 1 and width == s.out_width:
      y = x + drop_path(y, self.drop_rate, train)
    return y


class EfficientNet(nn.Module):
  stages: Sequence[Stage]
  head_width: int = 0                   # the last 1x1 convolution's width; 0: 4x the last stage's
  num_classes: int = 1000
  dropout_rate: float = 0.2             # before the classifier
  stochastic_depth: float = 0.2
  dtype: Any = jnp.float32              # compute dtype
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  bn_num_groups: int = 1
  freeze_bn_stats: bool = False         # BN normalises with its running statistics in training too

  @nn.compact
  def __call__(self, x, train: bool):
    norm = functools.partial(BatchNorm, momentum=self.bn_momentum, epsilon=self.bn_epsilon, dtype=self.dtype,
                             num_groups=self.bn_num_groups, frozen=self.freeze_bn_stats)
    conv_bn = functools.partial(ConvBN, norm=norm, dtype=self.dtype)
    x = conv_bn(self.stages[0].in_width, 3, 2, name="stem")(x.astype(self.dtype), train)
    total, index = sum(s.blocks for s in self.stages), 0
    for i, stage in enumerate(self.stages):
      for b in range(stage.blocks):
        x = MBConv(stage, stage.stride if b == 0 else 1, self.stochastic_depth * index / total, norm,
                   self.dtype, name=f"stage{i + 1}_block{b + 1}")(x, train)
        index += 1
    # Named for its place after the stages (torchvision's features.<stages + 1>).
    head_width = self.head_width or 4 * self.stages[-1].out_width
    x = conv_bn(head_width, 1, name=f"stage{len(self.stages) + 1}_head")(x, train)
    x = jnp.mean(x, axis=(1, 2), dtype=jnp.float32)
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    # The classifier runs in fp32: it is tiny and its logits feed an fp32 loss.
    return nn.Dense(self.num_classes, dtype=jnp.float32, param_dtype=jnp.float32,
                    kernel_init=nn.initializers.variance_scaling(1 / 3, "fan_out", "uniform"), name="head")(x)


# (kind, expand ratio, kernel, stride, input width, output width, blocks) of each stage.
B0 = tuple(Stage("mb", *row) for row in [
    (1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
    (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)])
V2 = {
    "s": [("fused", 1, 3, 1, 24, 24, 2), ("fused", 4, 3, 2, 24, 48, 4), ("fused", 4, 3, 2, 48, 64, 4),
          ("mb", 4, 3, 2, 64, 128, 6), ("mb", 6, 3, 1, 128, 160, 9), ("mb", 6, 3, 2, 160, 256, 15)],
    "m": [("fused", 1, 3, 1, 24, 24, 3), ("fused", 4, 3, 2, 24, 48, 5), ("fused", 4, 3, 2, 48, 80, 5),
          ("mb", 4, 3, 2, 80, 160, 7), ("mb", 6, 3, 1, 160, 176, 14), ("mb", 6, 3, 2, 176, 304, 18),
          ("mb", 6, 3, 1, 304, 512, 5)],
    "l": [("fused", 1, 3, 1, 32, 32, 4), ("fused", 4, 3, 2, 32, 64, 7), ("fused", 4, 3, 2, 64, 96, 7),
          ("mb", 4, 3, 2, 96, 192, 10), ("mb", 6, 3, 1, 192, 224, 19), ("mb", 6, 3, 2, 224, 384, 25),
          ("mb", 6, 3, 1, 384, 640, 7)],
}
# (width multiplier, depth multiplier, dropout, native resolution) of B0-B7.
SCALING = {0: (1.0, 1.0, 0.2, 224), 1: (1.0, 1.1, 0.2, 240), 2: (1.1, 1.2, 0.3, 288), 3: (1.2, 1.4, 0.3, 300),
           4: (1.4, 1.8, 0.4, 380), 5: (1.6, 2.2, 0.4, 456), 6: (1.8, 2.6, 0.5, 528), 7: (2.0, 3.1, 0.5, 600)}
# V2's dropout and native (eval) resolution.
V2_SETTINGS = {"s": (0.2, 384), "m": (0.3, 480), "l": (0.4, 480)}

for _b, (_wm, _dm, _dropout, _) in SCALING.items():
  # B5-B7 were trained with BN eps 1e-3 and momentum 0.01 (torch's convention: 0.99 here).
  _bn = dict(bn_epsilon=1e-3, bn_momentum=0.99) if _b >= 5 else {}
  register(f"efficientnet_b{_b}")(functools.partial(EfficientNet, scaled(B0, _wm, _dm), dropout_rate=_dropout, **_bn))
for _size, (_dropout, _) in V2_SETTINGS.items():
  register(f"efficientnet_v2_{_size}")(functools.partial(
      EfficientNet, tuple(Stage(*row) for row in V2[_size]), head_width=1280, dropout_rate=_dropout,
      bn_epsilon=1e-3))

# A fused stage, two MBConv stages (one with a residual block) and a narrow head (13,052 parameters at
# 10 classes): tests and CPU runs on 16-32 px images.
register("efficientnet_mini")(functools.partial(
    EfficientNet, (Stage("fused", 1, 3, 1, 8, 8, 1), Stage("mb", 4, 3, 2, 8, 16, 2), Stage("mb", 4, 5, 2, 16, 24, 1)),
    head_width=64, dropout_rate=0.1))
