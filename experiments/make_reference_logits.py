"""Reference logits of torchvision's resnet18 and resnet50 under seeded weights.

  /work/venv-torch/bin/python experiments/make_reference_logits.py   # any env with torch + torchvision

Draws every tensor of each model's state dict, and the input, with numpy
(tests/reference_weights.py, which documents the order and the rules), loads
them into torchvision's model (strict), runs it in eval mode in fp32 and
writes only the logits to tests/data/torchvision_resnet_logits.npz (~16 KB).
The tests draw the same tensors without torch and compare jaxnet's logits.

It also checks, and prints, three things the tests rely on without torch:
  * timm's resnet18/resnet50 (when timm is installed) have the same tensor
    names and shapes and give the same logits for the same weights;
  * tests/reference_eval.py (PIL) gives the pixels of torchvision's
    Resize(256) + CenterCrop(224) transform.
"""

import os
import sys

import numpy as np
import torch
import torchvision
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests import reference_eval, reference_weights  # noqa: E402

OUT = os.path.join(REPO, "tests", "data", "torchvision_resnet_logits.npz")


def reference_logits(model: torch.nn.Module) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
  images, tensors = reference_weights.draw(shapes)
  model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=True)
  model.eval()
  with torch.no_grad():
    return model(torch.from_numpy(images)).numpy(), tensors


def check_timm(name: str, tensors: dict, logits: np.ndarray) -> None:
  try:
    import timm
  except ImportError:
    print(f"timm not installed: {name} not compared")
    return
  model = timm.create_model(name, pretrained=False)
  same_names = {k: tuple(v.shape) for k, v in model.state_dict().items()} == \
      {k: tuple(v.shape) for k, v in tensors.items()}
  timm_logits, _ = reference_logits(model)
  print(f"timm {timm.__version__} {name}: same names and shapes as torchvision: {same_names}; "
        f"max |logit difference| {np.abs(timm_logits - logits).max():.2e}")


def check_eval_transform() -> None:
  from torchvision import transforms
  rng = np.random.default_rng(0)
  reference = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224)])
  worst = 0
  for height, width in ((375, 500), (500, 375), (300, 451), (512, 512), (1203, 1605), (257, 999)):
    # Smooth content plus noise, so that resampling errors would show.
    smooth = np.asarray(Image.fromarray(rng.integers(0, 256, (8, 8, 3), np.uint8)).resize(
        (width, height), Image.Resampling.BICUBIC), np.int16)
    pixels = np.clip(smooth + rng.integers(-20, 21, smooth.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    ours = reference_eval.resize_center_crop(image)
    theirs = np.asarray(reference(image))
    worst = max(worst, int(np.abs(ours.astype(int) - theirs).max()))
  print(f"tests/reference_eval.py vs torchvision Resize(256)+CenterCrop(224), 6 image sizes: "
        f"max pixel difference {worst}")


def main():
  torch.manual_seed(0)
  out = {}
  for name in ("resnet18", "resnet50"):
    model = getattr(torchvision.models, name)()
    logits, tensors = reference_logits(model)
    out[name] = logits.astype(np.float32)
    print(f"torchvision {torchvision.__version__} {name}: {len(tensors)} tensors, logits "
          f"{logits.shape}, |logit| max {np.abs(logits).max():.3f}, std {logits.std():.3f}")
    check_timm(name, tensors, logits)
  check_eval_transform()
  np.savez(OUT, **out)
  print(f"wrote {os.path.relpath(OUT, REPO)} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
  main()
