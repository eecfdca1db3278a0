"""ResNet v1.5 (stride on the 3x3 conv of bottlenecks) in NHWC.

Padding is symmetric, k // 2 on every side of a k x k window, as in
torchvision: a stride-2 3x3 conv or max-pool on an even-sized input pads one
pixel before and one after, where "SAME" would pad 0 before and 1 after. With
it, `resnetN` computes what torchvision's `resnetN` does for the same weights
(tests/test_torch_reference.py).

Two stems: `imagenet` (7x7/2 conv + 3x3/2 max-pool, for 224px inputs) and
`small` (one 3x3/1 conv, no pool, for 32x32 and smaller inputs such as CIFAR
or the 16x16 digits quick start).
"""

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxnet.core.models import max_pool, register
from jaxnet.core.models.batchnorm import BatchNorm
from jaxnet.core.errors import InvalidValueError

# He-normal fan-out init, as in the reference ResNet implementations.
conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


def _conv(features, kernel_size, strides=(1, 1), dilation: int = 1, **kwargs):
  """nn.Conv padded dilation * (k // 2) on each side (torchvision's padding), not "SAME"."""
  pad = [(dilation * (k // 2),) * 2 for k in kernel_size]
  return nn.Conv(features, kernel_size, strides, padding=pad, kernel_dilation=(dilation, dilation), **kwargs)


def _last_bn_init(zero_init_last: bool):
  # Zero-init of each block's last BN scale makes every residual block start as
  # the identity, which lets large-batch runs use high learning rates early.
  return nn.initializers.zeros if zero_init_last else nn.initializers.ones


def _channels_padded_conv(channels: int):
  """lax.conv_general_dilated with the input's channels padded with zeros to `channels`, and
  the kernel's input channels likewise: the same sums, plus products of zeros. Tensor-core
  convolution kernels want a channel count that is a multiple of 4 or 8, not an image's 3."""
  def conv(lhs, rhs, window_strides, padding, **kwargs):
    extra = channels - lhs.shape[-1]
    if extra < 0:
      raise InvalidValueError(f"model.stem_conv=pad{channels}: the images have {lhs.shape[-1]} channels, "
                              f"more than {channels}")
    lhs = jnp.pad(lhs, [(0, 0)] * (lhs.ndim - 1) + [(0, extra)])
    rhs = jnp.pad(rhs, [(0, 0)] * (rhs.ndim - 2) + [(0, extra), (0, 0)])
    return jax.lax.conv_general_dilated(lhs, rhs, window_strides, padding, **kwargs)
  return conv


def _space_to_depth_conv(lhs, rhs, window_strides, padding, **kwargs):
  """A stride-2 k x k convolution of NHWC `lhs` as a stride-1 ceil(k/2)-wide one over 2x2 blocks
  of pixels stacked as channels (MLPerf's TPU ResNet stem): 3 channels become 12, and the kernel
  is the same kernel, zero-padded to an even size and rearranged the same way. The same sums,
  plus products of zeros, in another order (fp32 rounding)."""
  if tuple(window_strides) != (2, 2) or isinstance(padding, str):
    raise InvalidValueError("model.stem_conv=space_to_depth needs the stem's stride-2 convolution "
                            "with explicit padding (stem='imagenet')")
  n, c = lhs.shape[0], lhs.shape[-1]
  pads, blocks, taps = [], [], []
  for size, k, (lo, hi) in zip(lhs.shape[1:3], rhs.shape[:2], padding):
    hi += (size + lo + hi) % 2  # an even padded length: whole 2x2 blocks
    pads.append((lo, hi))
    blocks.append((size + lo + hi) // 2)
    taps.append(-(-k // 2))
  lhs = jnp.pad(lhs, [(0, 0), *pads, (0, 0)])
  lhs = lhs.reshape(n, blocks[0], 2, blocks[1], 2, c).transpose(0, 1, 3, 2, 4, 5)
  lhs = lhs.reshape(n, blocks[0], blocks[1], 4 * c)
  rhs = jnp.pad(rhs, [(0, 2 * taps[0] - rhs.shape[0]), (0, 2 * taps[1] - rhs.shape[1]), (0, 0), (0, 0)])
  rhs = rhs.reshape(taps[0], 2, taps[1], 2, c, rhs.shape[-1]).transpose(0, 2, 1, 3, 4, 5)
  rhs = rhs.reshape(taps[0], taps[1], 4 * c, rhs.shape[-1])
  return jax.lax.conv_general_dilated(lhs, rhs, (1, 1), "VALID", **kwargs)


STEM_CONVS = {"plain": None, "pad4": _channels_padded_conv(4), "pad8": _channels_padded_conv(8),
              "space_to_depth": _space_to_depth_conv}


class BasicBlock(nn.Module):
  filters: int
  strides: int
  conv: Callable[..., Any]
  norm: Callable[..., Any]
  zero_init_last: bool = True
  dilation: int = 1                   # of both 3x3 convolutions (torchvision's BasicBlock has none)

  @nn.compact
  def __call__(self, x, train):
    s = (self.strides, self.strides)
    y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), s, dilation=self.dilation)(x), train))
    y = self.conv(self.filters, (3, 3), dilation=self.dilation)(y)
    y = self.norm(scale_init=_last_bn_init(self.zero_init_last))(y, train)
    if x.shape != y.shape:
      x = self.norm(name="proj_bn")(self.conv(self.filters, (1, 1), s, name="proj_conv")(x), train)
    return nn.relu(y + x)


class BottleneckBlock(nn.Module):
  filters: int
  strides: int
  conv: Callable[..., Any]
  norm: Callable[..., Any]
  zero_init_last: bool = True
  dilation: int = 1                   # of the 3x3 convolution, as torchvision's

  @nn.compact
  def __call__(self, x, train):
    s = (self.strides, self.strides)
    y = nn.relu(self.norm()(self.conv(self.filters, (1, 1))(x), train))
    y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), s, dilation=self.dilation)(y), train))
    y = self.conv(self.filters * 4, (1, 1))(y)
    y = self.norm(scale_init=_last_bn_init(self.zero_init_last))(y, train)
    if x.shape != y.shape:
      x = self.norm(name="proj_bn")(self.conv(self.filters * 4, (1, 1), s, name="proj_conv")(x), train)
    return nn.relu(y + x)


