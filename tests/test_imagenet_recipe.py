"""The ImageNet recipe (configs/resnet50.py) end to end on a generated JPEG folder."""

import json
import os

import jax
import numpy as np
import pytest

from jaxnet import api

from jaxnet.core import experiment

from jaxnet.core import sharding as parallel

from jaxnet.core import steps
from jaxnet.core.data import pipeline
from jaxnet.core.data.imagefolder import ImageFolderSource
from jaxnet.tools.make_imagefolder import make_imagefolder
from jaxnet.core.metrics import read_jsonl
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


# The recipes shrunk for a CPU by the recipe file itself (configs/resnet.py's runlocal).
FOLDER = ("data.source=imagefolder", "data.eval_split=val")


# `python -m jaxnet.main` that also records, for every train step, the batch's image
# shape and labels (host copies), into the JSON file named by JAXNET_TEST_STEPS.
_RECORD_TRAIN_BATCHES = """
import json, os, sys
import jax
from jaxnet.core import experiment
record = []
build = experiment.Experiment.__init__
def build_and_record(self, *args, **kwargs):
  build(self, *args, **kwargs)
  step = self.train_step
  class Recorded:
    def __call__(self, state, batch):
      record.append({"shape": list(batch["image"].shape),
                   "labels": jax.device_get(batch["label"]).tolist()})  # explicit: allowed by the guard
      return step(state, batch)
    def __getattr__(self, name):
      return getattr(step, name)
  self.train_step = Recorded()
experiment.Experiment.__init__ = build_and_record
sys.argv = ["jaxnet.main"] + sys.argv[1:]
from jaxnet.cli import main
try:
  main.run()
finally:
  with open(os.environ["JAXNET_TEST_STEPS"], "w") as f:
    json.dump(record, f)
"""


def test_fast_recipe_trains_evaluates_checkpoints_and_counts_corrupt_jpegs(folder, tmp_path):
  steps_file = tmp_path / "steps.json"
  proc = run_main(tmp_path, f"data.dir={folder}", *FOLDER, "total_steps=24",
                  "optim.learning_rate=2.0", config="configs/resnet.py:fast,runlocal",
                  python_prefix=("-c", _RECORD_TRAIN_BATCHES), env={"JAXNET_TEST_STEPS": str(steps_file)})
  # Progressive resizing: 12 steps at 24px, then a loader at 32px that continues from
  # the same position of the example stream (the labels are the stream's, in order).
  steps = json.loads(steps_file.read_text())
  assert [s["shape"] for s in steps] == [[16, 24, 24, 3]] * 12 + [[16, 32, 32, 3]] * 12
  stream = iter(pipeline.train_loader(ImageFolderSource(str(folder), "train"), global_batch_size=16,
                                      image_size=8, seed=0, workers=0))
  assert [s["labels"] for s in steps] == [next(stream)["label"].tolist() for _ in range(24)]
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
  run_main(tmp_path, f"data.dir={folder}", *FOLDER, "total_steps=8",
           config="configs/resnet.py:runlocal")
  final = [r for r in read_jsonl(tmp_path) if "eval/top1" in r][-1]
  assert final["step"] == 8 and np.isfinite(final["eval/loss"])


def test_standard_recipe_loss_is_label_smoothed_and_skips_masked_images(folder):
  """The step's loss: cross-entropy against 0.9 one-hot + 0.1 uniform, over the readable images only."""
  config = api.load_config("configs/resnet50.py", **{
      "data.dir": str(folder), "data.source": "imagefolder", "data.eval_split": "val",
      "model.name": "resnet_tiny", "batch_size": 16, "image_size": 16, "mesh.num_devices": 1,
      "data.workers": 0, "precision": "fp32"})  # fp32: the logits below then match the step's to 1e-5
  assert config.label_smoothing == 0.1
  exp = experiment.Experiment(config)
  batch = next(iter(exp.train_loader()))
  batch["mask"] = batch["mask"] & (np.arange(16) % 2 == 0)  # as if every other JPEG were unreadable
  state = exp.init_state()
  variables = {"params": state.params, "batch_stats": state.batch_stats}
  images = steps.normalize(batch["image"], config.data.mean, config.data.std, exp.policy.compute_dtype)
  logits, _ = exp.model.apply(variables, images, train=True, mutable=["batch_stats"])
  log_p = np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float64)))
  # Labels do not change the logits: give the masked examples their least likely class,
  # so that counting them would raise the loss clearly.
  batch["label"] = np.where(batch["mask"], batch["label"], log_p.argmin(-1)).astype(np.int32)
  targets = 0.9 * np.eye(exp.num_classes)[batch["label"]] + 0.1 / exp.num_classes
  per_example = -(targets * log_p).sum(-1)
  _, metrics = exp.train_step(state, parallel.to_global(batch, exp.batch_sharding))
  loss = float(metrics["train/loss"])
  assert loss == pytest.approx(per_example[batch["mask"]].mean(), rel=1e-5)
  assert per_example.mean() > loss * 1.05                                         # masked ones left out
  unsmoothed = -log_p[np.arange(len(log_p)), batch["label"]][batch["mask"]].mean()
  assert loss != pytest.approx(unsmoothed, rel=1e-3)


@pytest.mark.parametrize("source", ["imagefolder", "tfds"])
def test_missing_dataset_is_one_clear_message(tmp_path, source):
  missing = tmp_path / "no-such-dir"
  proc = run_main(tmp_path / "w", f"data.dir={missing}", f"data.source={source}",
                  "total_steps=2", config="configs/resnet.py:runlocal", check=False)
  assert proc.returncode != 0
  assert str(missing) in proc.stderr
  assert "Traceback" not in proc.stderr
