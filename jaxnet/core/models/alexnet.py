"""AlexNet (Krizhevsky et al. 2012) in NHWC, as torchvision defines it.

torchvision's variant is the "one weird trick" single-tower net (Krizhevsky
2014): 64-192-384-256-256 convolution channels, no local response norm, an
adaptive average pool to 6x6 before the classifier (so inputs other than 224px
work; anything from 63px up gives a feature map), and dropout 0.5 before the
two hidden dense layers. 61,100,840 parameters at 1000 classes.

There is no batch norm: the model has no `batch_stats`. Dropout draws from the
`dropout` RNG stream, which the train step derives from the seed and the step.
"""

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxnet.core.errors import InvalidValueError
from jaxnet.core.models import max_pool, register

# He-normal (fan-in) keeps the activations' scale through seven ReLU layers with no
# normalisation; PyTorch's default init shrinks its variance ~6x per layer (docs/models.md).
# Biases start at zero; the classifier at N(0, 0.01).
he_init = nn.initializers.variance_scaling(2.0, "fan_in", "normal")


def pool_bins(output_size: int, size: int) -> np.ndarray:
  """(output_size, size): PyTorch's adaptive average pool along one axis as a matrix. Output
  cell i averages input rows floor(i*size/out) .. ceil((i+1)*size/out) - 1, so bins overlap
  when size is not a multiple of out and repeat rows when size < out."""
  m = np.zeros((output_size, size), np.float32)
  for i in range(output_size):
    start, end = (i * size) // output_size, -(-((i + 1) * size) // output_size)
    m[i, start:end] = 1.0 / (end - start)
  return m


def adaptive_avg_pool(x, output_size: int):
  """NHWC average pool to output_size x output_size, with PyTorch's bins (`pool_bins`):
  two small averaging matrices (static shapes) applied in one einsum."""
  rows, cols = (jnp.asarray(pool_bins(output_size, n), x.dtype) for n in x.shape[1:3])
  return jnp.einsum("ih,nhwc,jw->nijc", rows, x, cols)


class AlexNet(nn.Module):
  num_classes: int = 1000
  widths: Sequence[int] = (64, 192, 384, 256, 256)   # the five convolutions
  hidden: int = 4096                                  # the two hidden dense layers
  dropout_rate: float = 0.5
  dtype: Any = jnp.float32                            # compute dtype

  @nn.compact
  def __call__(self, x, train: bool):
    conv = functools.partial(nn.Conv, dtype=self.dtype, param_dtype=jnp.float32,
                             kernel_init=he_init)
    dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=jnp.float32,
                              kernel_init=he_init)
    pool = functools.partial(max_pool, window_shape=(3, 3), strides=(2, 2), padding="VALID")
    if min(x.shape[1:3]) < 63:
      raise InvalidValueError(f"AlexNet needs images of at least 63x63 pixels, got {x.shape[1]}x{x.shape[2]}; "
                              "raise config.image_size")
    c1, c2, c3, c4, c5 = self.widths
    x = x.astype(self.dtype)
    x = pool(nn.relu(conv(c1, (11, 11), (4, 4), padding=[(2, 2), (2, 2)], name="conv1")(x)))
    x = pool(nn.relu(conv(c2, (5, 5), padding=[(2, 2), (2, 2)], name="conv2")(x)))
    x = nn.relu(conv(c3, (3, 3), padding=[(1, 1), (1, 1)], name="conv3")(x))
    x = nn.relu(conv(c4, (3, 3), padding=[(1, 1), (1, 1)], name="conv4")(x))
    x = pool(nn.relu(conv(c5, (3, 3), padding=[(1, 1), (1, 1)], name="conv5")(x)))
    x = adaptive_avg_pool(x, 6)
    x = x.reshape(x.shape[0], -1)  # (h, w, c) order; torchvision flattens (c, h, w)
    drop = functools.partial(nn.Dropout, self.dropout_rate, deterministic=not train)
    x = nn.relu(dense(self.hidden, name="fc1")(drop()(x)))
    x = nn.relu(dense(self.hidden, name="fc2")(drop()(x)))
    # The classifier runs in fp32: its logits feed an fp32 loss.
    return nn.Dense(self.num_classes, dtype=jnp.float32, param_dtype=jnp.float32,
                    kernel_init=nn.initializers.normal(0.01), name="head")(x)


register("alexnet")(AlexNet)
# The same layers with 16-48 channels and 128 hidden units (~0.2M parameters on digits),
# for tests and CPU runs on 64px images.
register("alexnet_mini")(functools.partial(AlexNet, widths=(16, 32, 48, 32, 32), hidden=128))
