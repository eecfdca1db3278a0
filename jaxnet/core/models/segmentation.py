"""FCN (Long et al. 2015) and DeepLabV3 (Chen et al. 2017) in NHWC, laid out as torchvision's
`fcn_resnetN` and `deeplabv3_resnetN`: a ResNet backbone (models/resnet.py) whose last two
stages replace their stride by dilation (output stride 8), a head on its last stage's
features, optionally (`aux_loss`) an auxiliary FCN head on the stage before, and each head's
class logits upsampled bilinearly to the input's size (torch's interpolate(mode="bilinear",
align_corners=False)).

  FCN head        3x3 conv (in / 4 channels), BN, ReLU, dropout 0.1, 1x1 conv to the classes
  DeepLabV3 head  ASPP: a 1x1 conv, three 3x3 convs dilated 12, 24, 36, and the image's mean
                  through a 1x1 conv, each 256 channels with BN and ReLU, concatenated, a 1x1
                  conv (BN, ReLU, dropout 0.5) to 256; then a 3x3 conv, BN, ReLU, a 1x1 conv
                  to the classes

Returns {"out": (N, H, W, num_classes) float32 logits, "aux": the same from the auxiliary head,
present only with aux_loss}. The per-class 1x1 convolutions of both heads are one module,
`class_logits` (its `out` and `aux`): a fine-tune to other classes re-initialises them
together (torch_names.Family.class_layer). Losses and metrics: jaxnet/core/tasks/segmentation.
"""

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxnet.core.errors import InvalidValueError
from jaxnet.core.models import register
from jaxnet.core.models.batchnorm import BatchNorm
from jaxnet.core.models.resnet import BasicBlock, BottleneckBlock, ResNet

# torch's default for a Conv2d (the heads' convolutions): kaiming_uniform_(a=sqrt(5)).
head_init = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")


def bilinear_matrix(out_size: int, in_size: int) -> np.ndarray:
  """(out_size, in_size) float32 weights of torch's bilinear interpolation along one axis
  (align_corners=False): output i reads the input at (i + 0.5) * in / out - 0.5, clamped at
  0, from its two neighbours (the last one repeated at the far edge), computed in float32
  as torch's CPU kernel computes them."""
  scale = np.float32(in_size / out_size)
  src = np.maximum(scale * (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) - np.float32(0.5),
                   np.float32(0))
  low = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
  high = np.minimum(low + 1, in_size - 1)
  frac = np.clip(src - low.astype(np.float32), 0, 1).astype(np.float32)
  weights = np.zeros((out_size, in_size), np.float32)
  rows = np.arange(out_size)
  np.add.at(weights, (rows, low), np.float32(1) - frac)
  np.add.at(weights, (rows, high), frac)
  return weights


def upsample_bilinear(x, size):
  """NHWC `x` to spatial `size` as torch's interpolate(mode="bilinear", align_corners=False): two
  small matrix products (their gradient is two more, where a gather's would be a scatter)."""
  n, h, w, c = x.shape
  if (h, w) == tuple(size):
    return x
  rows, cols = bilinear_matrix(size[0], h), bilinear_matrix(size[1], w)
  hi = jax.lax.Precision.HIGHEST  # exact fp32 weights on a GPU too (not TF32)
  x = jnp.einsum("oh,nhwc->nowc", rows, x, precision=hi)
  return jnp.einsum("pw,nowc->nopc", cols, x, precision=hi)


class FCNHead(nn.Module):
  """torchvision's FCNHead without its last 1x1 conv (in class_logits): conv, BN, ReLU, dropout."""
  channels: int
  conv: Any
  norm: Any

  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.relu(self.norm(name="bn")(self.conv(self.channels, (3, 3), name="conv")(x), train))
    return nn.Dropout(0.1, deterministic=not train)(x)


class DeepLabHead(nn.Module):
  """torchvision's DeepLabHead without its last 1x1 conv (in class_logits): ASPP, conv, BN, ReLU."""
  channels: int
  atrous_rates: Sequence[int]
  conv: Any
  norm: Any

  @nn.compact
  def __call__(self, x, train: bool):
    def branch(i, y, kernel=(1, 1), dilation=1):
      return nn.relu(self.norm(name=f"aspp{i}_bn")(self.conv(self.channels, kernel, dilation=dilation,
                                                              name=f"aspp{i}_conv")(y), train))

    branches = [branch(0, x)]
    branches += [branch(i + 1, x, (3, 3), rate) for i, rate in enumerate(self.atrous_rates)]
    pooled = jnp.mean(x, axis=(1, 2), keepdims=True, dtype=jnp.float32).astype(x.dtype)
    pooled = nn.relu(self.norm(name="pool_bn")(self.conv(self.channels, (1, 1), name="pool_conv")(pooled), train))
    branches.append(jnp.broadcast_to(pooled, x.shape[:3] + (self.channels,)))  # bilinear from 1x1
    y = jnp.concatenate(branches, axis=-1)
    y = nn.relu(self.norm(name="project_bn")(self.conv(self.channels, (1, 1), name="project_conv")(y), train))
    y = nn.Dropout(0.5, deterministic=not train)(y)
    return nn.relu(self.norm(name="bn")(self.conv(self.channels, (3, 3), name="conv")(y), train))


