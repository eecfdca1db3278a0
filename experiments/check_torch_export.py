"""Does PyTorch accept jaxnet's `--format=torch` export, and compute the same logits?

  python experiments/check_torch_export.py export DIR [MODEL]                 # jaxnet's env
  /work/venv-torch/bin/python experiments/check_torch_export.py check DIR     # an env with torch

MODEL is resnet50 (default), alexnet, vit_ti16 or fcn_resnet50. `export` trains it for 2
steps on synthetic 64 px images (so weights and BN statistics are no longer their init),
exports it with `python -m jaxnet.cli.export --format=torch`, and stores two uint8 test
images with jaxnet's logits for them. `check` builds the PyTorch model (torchvision's
resnet50, alexnet or fcn_resnet50 (21 classes, the auxiliary head on), timm's
vit_tiny_patch16_224 at 64 px), loads the file with `load_state_dict(strict=True)`,
normalises the images with the mean/std recorded in the file, and compares the logits (a
segmenter's per pixel, both heads').
"""

import json
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {"resnet50": "resnet50.py", "alexnet": "alexnet.py", "vit_ti16": "vit.py:ti16", "fcn_resnet50": "fcn.py"}
IMAGE_SIZE = 64


def export(workdir: str, model_name: str = "resnet50") -> None:
  sys.path.insert(0, REPO)
  from jaxnet import api
  overrides = {
      "data.source": "synthetic", "data.synthetic_size": 16, "data.num_classes": 1000,
      "image_size": IMAGE_SIZE, "batch_size": 8, "total_steps": 2, "precision": "fp32",
      "mesh.num_devices": 1, "log_every_steps": 1, "checkpoint_every_steps": 0,
      "eval_every_steps": 0}
  if model_name == "resnet50":  # every residual branch active, not only the shortcuts
    overrides.update({"progressive_resizing": (), "model.zero_init_last_bn": False})
  if model_name.startswith("vit"):  # the recipe's plain flavour has no timm counterpart
    # No warmup and a large rate: two steps move the zero-initialised head to logits of order one.
    overrides.update({"model.flavour": "timm", "optim.warmup_steps": 0,
                      "optim.learning_rate": 0.5})
  if model_name == "fcn_resnet50":  # synthetic images and masks of VOC's 21 classes
    overrides.update({"data.num_classes": 21, "data.eval_batch_size": 8})
  config = api.load_config(os.path.join(REPO, "configs", CONFIGS[model_name]), **overrides)
  run = os.path.join(workdir, "run")
  api.train(config, run)
  out = os.path.join(workdir, "model.safetensors")
  subprocess.run([sys.executable, "-m", "jaxnet.cli.export", f"--workdir={run}", "--format=torch",
                  f"--out={out}"], check=True, cwd=REPO)
  model = api.restore(run)
  images = np.random.default_rng(0).integers(0, 256, (2, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
  if model_name == "fcn_resnet50":  # the model's own outputs: the predictor's are class maps
    from jaxnet.core import steps
    x = steps.normalize(images, model.config.data.mean, model.config.data.std, np.float32)
    outputs = model.model.apply(model.variables, x, train=False)
    logits = {f"logits_{k}": np.asarray(v).transpose(0, 3, 1, 2) for k, v in outputs.items()}  # NCHW
    np.savez(os.path.join(workdir, "jaxnet_logits.npz"), images=images, **logits)
    return
  np.savez(os.path.join(workdir, "jaxnet_logits.npz"), images=images, logits=model.logits(images))


def check(workdir: str) -> None:
  import safetensors
  import torch
  from safetensors.torch import load_file
  path = os.path.join(workdir, "model.safetensors")
  state = load_file(path)
  with safetensors.safe_open(path, "pt") as f:
    metadata = f.metadata()
  prep, name = json.loads(metadata["preprocessing"]), metadata["model"]
  if name.startswith("vit"):
    import timm
    model, versions = timm.create_model("vit_tiny_patch16_224", img_size=IMAGE_SIZE), f"timm {timm.__version__}"
  elif name.startswith(("fcn", "deeplabv3")):
    import torchvision
    model = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None,
                                                           num_classes=21, aux_loss=True)
    versions = f"torchvision {torchvision.__version__}"
  else:
    import torchvision
    model = getattr(torchvision.models, name)()
    versions = f"torchvision {torchvision.__version__}"
  result = model.load_state_dict(state, strict=True)
  print(f"torch {torch.__version__}, {versions}: {name} load_state_dict (strict) of {len(state)} "
        f"tensors: {result}")
  saved = np.load(os.path.join(workdir, "jaxnet_logits.npz"))
  x = (saved["images"].astype(np.float32) / 255 - np.array(prep["mean"])) / np.array(prep["std"])
  model.eval()
  with torch.no_grad():
    outputs = model(torch.from_numpy(x.transpose(0, 3, 1, 2).astype(np.float32)))
  outputs = {f"logits_{k}": v.numpy() for k, v in outputs.items()} if isinstance(outputs, dict) else \
      {"logits": outputs.numpy()}
  for key, logits in outputs.items():
    print(f"{key} {logits.shape}: |jaxnet| max {np.abs(saved[key]).max():.3f}, max |torch - jaxnet| "
          f"{np.abs(logits - saved[key]).max():.2e}")


if __name__ == "__main__":
  if len(sys.argv) < 3 or sys.argv[1] not in ("export", "check") or (
      sys.argv[1] == "export" and len(sys.argv) == 4 and sys.argv[3] not in CONFIGS):
    sys.exit(__doc__)
  {"export": export, "check": check}[sys.argv[1]](*sys.argv[2:])
