"""Writes tests/data/timm_names_convnets.json: the state-dict names and shapes of timm's
convnext_tiny and efficientnet_b0 at 1000 classes (what jaxnet's timm namings of the ConvNeXts
and EfficientNets must produce), and the versions.

    /work/venvtorch/bin/python experiments/make_timm_names_convnets.py
    (any Python with torch, timm and numpy; no jax)

The CI has neither torch nor timm: tests/test_convnext_efficientnet.py checks jaxnet's timm
names against this list, and loads the torchvision reference weights renamed into it.
"""

import json
import os

import torch

# timm imports torchvision, whose compiled operators (nms, roi_align) may not load against a
# CPU torch wheel of another build; the models here use none of them (as in
# make_reference_logits_convnets.py).
torch.library.register_fake = lambda *args, **kwargs: (lambda fn: fn)
import timm  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "data", "timm_names_convnets.json")
MODELS = ("convnext_tiny", "efficientnet_b0")


def state_dict_shapes(name: str) -> dict[str, list[int]]:
  model = timm.create_model(name, pretrained=False, num_classes=1000)
  return {key: list(value.shape) for key, value in sorted(model.state_dict().items())}


def main():
  record = {"versions": f"torch {torch.__version__}, timm {timm.__version__}",
            "models": {name: state_dict_shapes(name) for name in MODELS}}
  with open(OUT, "w") as f:  # a tensor a line: the file diffs as the state dict does
    f.write(f'{{"versions": {json.dumps(record["versions"])},\n "models": {{\n')
    f.write(",\n".join(f"  {json.dumps(name)}: {{\n" + ",\n".join(
        f"   {json.dumps(key)}: {json.dumps(shape)}" for key, shape in shapes.items()) + "}"
        for name, shapes in record["models"].items()))
    f.write("}}\n")
  print(f"wrote {OUT}: " + ", ".join(f"{n} {len(s)} tensors" for n, s in record["models"].items()))


if __name__ == "__main__":
  main()
