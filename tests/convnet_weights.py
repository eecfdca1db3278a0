"""Seeded torchvision-named weights for ConvNeXt and EfficientNet, drawn with numpy alone.

Shared by experiments/make_reference_logits_convnets.py (run once where torch and
torchvision are installed: it loads these weights into torchvision's models and stores
their logits in tests/data/reference_logits_convnets.npz) and
tests/test_convnext_efficientnet.py (which draws the same weights without torch and loads
them into jaxnet through the weights-import path).

`draw(shapes, seed)` visits the state dict's names in sorted order (so the two sides need
only agree on the names and shapes, not on an order) with one `np.random.default_rng(seed)`:

  weight of rank >= 2 (conv, linear)   N(0, 1) / sqrt(fan_in), fan_in = prod(shape[1:])
  weight of rank 1 (LayerNorm, BN)     uniform(0.5, 1.5)
  bias, BN running_mean                0.1 * N(0, 1)
  BN running_var                       uniform(0.5, 1.5)
  ConvNeXt layer_scale                 uniform(0.2, 0.6): far from its 1e-6 init, so every
                                       block's branch counts in the logits
  BN num_batches_tracked               0 (int64), nothing drawn

Every norm's parameters and statistics differ from their init, so a norm mapped to the
wrong place, or an eps or a transposed kernel gone wrong, shows in the logits.
"""

import numpy as np

# The reference models: the seed of their weights, their input size and class count.
SETUPS = {
    "convnext_mini": dict(seed=11, image_size=32, num_classes=10),
    "efficientnet_mini": dict(seed=12, image_size=32, num_classes=10),
    "convnext_tiny": dict(seed=13, image_size=64, num_classes=1000),
    "efficientnet_b0": dict(seed=14, image_size=64, num_classes=1000),
    "efficientnet_v2_s": dict(seed=15, image_size=64, num_classes=1000),
}
INPUT_SEED, BATCH = 7, 2


def draw(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
  """{name: tensor} for a state dict of these names and shapes (rules in the module docstring)."""
  rng = np.random.default_rng(seed)
  out = {}
  for name in sorted(shapes):
    shape, leaf = tuple(shapes[name]), name.rsplit(".", 1)[-1]
    if leaf == "num_batches_tracked":
      out[name] = np.zeros(shape, np.int64)
      continue
    if leaf == "weight" and len(shape) > 1:
      value = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
    elif leaf in ("weight", "running_var"):
      value = rng.uniform(0.5, 1.5, shape)
    elif leaf in ("bias", "running_mean"):
      value = 0.1 * rng.standard_normal(shape)
    elif leaf == "layer_scale":
      value = rng.uniform(0.2, 0.6, shape)
    else:
      raise ValueError(f"no drawing rule for {name}")
    out[name] = value.astype(np.float32)
  return out


def reference_input(image_size: int) -> np.ndarray:
  """The models' (already normalised) float32 input, NCHW as PyTorch takes it."""
  return np.random.default_rng(INPUT_SEED).standard_normal((BATCH, 3, image_size, image_size)).astype(np.float32)
