"""Does torchvision accept jaxnet's torchvision-format export, and compute the same logits?

  python experiments/check_torchvision_export.py export DIR                     # jaxnet's env
  /work/venv-torch/bin/python experiments/check_torchvision_export.py check DIR  # an env with torch

`export` trains jaxnet's resnet50 (1000 classes) for 2 steps on synthetic 64 px
images (so BN statistics and weights are no longer their init), exports it with
`python -m jaxnet.export --format=torchvision`, and stores two uint8 test images
with jaxnet's logits for them. `check` loads the file into
`torchvision.models.resnet50()` with `load_state_dict(strict=True)`, normalises
the images with the mean/std recorded in the file, and compares the logits.
"""

import json
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def export(workdir: str) -> None:
  sys.path.insert(0, REPO)
  from jaxnet import api
  config = api.load_config(os.path.join(REPO, "configs", "resnet50.py"), **{
      "data.source": "synthetic", "data.synthetic_size": 16, "image_size": 64, "batch_size": 8,
      "total_steps": 2, "precision": "fp32", "mesh.num_devices": 1, "log_every_steps": 1,
      "checkpoint_every_steps": 0, "eval_every_steps": 0, "progressive_resizing": (),
      "model.zero_init_last_bn": False})  # every residual branch active, not only the shortcuts
  api.train(config, os.path.join(workdir, "run"))
  out = os.path.join(workdir, "resnet50.safetensors")
  subprocess.run([sys.executable, "-m", "jaxnet.export", f"--workdir={workdir}/run",
                  "--format=torchvision", f"--out={out}"], check=True, cwd=REPO)
  model = api.restore(os.path.join(workdir, "run"))
  images = np.random.default_rng(0).integers(0, 256, (2, 64, 64, 3), np.uint8)
  np.savez(os.path.join(workdir, "jaxnet_logits.npz"), images=images, logits=model.logits(images))


def check(workdir: str) -> None:
  import safetensors
  import torch
  import torchvision
  from safetensors.torch import load_file
  path = os.path.join(workdir, "resnet50.safetensors")
  state = load_file(path)
  with safetensors.safe_open(path, "pt") as f:
    prep = json.loads(f.metadata()["preprocessing"])
  model = torchvision.models.resnet50()
  result = model.load_state_dict(state, strict=True)
  print(f"torch {torch.__version__}, torchvision {torchvision.__version__}: resnet50().load_state_dict "
        f"(strict) of {len(state)} tensors: {result}")
  saved = np.load(os.path.join(workdir, "jaxnet_logits.npz"))
  x = (saved["images"].astype(np.float32) / 255 - np.array(prep["mean"])) / np.array(prep["std"])
  model.eval()
  with torch.no_grad():
    logits = model(torch.from_numpy(x.transpose(0, 3, 1, 2).astype(np.float32))).numpy()
  print(f"logits (2, 1000): |jaxnet| max {np.abs(saved['logits']).max():.3f}, max |torch - jaxnet| "
        f"{np.abs(logits - saved['logits']).max():.2e}")


if __name__ == "__main__":
  if len(sys.argv) != 3 or sys.argv[1] not in ("export", "check"):
    sys.exit(__doc__)
  {"export": export, "check": check}[sys.argv[1]](sys.argv[2])
