"""PyTorch weights for AlexNet (torchvision) and ViT-Ti/16 (timm), drawn with numpy only.

Shared by tests/test_alexnet_vit.py and experiments/make_reference_logits_alexnet_vit.py,
so the script (run where torch, torchvision and timm are installed) and the tests
(run without them) draw the same weights from one definition:

1. `*_spec()` lists the PyTorch state_dict: every tensor's name and shape, in
   state_dict order. The script checks it against the real model's state_dict.
2. `draw(spec, seed)` draws every tensor, in that order, from one
   `np.random.default_rng(seed)` (float32 standard normals, then scaled):
     *.bias, LayerNorm bias            0.1 * N(0, 1)
     LayerNorm weight (norm*.weight)   1 + 0.1 * N(0, 1)
     cls_token, pos_embed              0.5 * N(0, 1)
     other weights (rank >= 2)         N(0, 1) / sqrt(fan_in), fan_in = prod(shape[1:])
   Scaling by fan-in keeps activations of order one through every layer, so
   the logits compare at an absolute tolerance.

The tests load the drawn tensors through jaxnet's own import path
(jaxnet/tools/weights/alexnet_names.py, vit_names.py, via a .safetensors file).
"""

from __future__ import annotations

import numpy as np

ALEXNET_CONVS = [(0, 3, 64, 11), (3, 64, 192, 5), (6, 192, 384, 3), (8, 384, 256, 3), (10, 256, 256, 3)]
ALEXNET_DENSE = [(1, 256 * 6 * 6, 4096, "fc1"), (4, 4096, 4096, "fc2")]

# timm's vit_tiny_patch16_224: width, depth, mlp width, patch.
VIT_TINY = dict(width=192, depth=12, mlp_dim=768, patch=16)

# The reference runs: seeds of the weights and of the input, batch, image size.
# AlexNet at 255px has a 7x7 last feature map, so the 6x6 adaptive pool's bins overlap;
# ViT-Ti/16 at 64px (timm's img_size) has 16 patches + the class token.
ALEXNET_SETUP = dict(weights_seed=1, input_seed=2, batch=2, image_size=255)
VIT_SETUP = dict(weights_seed=3, input_seed=4, batch=2, image_size=64)


def alexnet_spec(num_classes: int = 1000) -> list[tuple[str, tuple[int, ...]]]:
  spec = []
  for index, cin, cout, k in ALEXNET_CONVS:
    spec += [(f"features.{index}.weight", (cout, cin, k, k)), (f"features.{index}.bias", (cout,))]
  for index, fin, fout, _ in ALEXNET_DENSE:
    spec += [(f"classifier.{index}.weight", (fout, fin)), (f"classifier.{index}.bias", (fout,))]
  return spec + [("classifier.6.weight", (num_classes, 4096)), ("classifier.6.bias", (num_classes,))]


def vit_tiny_spec(image_size: int, num_classes: int = 1000) -> list[tuple[str, tuple[int, ...]]]:
  d, mlp, p = VIT_TINY["width"], VIT_TINY["mlp_dim"], VIT_TINY["patch"]
  tokens = (image_size // p) ** 2 + 1
  spec = [("cls_token", (1, 1, d)), ("pos_embed", (1, tokens, d)),
          ("patch_embed.proj.weight", (d, 3, p, p)), ("patch_embed.proj.bias", (d,))]
  for i in range(VIT_TINY["depth"]):
    b = f"blocks.{i}."
    spec += [(b + "norm1.weight", (d,)), (b + "norm1.bias", (d,)),
             (b + "attn.qkv.weight", (3 * d, d)), (b + "attn.qkv.bias", (3 * d,)),
             (b + "attn.proj.weight", (d, d)), (b + "attn.proj.bias", (d,)),
             (b + "norm2.weight", (d,)), (b + "norm2.bias", (d,)),
             (b + "mlp.fc1.weight", (mlp, d)), (b + "mlp.fc1.bias", (mlp,)),
             (b + "mlp.fc2.weight", (d, mlp)), (b + "mlp.fc2.bias", (d,))]
  return spec + [("norm.weight", (d,)), ("norm.bias", (d,)),
                 ("head.weight", (num_classes, d)), ("head.bias", (num_classes,))]


def draw(spec, seed: int) -> dict[str, np.ndarray]:
  """Every tensor of `spec`, in order, from one seeded generator (rules in the module docstring)."""
  rng = np.random.default_rng(seed)
  out = {}
  for name, shape in spec:
    z = rng.standard_normal(shape, dtype=np.float32)
    parts = name.split(".")
    if parts[-1] == "bias":
      value = 0.1 * z
    elif len(parts) > 1 and parts[-2].startswith("norm"):
      value = 1.0 + 0.1 * z
    elif name in ("cls_token", "pos_embed"):
      value = 0.5 * z
    else:
      value = z * np.float32(1 / np.sqrt(np.prod(shape[1:])))
    out[name] = value.astype(np.float32, copy=False)
  return out


def reference_input(seed: int, batch: int, image_size: int) -> np.ndarray:
  """The models' (already normalised) float32 input, NCHW as PyTorch takes it."""
  return np.random.default_rng(seed).standard_normal((batch, 3, image_size, image_size)).astype(np.float32)

