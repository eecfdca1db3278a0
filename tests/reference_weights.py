"""Seeded ResNet weights under torchvision's names, drawn with numpy alone.

experiments/make_reference_logits.py draws them for torchvision's resnet18 and
resnet50 and stores only the logits (tests/data/torchvision_resnet_logits.npz);
tests/test_torch_reference.py draws the same tensors without torch and checks
that jaxnet, loading them from a .safetensors file, computes those logits.

The draw, one generator `np.random.default_rng(seed)`:
  1. the input, `INPUT_SHAPE` (NCHW) standard normal, float32;
  2. the tensors in sorted name order (not state_dict order, so both sides need
     only agree on the names), each by the rule for its name and shape:
       conv / fc `weight`       normal(0, sqrt(2 / fan_in)), fan_in = prod(shape[1:])
       BN `weight`              uniform(0.5, 1.5), but uniform(0.1, 0.3) for the last BN
                                of each residual branch (a block's highest bnK) and of
                                each projection shortcut (downsample.1), so that the
                                residual stream does not double at every block
       any `bias`               normal(0, 0.1)
       BN `running_mean`        normal(0, 0.1)
       BN `running_var`         uniform(0.5, 1.5)
       BN `num_batches_tracked` 0 (int64), nothing drawn
     These keep activations O(1) through the network in eval mode, and every BN
     statistic differs from its init, so a BN mapped to the wrong place shows.
"""

import numpy as np

SEED = 20260518
INPUT_SHAPE = (2, 3, 64, 64)   # 64 px: even sizes at every stride-2 layer, where padding matters


def draw(shapes: dict[str, tuple[int, ...]], seed: int = SEED,
         input_shape=INPUT_SHAPE) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """(input NCHW, {name: tensor}) for a state dict with these names and shapes."""
  rng = np.random.default_rng(seed)
  images = rng.standard_normal(input_shape).astype(np.float32)
  small_bns = _small_bns(shapes)
  tensors = {}
  for name in sorted(shapes):
    tensors[name] = _tensor(name, tuple(shapes[name]), rng, small_bns)
  return images, tensors


def _tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator, small_bns=frozenset()) -> np.ndarray:
  """The tensor `name` drawn from `rng` by the rules above."""
  leaf = name.rsplit(".", 1)[-1]
  if leaf == "num_batches_tracked":
    return np.zeros(shape, np.int64)
  if leaf == "weight" and len(shape) > 1:
    value = rng.normal(0.0, np.sqrt(2.0 / np.prod(shape[1:])), shape)
  elif leaf == "weight" and name.rsplit(".", 1)[0] in small_bns:
    value = rng.uniform(0.1, 0.3, shape)
  elif leaf in ("weight", "running_var"):
    value = rng.uniform(0.5, 1.5, shape)
  elif leaf in ("bias", "running_mean"):
    value = rng.normal(0.0, 0.1, shape)
  else:
    raise ValueError(f"no drawing rule for {name}")
  return value.astype(np.float32)



def _small_bns(names) -> set[str]:
  """The BN modules drawn with small weights: each block's last bnK and its downsample.1."""
  blocks = {}
  for name in names:
    parts = name.split(".")
    if parts[0].startswith("layer") and parts[2].startswith("bn"):
      blocks.setdefault(".".join(parts[:2]), []).append(int(parts[2][2:]))
  return ({f"{block}.bn{max(ks)}" for block, ks in blocks.items()} |
          {f"{block}.downsample.1" for block in blocks})


RETINANET_INPUT_SHAPE = (2, 3, 128, 128)  # P3-P7 of 16x16 down to 1x1


def draw_retinanet(shapes: dict[str, tuple[int, ...]], seed: int = SEED):
  """(input NCHW, {name: tensor}) for torchvision's RetinaNet state dict: its ResNet
  (`backbone.body.*`) drawn by `draw`'s rules with `seed`, then the pyramid's and heads'
  tensors in sorted name order from a second generator (seed + 1): conv weights
  normal(0, sqrt(1 / fan_in)), biases normal(0, 0.1), but the class logits' bias
  normal(-2, 0.5), so that scores fall on both sides of the 0.05 threshold."""
  return _backbone_then_heads(shapes, "backbone.body.", seed, RETINANET_INPUT_SHAPE, _retinanet_tensor)


def _retinanet_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
  if name.endswith(".weight"):
    value = rng.normal(0.0, np.sqrt(1.0 / np.prod(shape[1:])), shape)
  elif name == "head.classification_head.cls_logits.bias":
    value = rng.normal(-2.0, 0.5, shape)
  elif name.endswith(".bias"):
    value = rng.normal(0.0, 0.1, shape)
  else:
    raise ValueError(f"no drawing rule for {name}")
  return value.astype(np.float32)


def _backbone_then_heads(shapes, prefix: str, seed: int, input_shape, tensor):
  """`draw` of the ResNet under `prefix` with `seed`, then the other tensors in sorted name
  order, each `tensor(name, shape, rng)` from a second generator (seed + 1)."""
  images, tensors = draw({n[len(prefix):]: s for n, s in shapes.items() if n.startswith(prefix)}, seed,
                         input_shape)
  tensors = {prefix + n: t for n, t in tensors.items()}
  rng = np.random.default_rng(seed + 1)
  for name in sorted(n for n in shapes if not n.startswith(prefix)):
    tensors[name] = tensor(name, tuple(shapes[name]), rng)
  return images, tensors


# Not a multiple of 8 (a 13x15 map at output stride 8, upsampled by 100/13 and 116/15), and
# wide enough that the ASPP's 12-dilated taps reach into the map.
SEGMENTATION_INPUT_SHAPE = (1, 3, 100, 116)
SEGMENTATION_CLASSES = 3


def draw_segmentation(shapes: dict[str, tuple[int, ...]], seed: int = SEED):
  """(input NCHW, {name: tensor}) for torchvision's fcn_resnetN / deeplabv3_resnetN state dict:
  its ResNet (`backbone.*`) drawn by `draw`'s rules with `seed`, then the heads' tensors in
  sorted name order from a second generator (seed + 1): conv weights normal(0, sqrt(2 /
  fan_in)), BN weights and running_var uniform(0.5, 1.5), biases and running_mean normal(0, 0.1)."""
  return _backbone_then_heads(shapes, "backbone.", seed, SEGMENTATION_INPUT_SHAPE, _tensor)
