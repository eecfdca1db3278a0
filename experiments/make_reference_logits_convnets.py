"""Writes tests/data/reference_logits_convnets.npz: torchvision's ConvNeXt and EfficientNet logits
for numpy-drawn weights.

    /work/venvtorch/bin/python experiments/make_reference_logits_convnets.py
    (any Python with torch, torchvision and numpy; no jax)

For each model of tests/convnet_weights.SETUPS (torchvision's convnext_tiny,
efficientnet_b0 and efficientnet_v2_s, and the same classes built at jaxnet's
convnext_mini and efficientnet_mini sizes), in eval mode: draw every tensor of its
state_dict with `convnet_weights.draw` (numpy only), load them strictly, run the fixed
input and store the logits with the state dict's names and shapes (the test checks that
jaxnet's map produces exactly these) and the library versions. The weights themselves are
not stored: they are a function of the seed.
"""

import os
import sys

import numpy as np
import torch

# torchvision's compiled operators (nms, roi_align) may not load against a CPU torch wheel of
# another build; its meta registrations of them then fail at import. The models here use
# none of them, so those registrations are skipped.
torch.library.register_fake = lambda *args, **kwargs: (lambda fn: fn)
import torchvision  # noqa: E402
from torchvision.models import convnext, efficientnet  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests import convnet_weights as cw  # noqa: E402

OUT = os.path.join(REPO, "tests", "data", "reference_logits_convnets.npz")


def convnext_mini(num_classes):
  """jaxnet's convnext_mini: stages of 1 and 2 blocks, 16 and 32 channels."""
  return convnext.ConvNeXt([convnext.CNBlockConfig(16, 32, 1), convnext.CNBlockConfig(32, None, 2)],
                           stochastic_depth_prob=0.1, num_classes=num_classes)


def efficientnet_mini(num_classes):
  """jaxnet's efficientnet_mini: a fused stage, two MBConv stages, a 64-wide head."""
  setting = [efficientnet.FusedMBConvConfig(1, 3, 1, 8, 8, 1), efficientnet.MBConvConfig(4, 3, 2, 8, 16, 2),
             efficientnet.MBConvConfig(4, 5, 2, 16, 24, 1)]
  return efficientnet.EfficientNet(setting, dropout=0.1, last_channel=64, num_classes=num_classes)


BUILDERS = {"convnext_mini": convnext_mini, "efficientnet_mini": efficientnet_mini,
            "convnext_tiny": lambda n: torchvision.models.convnext_tiny(num_classes=n),
            "efficientnet_b0": lambda n: torchvision.models.efficientnet_b0(num_classes=n),
            "efficientnet_v2_s": lambda n: torchvision.models.efficientnet_v2_s(num_classes=n)}


def logits_for(name: str, setup: dict) -> tuple[np.ndarray, dict]:
  model = BUILDERS[name](setup["num_classes"]).eval()
  shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
  weights = cw.draw(shapes, setup["seed"])
  model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
  with torch.no_grad():
    logits = model(torch.from_numpy(cw.reference_input(setup["image_size"]))).numpy().astype(np.float32)
  return logits, shapes


def main():
  torch.manual_seed(0)
  arrays = {}
  for name, setup in cw.SETUPS.items():
    logits, shapes = logits_for(name, setup)
    arrays[name] = logits
    arrays[name + "/names"] = np.array(sorted(shapes))
    arrays[name + "/shapes"] = np.array([",".join(map(str, shapes[k])) for k in sorted(shapes)])
    print(f"{name}: logits {logits.shape}, |max| {np.abs(logits).max():.3f}, std {logits.std():.3f}, "
          f"{sum(int(np.prod(s)) for k, s in shapes.items() if not k.endswith('num_batches_tracked'))} "
          f"values in the state dict")
  arrays["versions"] = np.array(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
                                f"numpy {np.__version__}")
  np.savez_compressed(OUT, **arrays)
  print(f"wrote {OUT}")


if __name__ == "__main__":
  main()