class ClassLogits(nn.Module):
  """The heads' per-class 1x1 convolutions, `out` and (given aux features) `aux`, in float32."""
  num_classes: int
  dtype: Any

  @nn.compact
  def __call__(self, out, aux=None):
    conv = functools.partial(nn.Conv, self.num_classes, (1, 1), dtype=self.dtype, param_dtype=jnp.float32,
                             kernel_init=head_init, bias_init=nn.initializers.zeros)
    logits = {"out": conv(name="out")(out).astype(jnp.float32)}
    if aux is not None:
      logits["aux"] = conv(name="aux")(aux).astype(jnp.float32)
    return logits


def _conv(features, kernel_size, dilation=1, **kwargs):
  """A head's convolution: no bias (a BN follows), padded dilation * (k // 2) as torch's."""
  pad = [(dilation * (k // 2),) * 2 for k in kernel_size]
  return nn.Conv(features, kernel_size, padding=pad, kernel_dilation=(dilation, dilation), use_bias=False,
                 **kwargs)


ASPP_RATES = (12, 24, 36)  # torchvision's DeepLabV3


class Segmenter(nn.Module):
  TASK = "segmentation"  # models.task: trained on masks (jaxnet/core/tasks/segmentation)

  stage_sizes: Sequence[int]
  block: type
  head: str                           # "fcn" or "deeplabv3"
  num_classes: int = 21               # Pascal VOC's 20 and the background
  aux_loss: bool = False              # also the auxiliary FCN head's logits, on the third stage
  width: int = 64                     # the backbone's, as ResNet's
  head_width: int = 0                 # the heads' hidden channels; 0: torchvision's (FCN: a
                                      # quarter of its input's, DeepLabV3: 256)
  atrous_rates: Sequence[int] = ASPP_RATES  # the ASPP's dilations (DeepLabV3; an FCN, which has
                                            # no ASPP, refuses another value)
  dtype: Any = jnp.float32
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  bn_num_groups: int = 1
  freeze_bn_stats: bool = False       # every BN normalises with its running statistics in training too

  def __post_init__(self):
    if self.head == "fcn" and tuple(self.atrous_rates) != ASPP_RATES:
      raise InvalidValueError(f"config.model.atrous_rates={tuple(self.atrous_rates)}: they are DeepLabV3's "
                              f"ASPP dilations, and an FCN has no ASPP: leave it out (or use a deeplabv3_* model)")
    super().__post_init__()

  @nn.compact
  def __call__(self, x, train: bool):
    size = x.shape[1:3]
    c4, c5 = backbone(self)(x, train)[-2:]
    conv = functools.partial(_conv, dtype=self.dtype, param_dtype=jnp.float32, kernel_init=head_init)
    norm = functools.partial(BatchNorm, momentum=self.bn_momentum, epsilon=self.bn_epsilon, dtype=self.dtype,
                             num_groups=self.bn_num_groups, frozen=self.freeze_bn_stats)
    if self.head == "fcn":
      out = FCNHead(self.head_width or c5.shape[-1] // 4, conv, norm, name="fcn_head")(c5, train)
    elif self.head == "deeplabv3":
      out = DeepLabHead(self.head_width or 256, tuple(self.atrous_rates), conv, norm,
                        name="deeplab_head")(c5, train)
    else:
      raise ValueError(f"unknown segmentation head {self.head!r}")
    aux = None
    if self.aux_loss:
      aux = FCNHead(self.head_width or c4.shape[-1] // 4, conv, norm, name="aux_head")(c4, train)
    logits = ClassLogits(self.num_classes, self.dtype, name="class_logits")(out, aux)
    return {k: upsample_bilinear(v, size) for k, v in logits.items()}


def backbone(model: Segmenter) -> ResNet:
  """The ResNet under `model`'s "backbone": its last two stages dilated, their outputs returned
  (also what the ONNX writer reads its architecture from)."""
  return ResNet(model.stage_sizes, model.block, width=model.width, dtype=model.dtype,
                bn_momentum=model.bn_momentum, bn_epsilon=model.bn_epsilon, bn_num_groups=model.bn_num_groups,
                zero_init_last_bn=False, freeze_bn_stats=model.freeze_bn_stats, features_only=True,
                dilate_stages=(False, True, True), name="backbone")


_DEPTHS = {50: ([3, 4, 6, 3], BottleneckBlock), 101: ([3, 4, 23, 3], BottleneckBlock)}
for _depth, (_stages, _block) in _DEPTHS.items():
  register(f"fcn_resnet{_depth}")(functools.partial(Segmenter, _stages, _block, "fcn"))
  register(f"deeplabv3_resnet{_depth}")(functools.partial(Segmenter, _stages, _block, "deeplabv3"))

# For tests and the shapes quick start: one basic block per stage at width 16 (output stride 8,
# as the large ones), heads 32 channels wide, the ASPP's dilations scaled to 64-128 px images.
register("fcn_tiny")(functools.partial(Segmenter, [1, 1, 1, 1], BasicBlock, "fcn", width=16, head_width=32))
register("deeplabv3_tiny")(functools.partial(Segmenter, [1, 1, 1, 1], BasicBlock, "deeplabv3", width=16,
                                             head_width=32, atrous_rates=(3, 6, 9)))
