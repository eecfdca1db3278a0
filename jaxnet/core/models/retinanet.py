"""RetinaNet (Lin et al. 2017) in NHWC, laid out as torchvision's `retinanet_resnet50_fpn` (v1):
a ResNet backbone (models/resnet.py, its BN frozen by default, as torchvision's), a feature
pyramid P3-P7 (1x1 lateral and 3x3 output convolutions on C3-C5, nearest-neighbour top-down
upsampling, P6 a stride-2 3x3 convolution of P5 and P7 one of relu(P6)), and two heads shared
by the levels: four 3x3 convolutions with ReLU, then 9 anchors x classes logits (bias at
-log((1 - 0.01) / 0.01), so every anchor starts at probability 0.01) and 9 anchors x 4 box
deltas; the anchors the deltas are relative to (`anchors`, torchvision's AnchorGenerator).
Losses and decoding: jaxnet/core/tasks/detection/__init__.py.

Returns {"cls": (N, A, classes) float32, "box": (N, A, 4) float32, "levels": ((h, w), ...)},
the anchors ordered by level, row, column, anchor (torchvision's order).
"""

import functools
import math
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxnet.core.models import register
from jaxnet.core.models.resnet import BasicBlock, BottleneckBlock, ResNet

# torchvision's FPN and P6/P7 convolutions: kaiming_uniform_(a=1), zero bias; the heads': normal(0.01).
fpn_init = nn.initializers.variance_scaling(1.0, "fan_in", "uniform")
head_init = nn.initializers.normal(0.01)
ANCHOR_RATIOS = (0.5, 1.0, 2.0)  # torchvision's


def anchor_sizes(base: int) -> tuple:
  """Per pyramid level P3..P7: three sizes, base * 2^(0, 1/3, 2/3) truncated, base doubling."""
  return tuple((b, int(b * 2 ** (1 / 3)), int(b * 2 ** (2 / 3))) for b in (base * 2 ** i for i in range(5)))


def anchors(image_size: int, level_sizes, base_size: int = 32) -> np.ndarray:
  """(A, 4) anchors in the order of the heads' outputs: level, then row, column, anchor; per
  location ratio-major then size, each rounded, as torchvision's AnchorGenerator makes them."""
  out = []
  for (h, w), sizes in zip(level_sizes, anchor_sizes(base_size)):
    scales = np.asarray(sizes, np.float32)
    h_ratios = np.sqrt(np.asarray(ANCHOR_RATIOS, np.float32))
    w_ratios = 1 / h_ratios
    ws = (w_ratios[:, None] * scales[None, :]).reshape(-1)
    hs = (h_ratios[:, None] * scales[None, :]).reshape(-1)
    base = np.round(np.stack([-ws, -hs, ws, hs], axis=1) / 2)
    stride_y, stride_x = image_size // h, image_size // w
    ys, xs = np.meshgrid(np.arange(h, dtype=np.float32) * stride_y,
                         np.arange(w, dtype=np.float32) * stride_x, indexing="ij")
    shifts = np.stack([xs.ravel(), ys.ravel(), xs.ravel(), ys.ravel()], axis=1)
    out.append((shifts[:, None, :] + base[None, :, :]).reshape(-1, 4))
  return np.concatenate(out).astype(np.float32)


def _upsample_nearest(x, shape):
  """x (N, h, w, C) to (N, H, W, C) as torch's interpolate(mode="nearest"): source floor(i * h / H)."""
  n, h, w, c = x.shape
  if shape[0] % h == 0 and shape[1] % w == 0:
    # Whole factors (every even input size): a broadcast, whose gradient is a sum, where a
    # gather's is a scatter that XLA lays out with activation-sized transposes on a GPU.
    fy, fx = shape[0] // h, shape[1] // w
    return jnp.broadcast_to(x[:, :, None, :, None], (n, h, fy, w, fx, c)).reshape(n, shape[0], shape[1], c)
  rows = (jnp.arange(shape[0]) * x.shape[1]) // shape[0]
  cols = (jnp.arange(shape[1]) * x.shape[2]) // shape[1]
  return x[:, rows][:, :, cols]


