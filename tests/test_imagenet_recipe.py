"""The ImageNet recipe (configs/resnet50.py) end to end on a generated JPEG folder."""

import os

import numpy as np
import pytest

from jaxnet.data.make_imagefolder import make_imagefolder
from jaxnet.metrics import read_jsonl
from tests.helpers import run_main


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  root = tmp_path_factory.mktemp("imagefolder")
  make_imagefolder(str(root), classes=4, per_class=12, val_per_class=4, seed=0)
  # One unreadable and one truncated JPEG among the training images.
  cls = sorted(os.listdir(root / "train"))[0]
  (root / "train" / cls / "zz_garbage.jpg").write_bytes(b"not a jpeg at all")
  good = sorted((root / "train" / cls).glob("*.jpg"))[0].read_bytes()
  (root / "train" / cls / "zz_truncated.jpg").write_bytes(good[: len(good) // 3])
  return root


TINY = ("model.name=resnet_tiny", "batch_size=16", "data.workers=0", "precision=fp32",
        "log_every_steps=4", "eval_every_steps=0", "checkpoint_every_steps=8", "data.eval_split=val")


def test_fast_recipe_trains_evaluates_checkpoints_and_counts_corrupt_jpegs(folder, tmp_path):
  proc = run_main(tmp_path, f"data.dir={folder}", "data.source=imagefolder", *TINY,
                  "total_steps=24", "image_size=32", "progressive_resizing=((0.0, 24), (0.5, 32))",
                  "optim.learning_rate=2.0", config="configs/resnet50.py:fast")
  records = read_jsonl(tmp_path)
  train = [r for r in records if "train/loss" in r]
  assert train[-1]["train/loss"] < train[0]["train/loss"]
  final = [r for r in records if "eval/top1" in r][-1]
  assert final["eval/examples"] == 16                   # every val image once
  assert "training resolution is now 32px" in proc.stdout
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["16", "24", "8"]
  # 50 training files, 2 unreadable; 24 steps x 16 = 384 images ~ 7.7 epochs.
  corrupt = sum(r["data/corrupt_images"] for r in train)
  assert 10 <= corrupt <= 18, corrupt
  assert "corrupt" in proc.stderr.lower() or "skipp" in proc.stderr.lower()


def test_standard_recipe_runs_on_the_folder(folder, tmp_path):
  run_main(tmp_path, f"data.dir={folder}", "data.source=imagefolder", *TINY, "total_steps=8",
           "image_size=32", config="configs/resnet50.py")
  final = [r for r in read_jsonl(tmp_path) if "eval/top1" in r][-1]
  assert final["step"] == 8 and np.isfinite(final["eval/loss"])


@pytest.mark.parametrize("source", ["imagefolder", "tfds"])
def test_missing_dataset_is_one_clear_message(tmp_path, source):
  missing = tmp_path / "no-such-dir"
  proc = run_main(tmp_path / "w", f"data.dir={missing}", f"data.source={source}", *TINY,
                  "total_steps=2", config="configs/resnet50.py", check=False)
  assert proc.returncode != 0
  assert str(missing) in proc.stderr
  assert "Traceback" not in proc.stderr
