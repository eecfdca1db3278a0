"""Writes tests/data/torchvision_segmentation.npz: torchvision's fcn_resnet50 and
deeplabv3_resnet50 logits for seeded weights, with every BN randomised.

    /work/venv-torch/bin/python experiments/make_reference_logits_segmentation.py
    (any Python with torch, torchvision and numpy; no jax)

Each model is built with the auxiliary head (aux_loss=True) and
reference_weights.SEGMENTATION_CLASSES classes; every tensor of its state dict, and the
input (reference_weights.SEGMENTATION_INPUT_SHAPE), is drawn with numpy
(tests/reference_weights.draw_segmentation), loaded strictly, and run in eval mode in fp32.
Stored: the outputs (fcn's "out" and "aux", deeplabv3's "out": its "aux" is fcn's; NCHW as
torchvision returns them), the state dict's
names and shapes (the test checks that jaxnet's map produces exactly these), the parameter
counts of all four torchvision models with and without the auxiliary head at 21 classes, one
bilinear upsampling of a small array (torch's F.interpolate, align_corners=False) and the
library versions. The weights themselves are not stored: they are a function of the seed.
"""

import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torchvision.models import segmentation

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests import reference_weights as rw  # noqa: E402

OUT = os.path.join(REPO, "tests", "data", "torchvision_segmentation.npz")
COUNTED = ("fcn_resnet50", "fcn_resnet101", "deeplabv3_resnet50", "deeplabv3_resnet101")


def build(name: str, num_classes: int, aux_loss: bool) -> torch.nn.Module:
  return getattr(segmentation, name)(weights=None, weights_backbone=None, num_classes=num_classes,
                                     aux_loss=aux_loss)


def reference(name: str) -> dict[str, np.ndarray]:
  model = build(name, rw.SEGMENTATION_CLASSES, aux_loss=True).eval()
  shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
  images, tensors = rw.draw_segmentation(shapes)
  model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=True)
  with torch.no_grad():
    outputs = model(torch.from_numpy(images))
  # deeplabv3's "aux" is fcn's, the same FCNHead on the same backbone drawn from the same seeds.
  keep = ("out", "aux") if name.startswith("fcn") else ("out",)
  out = {f"{name}/{k}": v.numpy().astype(np.float32) for k, v in outputs.items() if k in keep}
  out[f"{name}/names"] = np.array(sorted(shapes))
  out[f"{name}/shapes"] = np.array([",".join(map(str, shapes[k])) for k in sorted(shapes)])
  for k, v in outputs.items():
    print(f"{name} {k}: {tuple(v.shape)}, |max| {v.abs().max():.3f}, std {v.std():.3f}")
  return out


def main():
  torch.manual_seed(0)
  arrays = {}
  for name in ("fcn_resnet50", "deeplabv3_resnet50"):
    arrays.update(reference(name))
  for name in COUNTED:
    for aux in (False, True):
      count = sum(p.numel() for p in build(name, 21, aux).parameters())
      arrays[f"{name}/params{'_aux' if aux else ''}"] = np.array(count, np.int64)
      print(f"{name} aux_loss={aux}: {count:,} parameters")
  small = np.random.default_rng(3).standard_normal((2, 3, 5, 7)).astype(np.float32)
  arrays["interpolate/in"] = small
  arrays["interpolate/out"] = F.interpolate(torch.from_numpy(small), size=(17, 12), mode="bilinear",
                                            align_corners=False).numpy()
  arrays["versions"] = np.array(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
                                f"numpy {np.__version__}")
  np.savez_compressed(OUT, **arrays)
  print(f"wrote {os.path.relpath(OUT, REPO)} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
  main()
