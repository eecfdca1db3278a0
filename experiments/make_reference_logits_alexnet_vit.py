"""Writes tests/data/reference_logits_alexnet_vit.npz: PyTorch logits for numpy-drawn weights.

    /work/venv-torch/bin/python experiments/make_reference_logits_alexnet_vit.py
    (any Python with torch, torchvision, timm and numpy)

For torchvision's `alexnet` and timm's `vit_tiny_patch16_224` (at a 64px input,
timm's img_size argument: 16 patches + the class token), in eval mode:
  1. check that tests/torch_weights.py lists the model's state_dict exactly
     (names, shapes, order);
  2. load the weights `torch_weights.draw(spec, SEED)` draws (numpy only);
  3. run the fixed input `torch_weights.reference_input(...)`, and save only the
     logits (and the library versions, for the record).
tests/test_alexnet_vit.py redraws the same weights without torch, loads them
through init.weights's path (jaxnet/weights) and compares its logits with these. Nothing else is stored:
the weights are a function of the seed.
"""

import os
import sys

import numpy as np
import timm
import torch
import torchvision

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests import torch_weights as tw  # noqa: E402

OUT = os.path.join(REPO, "tests", "data", "reference_logits_alexnet_vit.npz")
ALEXNET, VIT = tw.ALEXNET_SETUP, tw.VIT_SETUP


def logits_for(model, spec, setup) -> np.ndarray:
  sd = model.state_dict()
  actual = [(name, tuple(t.shape)) for name, t in sd.items()]
  if actual != list(spec):
    raise SystemExit(f"tests/torch_weights.py's spec does not match the model's state_dict:\n"
                     f"{[a for a in actual if a not in spec][:5]} vs {[s for s in spec if s not in actual][:5]}")
  weights = tw.draw(spec, setup["weights_seed"])
  model.load_state_dict({name: torch.from_numpy(w) for name, w in weights.items()})
  x = torch.from_numpy(tw.reference_input(setup["input_seed"], setup["batch"], setup["image_size"]))
  with torch.no_grad():
    return model.eval()(x).numpy().astype(np.float32)


def main():
  torch.manual_seed(0)
  alexnet = logits_for(torchvision.models.alexnet(weights=None), tw.alexnet_spec(), ALEXNET)
  vit = logits_for(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=VIT["image_size"]),
                   tw.vit_tiny_spec(VIT["image_size"]), VIT)
  os.makedirs(os.path.dirname(OUT), exist_ok=True)
  np.savez(OUT, alexnet=alexnet, vit_tiny=vit,
           versions=np.array(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
                             f"timm {timm.__version__}, numpy {np.__version__}"))
  print(f"wrote {OUT}: alexnet logits {alexnet.shape} (|max| {np.abs(alexnet).max():.3f}), "
        f"vit_tiny logits {vit.shape} (|max| {np.abs(vit).max():.3f})")


if __name__ == "__main__":
  main()
