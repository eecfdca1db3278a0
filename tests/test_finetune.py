"""Fine-tuning end to end: weights exported by a run on one generated ImageFolder start a
run on another, with other classes, and it learns faster than the same run from scratch.

The folders come from one jaxnet.data.make_imagefolder call (10 classes: colour,
stripe angle and stripe frequency); run A sees classes 0-5, run B classes 6-9, so
B's classes are new combinations of features A learned, and B's head (4 classes,
not 6) must be re-initialised.
"""

import json
import os
import shutil

import pytest

from jaxnet import api, export
from jaxnet.data.make_imagefolder import make_imagefolder
from jaxnet.weights import tensor_files
from tests.helpers import REPO

PRETRAIN_CLASSES, FINETUNE_CLASSES = 6, 4
A_PREPROCESSING = {"data.mean": (0.5, 0.45, 0.4), "data.std": (0.25, 0.25, 0.25),
                   "data.eval_crop_fraction": 0.9, "data.eval_interpolation": "bicubic"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  root = tmp_path_factory.mktemp("folders")
  make_imagefolder(str(root / "all"), PRETRAIN_CLASSES + FINETUNE_CLASSES, per_class=40,
                   val_per_class=25, seed=0, verbose=False)
  for name, classes in (("a", range(PRETRAIN_CLASSES)),
                        ("b", range(PRETRAIN_CLASSES, PRETRAIN_CLASSES + FINETUNE_CLASSES))):
    for split in ("train", "val"):
      for k in classes:
        shutil.move(str(root / "all" / split / f"class_{k:03d}"), str(root / name / split / f"class_{k:03d}"))
  return root


def config(data_dir, steps, **overrides):
  return api.load_config(os.path.join(REPO, "configs", "finetune.py"), {
      "model.name": "resnet_tiny", "image_size": 32, "batch_size": 32, "precision": "fp32",
      "total_steps": steps, "log_every_steps": steps, "eval_every_steps": 0,
      "checkpoint_every_steps": 0, "mesh.num_devices": 1, "data.workers": 0,
      "data.dir": str(data_dir), "init.weights": "", "label_smoothing": 0.0,
      "optim.learning_rate": 0.4, "optim.warmup_steps": 5, **overrides})


def test_finetuning_beats_training_from_scratch(folders, tmp_path, capsys):
  api.train(config(folders / "a", 120, **A_PREPROCESSING), str(tmp_path / "a"))
  weights = str(tmp_path / "a.safetensors")
  assert export.main(["--workdir", str(tmp_path / "a"), "--format=torchvision", "--out", weights]) == 0
  metadata = tensor_files.read_metadata(weights)
  assert json.loads(metadata["class_names"]) == [f"class_{k:03d}" for k in range(PRETRAIN_CLASSES)]

  steps = 20
  finetuned = api.train(config(folders / "b", steps, **{"init.weights": weights}), str(tmp_path / "ft"))
  out = capsys.readouterr().out
  assert f"init: 63 of 63 variables from {weights}" not in out
  assert f"classifier head re-initialised: the weights have {PRETRAIN_CLASSES} classes, this run " \
         f"{FINETUNE_CLASSES}" in out
  scratch = api.train(config(folders / "b", steps, **A_PREPROCESSING), str(tmp_path / "scratch"))
  print(f"B after {steps} steps: fine-tuned top-1 {finetuned['eval/top1']:.3f} loss "
        f"{finetuned['eval/loss']:.3f}; from scratch top-1 {scratch['eval/top1']:.3f} loss "
        f"{scratch['eval/loss']:.3f}")
  assert finetuned["eval/top1"] >= scratch["eval/top1"] + 0.2

  # The run took the preprocessing of the weights (A's), recorded for eval and predict.
  recorded = json.load(open(tmp_path / "ft" / "preprocessing.json"))
  assert recorded["preprocessing"] == {"mean": [0.5, 0.45, 0.4], "std": [0.25, 0.25, 0.25],
                                       "crop_fraction": 0.9, "interpolation": "bicubic"}
  restored = api.restore(str(tmp_path / "ft")).config.data
  assert (tuple(restored.mean), restored.eval_crop_fraction, restored.eval_interpolation) == \
      ((0.5, 0.45, 0.4), 0.9, "bicubic")
