"""ImageFolderSource, the synthetic folder maker, and corrupt-file handling."""

import logging
import os
import pickle
import shutil

import grain.python as grain
import numpy as np
import pytest
import simplejpeg

from jaxnet.core.data.imagefolder import ImageFolderSource
from jaxnet.cli.make_imagefolder import main as make_imagefolder_main
from jaxnet.tools.make_imagefolder import make_imagefolder
from jaxnet.core.data.transforms import EvalDecodeCrop, TrainDecodeCrop

CLASSES, PER_CLASS, VAL_PER_CLASS = 4, 5, 2


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("folder"))
  make_imagefolder(root, CLASSES, PER_CLASS, VAL_PER_CLASS, seed=0, verbose=False)
  return root


def test_source_lengths_labels_and_classes(folder):
  train, val = ImageFolderSource(folder, "train"), ImageFolderSource(folder, "val")
  assert len(train) == CLASSES * PER_CLASS and len(val) == CLASSES * VAL_PER_CLASS
  assert train.num_classes == val.num_classes == CLASSES
  assert train.class_names == [f"class_{k:03d}" for k in range(CLASSES)]
  assert train.encoded is True
  labels = [train[i]["label"] for i in range(len(train))]
  assert labels == sorted(labels) == [k for k in range(CLASSES) for _ in range(PER_CLASS)]
  record = val[len(val) - 1]
  assert record["label"] == CLASSES - 1
  assert isinstance(record["image"], bytes) and record["image"][:2] == b"\xff\xd8"
  assert os.path.basename(val.path(0)) == "val_000_00000.jpg"  # sorted order


def test_generated_images_have_imagenet_like_sizes(folder):
  source = ImageFolderSource(folder, "train")
  headers = [simplejpeg.decode_jpeg_header(source[i]["image"]) for i in range(len(source))]
  # Chroma subsampled 2x2 like camera and web JPEGs (ImageNet's): it sets the decode cost.
  assert {subsampling for _, _, _, subsampling in headers} == {"420"}
  shapes = [header[:2] for header in headers]
  for height, width in shapes:
    long_side, short_side = max(height, width), min(height, width)
    assert 300 <= short_side <= 600 and 400 <= long_side <= 600
  assert len(set(shapes)) > len(shapes) // 2  # varied, not one size
  assert any(h > w for h, w in shapes) and any(w > h for h, w in shapes)


def test_generation_is_deterministic(folder, tmp_path):
  make_imagefolder(str(tmp_path), CLASSES, PER_CLASS, VAL_PER_CLASS, seed=0, verbose=False)
  ours, again = ImageFolderSource(folder, "val"), ImageFolderSource(str(tmp_path), "val")
  assert all(ours[i]["image"] == again[i]["image"] for i in range(len(ours)))


def test_classes_are_separable_by_a_trivial_classifier(folder):
  """Nearest class-mean colour of eval crops already beats chance by far,
  so a small CNN has a learnable signal."""
  op = EvalDecodeCrop(32)

  def features(source):
    out = [op.map(source[i]) for i in range(len(source))]
    return (np.array([o["image"].reshape(-1, 3).mean(0) for o in out]),
            np.array([o["label"] for o in out]))

  train_x, train_y = features(ImageFolderSource(folder, "train"))
  val_x, val_y = features(ImageFolderSource(folder, "val"))
  means = np.stack([train_x[train_y == k].mean(0) for k in range(CLASSES)])
  predicted = np.argmin(((val_x[:, None] - means[None]) ** 2).sum(-1), axis=1)
  assert (predicted == val_y).mean() >= 0.75  # chance is 0.25


def test_cli_writes_requested_counts(tmp_path, capsys):
  make_imagefolder_main([str(tmp_path), "--classes", "2", "--per-class", "3",
                         "--val-per-class", "1", "--seed", "5"])
  assert "2/2" in capsys.readouterr().out  # progress printed
  assert len(ImageFolderSource(str(tmp_path), "train")) == 6
  assert len(ImageFolderSource(str(tmp_path), "val")) == 2


def test_val_labels_follow_train_classes_and_ignore_other_files(tmp_path):
  jpeg = simplejpeg.encode_jpeg(np.zeros((8, 8, 3), np.uint8))
  for split, classes in (("train", "abc"), ("val", "bc")):
    for name in classes:
      os.makedirs(tmp_path / split / name)
      (tmp_path / split / name / "x.JPEG").write_bytes(jpeg)
  (tmp_path / "val" / "c" / "notes.txt").write_text("not an image")
  val = ImageFolderSource(str(tmp_path), "val")
  assert val.class_names == ["a", "b", "c"]
  assert [val[i]["label"] for i in range(len(val))] == [1, 2]


def test_source_pickles_for_grain_workers(folder):
  source = ImageFolderSource(folder, "train")
  clone = pickle.loads(pickle.dumps(source))
  assert len(clone) == len(source) and clone[3] == source[3]