class ResNet(nn.Module):
  MLPERF_BENCHMARK = "resnet"  # mlperf.log's submission_benchmark (MLPerf's image classification)
  stage_sizes: Sequence[int]
  block: type
  num_classes: int = 1000
  width: int = 64
  stem: str = "imagenet"
  dtype: Any = jnp.float32            # compute dtype of convolutions and activations
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  bn_num_groups: int = 1
  zero_init_last_bn: bool = True
  freeze_bn_stats: bool = False       # BN normalises with its running statistics in training too
  features_only: bool = False         # no classifier: the last 3 stages' outputs (C3, C4, C5), for
                                      # a detector's feature pyramid (models/retinanet.py)
  dilate_stages: Sequence[bool] = ()  # per stage after the first, True: its stride is replaced by
                                      # dilation (torchvision's replace_stride_with_dilation), for a
                                      # segmenter's output stride 8 (models/segmentation.py); (): none
  stem_conv: str = "plain"            # how the stem's convolution is computed, the same function
                                      # and parameters: "plain", "pad4"/"pad8" (the image's channels
                                      # padded with zeros to 4/8), "space_to_depth" (2x2 blocks as
                                      # channels, a 4x4 stride-1 conv: MLPerf's TPU stem)
  scatter_free_pool: bool = False     # the stem's max pool differentiated without XLA's
                                      # select-and-scatter (models.scatter_free_max_pool): the
                                      # same gradient, bit for bit, in fewer bytes on a GPU

  @nn.compact
  def __call__(self, x, train: bool):
    conv = functools.partial(_conv, use_bias=False, dtype=self.dtype, param_dtype=jnp.float32,
                             kernel_init=conv_init)
    norm = functools.partial(BatchNorm, momentum=self.bn_momentum, epsilon=self.bn_epsilon,
                             dtype=self.dtype, num_groups=self.bn_num_groups, frozen=self.freeze_bn_stats)
    x = x.astype(self.dtype)
    if self.stem_conv not in STEM_CONVS:
      raise InvalidValueError(f"unknown model.stem_conv {self.stem_conv!r}; use one of {', '.join(STEM_CONVS)}")
    if self.stem == "imagenet":
      x = conv(self.width, (7, 7), (2, 2), name="stem_conv", conv_general_dilated=STEM_CONVS[self.stem_conv])(x)
      x = nn.relu(norm(name="stem_bn")(x, train))
      x = max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)),  # pads with -inf
                   scatter_free=self.scatter_free_pool)
    elif self.stem == "small":
      x = conv(self.width, (3, 3), name="stem_conv")(x)
      x = nn.relu(norm(name="stem_bn")(x, train))
    else:
      raise InvalidValueError(f"unknown stem {self.stem!r}; use 'imagenet' or 'small'")

    dilate = tuple(self.dilate_stages) or (False,) * (len(self.stage_sizes) - 1)
    if len(dilate) != len(self.stage_sizes) - 1:
      raise InvalidValueError(f"model.dilate_stages={tuple(self.dilate_stages)} needs one flag per stage after "
                              f"the first ({len(self.stage_sizes) - 1})")
    stages, dilation = [], 1
    for stage, num_blocks in enumerate(self.stage_sizes):
      strides, previous = (2 if stage > 0 else 1), dilation
      if stage > 0 and dilate[stage - 1]:  # as torchvision: the stage's first block keeps the
        dilation, strides = dilation * strides, 1  # dilation before it, the others take the new one
      for b in range(num_blocks):
        x = self.block(self.width * 2**stage, strides if b == 0 else 1, conv, norm, self.zero_init_last_bn,
                       dilation=previous if b == 0 else dilation, name=f"stage{stage + 1}_block{b + 1}")(x, train)
      stages.append(x)
    if self.features_only:
      return stages[-3:]
    x = jnp.mean(x, axis=(1, 2), dtype=jnp.float32)
    # The classifier runs in fp32: it is tiny and its logits feed an fp32 loss.
    return nn.Dense(self.num_classes, dtype=jnp.float32, param_dtype=jnp.float32, name="head")(x)


_IMAGENET_DEPTHS = {
    18: ([2, 2, 2, 2], BasicBlock),
    34: ([3, 4, 6, 3], BasicBlock),
    50: ([3, 4, 6, 3], BottleneckBlock),
    101: ([3, 4, 23, 3], BottleneckBlock),
    152: ([3, 8, 36, 3], BottleneckBlock),
    200: ([3, 24, 36, 3], BottleneckBlock),
}

for _depth, (_stages, _block) in _IMAGENET_DEPTHS.items():
  # `resnetN` has the ImageNet stem; `resnetN_small` the 3x3 stem for <=32px inputs.
  register(f"resnet{_depth}")(functools.partial(ResNet, _stages, _block, stem="imagenet"))
  register(f"resnet{_depth}_small")(functools.partial(ResNet, _stages, _block, stem="small"))

# A few-hundred-thousand-parameter ResNet for tests and the digits quick start.
register("resnet_tiny")(functools.partial(ResNet, [1, 1, 1], BasicBlock, width=16, stem="small"))