class RetinaNet(nn.Module):
  TASK = "detection"  # models.task: trained on boxes (jaxnet/core/tasks/detection/__init__.py)

  stage_sizes: Sequence[int]
  block: type
  num_classes: int = 91
  width: int = 64                     # the backbone's, as ResNet's
  stem: str = "imagenet"
  fpn_channels: int = 256
  head_convs: int = 4
  anchor_base: int = 32               # the P3 anchors' size; it doubles per level
  dtype: Any = jnp.float32
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  bn_num_groups: int = 1
  freeze_bn_stats: bool = True        # the backbone's BN: its running statistics, as torchvision's

  def anchor_boxes(self, image_size: int, levels) -> tuple[np.ndarray, list[int]]:
    """(the (A, 4) anchors the outputs of an image_size image are relative to, the anchors per
    level), for the detection task: `levels` is the output's "levels"."""
    per_location = len(ANCHOR_RATIOS) * len(anchor_sizes(self.anchor_base)[0])
    return anchors(image_size, levels, self.anchor_base), [h * w * per_location for h, w in levels]

  @nn.compact
  def __call__(self, x, train: bool):
    c3, c4, c5 = ResNet(self.stage_sizes, self.block, width=self.width, stem=self.stem, dtype=self.dtype,
                        bn_momentum=self.bn_momentum, bn_epsilon=self.bn_epsilon,
                        bn_num_groups=self.bn_num_groups, zero_init_last_bn=False,
                        freeze_bn_stats=self.freeze_bn_stats, features_only=True, name="backbone")(x, train)
    conv = functools.partial(nn.Conv, self.fpn_channels, dtype=self.dtype, param_dtype=jnp.float32,
                             kernel_init=fpn_init, bias_init=nn.initializers.zeros)
    same = [(1, 1), (1, 1)]
    inner = conv(kernel_size=(1, 1), name="fpn_inner2")(c5)
    p5 = conv(kernel_size=(3, 3), padding=same, name="fpn_layer2")(inner)
    levels = [p5]
    for i, c in ((1, c4), (0, c3)):
      inner = conv(kernel_size=(1, 1), name=f"fpn_inner{i}")(c) + _upsample_nearest(inner, c.shape[1:3])
      levels.insert(0, conv(kernel_size=(3, 3), padding=same, name=f"fpn_layer{i}")(inner))
    p6 = conv(kernel_size=(3, 3), strides=(2, 2), padding=same, name="p6")(p5)
    p7 = conv(kernel_size=(3, 3), strides=(2, 2), padding=same, name="p7")(nn.relu(p6))
    levels += [p6, p7]

    anchors = 9
    head = functools.partial(nn.Conv, kernel_size=(3, 3), padding=same, dtype=self.dtype,
                             param_dtype=jnp.float32, kernel_init=head_init, bias_init=nn.initializers.zeros)
    cls_convs = [head(self.fpn_channels, name=f"cls_conv{i}") for i in range(self.head_convs)]
    box_convs = [head(self.fpn_channels, name=f"box_conv{i}") for i in range(self.head_convs)]
    prior = -math.log((1 - 0.01) / 0.01)
    cls_out = head(anchors * self.num_classes, name="cls_logits", bias_init=nn.initializers.constant(prior))
    box_out = head(anchors * 4, name="box_reg")
    cls_all, box_all = [], []
    for p in levels:
      c, b = p, p
      for cc, bc in zip(cls_convs, box_convs):
        c, b = nn.relu(cc(c)), nn.relu(bc(b))
      n, h, w, _ = p.shape
      cls_all.append(cls_out(c).astype(jnp.float32).reshape(n, h * w * anchors, self.num_classes))
      box_all.append(box_out(b).astype(jnp.float32).reshape(n, h * w * anchors, 4))
    return {"cls": jnp.concatenate(cls_all, axis=1), "box": jnp.concatenate(box_all, axis=1),
            "levels": tuple((p.shape[1], p.shape[2]) for p in levels)}


for _depth, (_stages, _block) in {18: ([2, 2, 2, 2], BasicBlock), 34: ([3, 4, 6, 3], BasicBlock),
                                  50: ([3, 4, 6, 3], BottleneckBlock),
                                  101: ([3, 4, 23, 3], BottleneckBlock)}.items():
  register(f"retinanet_resnet{_depth}")(functools.partial(RetinaNet, _stages, _block))

# For tests and the shapes recipe (retinanet:shapes): one basic block per stage at
# width 16, a 64-channel pyramid and two head convolutions; anchors from 16 pixels on P3
# (stride 8), for objects of 16-64 pixels in 128-pixel images.
register("retinanet_tiny")(functools.partial(RetinaNet, [1, 1, 1, 1], BasicBlock, width=16,
                                             fpn_channels=64, head_convs=2, anchor_base=16))