def test_grain_loader_batches_static_shapes(folder):
  source = ImageFolderSource(folder, "train")
  loader = grain.DataLoader(
      data_source=source,
      sampler=grain.IndexSampler(len(source), shuffle=True, num_epochs=1, seed=0),
      operations=[TrainDecodeCrop(32), grain.Batch(8, drop_remainder=True)],
      worker_count=0)
  batches = list(loader)
  assert len(batches) == len(source) // 8
  batch = batches[0]
  assert batch["image"].shape == (8, 32, 32, 3) and batch["image"].dtype == np.uint8
  assert batch["label"].dtype == np.int32 and batch["mask"].all()
  seen = np.concatenate([b["label"] for b in batches])
  assert set(seen) <= set(range(CLASSES)) and len(seen) == 16


@pytest.fixture
def folder_with_corrupt_files(folder, tmp_path):
  root = tmp_path / "corrupt"
  shutil.copytree(folder, root)
  good = (root / "train" / "class_001" / "train_001_00000.jpg").read_bytes()
  # Sorted names put these first in class_001 (labels 1).
  (root / "train" / "class_001" / "a_truncated.jpg").write_bytes(good[: len(good) // 3])
  (root / "train" / "class_001" / "b_garbage.jpg").write_bytes(
      np.random.default_rng(0).bytes(4096))
  return str(root)


@pytest.mark.parametrize("op", [TrainDecodeCrop(48), EvalDecodeCrop(48)],
                         ids=["train", "eval"])
def test_corrupt_files_are_masked_not_raised(folder_with_corrupt_files, op, caplog):
  source = ImageFolderSource(folder_with_corrupt_files, "train")
  assert len(source) == CLASSES * PER_CLASS + 2
  rng = np.random.default_rng(0)
  with caplog.at_level(logging.WARNING):
    outputs = [op.random_map(source[i], rng) if isinstance(op, TrainDecodeCrop)
               else op.map(source[i]) for i in range(len(source))]
  corrupt = [i for i, out in enumerate(outputs) if out["corrupt"] == 1]
  assert [os.path.basename(source.path(i)) for i in corrupt] == [
      "a_truncated.jpg", "b_garbage.jpg"]
  for i, out in enumerate(outputs):
    assert out["image"].shape == (48, 48, 3) and out["image"].dtype == np.uint8
    assert out["label"] == source[i]["label"]
    if i in corrupt:
      assert not out["mask"] and not out["image"].any()
    else:
      assert out["mask"] and out["corrupt"] == 0 and out["image"].any()
  # One warning per file, naming it, through jaxnet's logger (not the root logger).
  warnings = [r for r in caplog.records if "unreadable" in r.getMessage()]
  assert [r.name for r in warnings] == ["jaxnet", "jaxnet"]
  assert [source.path(i) in r.getMessage() for i, r in zip(corrupt, warnings)] == [True, True]


def test_missing_root_names_the_path_and_the_fix(tmp_path):
  missing = str(tmp_path / "nowhere")
  with pytest.raises(FileNotFoundError) as err:
    ImageFolderSource(missing, "train")
  message = str(err.value)
  assert missing in message
  assert "python -m jaxnet.cli.make_imagefolder" in message
  assert "<root>/train/<class>/*.jpg" in message


def test_missing_split_names_the_split_dir(folder):
  with pytest.raises(FileNotFoundError) as err:
    ImageFolderSource(folder, "test")
  assert os.path.join(folder, "test") in str(err.value)


def test_the_default_eval_split_reads_make_imagefolders_val(folder):
  # make_imagefolder writes val/; the configs' default eval split is tfds's "validation".
  from jaxnet.core import config as config_lib
  from jaxnet.core import tasks
  config = config_lib.base_config()
  assert config.data.eval_split == "validation" and not os.path.exists(os.path.join(folder, "validation"))
  config.data.source, config.data.dir = "imagefolder", folder
  source = tasks.get("classification").make_source(config, "eval")
  assert len(source) == CLASSES * VAL_PER_CLASS
  assert source.path(0) == ImageFolderSource(folder, "val").path(0)


def test_a_missing_eval_split_names_the_key_that_picks_the_folder(folder, tmp_path):
  root = tmp_path / "root"
  shutil.copytree(os.path.join(folder, "train"), root / "train")
  shutil.copytree(os.path.join(folder, "val"), root / "holdout")
  with pytest.raises(FileNotFoundError) as err:
    ImageFolderSource(str(root), "validation")
  message = str(err.value)
  assert f"{root} has no split folder 'validation' or 'val' (its folders: holdout, train)" in message
  assert "--config.data.eval_split=FOLDER, e.g. --config.data.eval_split=holdout." in message
  assert len(ImageFolderSource(str(root), "holdout")) == CLASSES * VAL_PER_CLASS  # the fix works
