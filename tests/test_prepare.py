"""`jaxnet prepare` and data.source=prepared (jaxnet/core/data/prepared.py, jaxnet/cli/prepare.py):
bounded images (re-encoded JPEGs, raw pixels) in ArrayRecord shards, resumable, unreadable images listed."""

import errno
import json
import os

import numpy as np
import pytest
import simplejpeg

from jaxnet.cli import console
from jaxnet.core.data import decode, pipeline, prepared
from jaxnet.core.data.imagefolder import ImageFolderSource
from jaxnet.core.data.transforms import flip_left_right

CLASSES, PER_CLASS = 3, 6


def _tiny_folder(root, sizes=((48, 80), (40, 30))):
  """CLASSES classes of PER_CLASS train and 2 val JPEGs, alternating between `sizes` (h, w)."""
  rng = np.random.default_rng(0)
  for split, count in (("train", PER_CLASS), ("val", 2)):
    for k in range(CLASSES):
      os.makedirs(os.path.join(root, split, f"c{k}"))
      for i in range(count):
        h, w = sizes[i % len(sizes)]
        pixels = np.clip(rng.normal(60 * k + 40, 20, (h, w, 3)), 0, 255).astype(np.uint8)
        with open(os.path.join(root, split, f"c{k}", f"{i}.jpg"), "wb") as f:
          f.write(simplejpeg.encode_jpeg(pixels, quality=95))
  return str(root)


@pytest.fixture
def folder(tmp_path):
  return _tiny_folder(tmp_path / "src")


def _prepare(folder, out, *extra):
  """JPEG records only, unless `extra` gives --raw-fraction."""
  return console.main(["prepare", "--dir", folder, "--out", str(out), "--short-side", "32",
                       "--shard-images", "5", "--workers", "0", "--raw-fraction", "0", *extra])


def test_shards_hold_every_image_bounded_with_its_label(folder, tmp_path, capsys):
  assert _prepare(folder, tmp_path / "out") == 0
  assert "done: train with --config.data.source=prepared" in capsys.readouterr().out
  original = ImageFolderSource(folder, "train")
  source = prepared.PreparedSource(str(tmp_path / "out"), "train")
  assert len(source) == len(original) == CLASSES * PER_CLASS
  assert source.class_names == original.class_names and source.num_classes == CLASSES
  for i in range(len(source)):
    record, before = source[i], original[i]
    assert record["label"] == before["label"]
    height, width = decode.jpeg_size(record["image"])
    old_h, old_w = decode.jpeg_size(before["image"])
    if min(old_h, old_w) > 32:  # shrunk to a shorter side of 32, the aspect kept
      assert min(height, width) == 32 and abs(width / height - old_w / old_h) < 0.05
    else:  # already within the bound: the very same bytes
      assert record["image"] == before["image"]
  # 18 images in shards of <= 5 records: 4 shards. The eval split keeps sizes by default.
  assert len(os.listdir(tmp_path / "out" / "train")) == 1 + 2 * 4
  val = prepared.PreparedSource(str(tmp_path / "out"), "validation")  # the alias finds val
  assert [val[i]["image"] for i in range(len(val))] == [ImageFolderSource(folder, "val")[i]["image"]
                                                        for i in range(len(val))]
  # Its own identity, linked to the source's.
  identity = source.identity()
  assert identity["source"] == "prepared" and identity["prepared_from"] == original.identity()
  assert identity["options"]["short_side"] == 32 and len(identity["shards_sha256"]) == 64


def test_a_killed_prepare_resumes_redoing_only_the_half_written_shard(folder, tmp_path, capsys):
  out = tmp_path / "out"
  assert _prepare(folder, out) == 0
  split = out / "train"
  files = sorted(p for p in os.listdir(split) if p.endswith(".array_record"))
  mtimes = {f: os.stat(split / f).st_mtime_ns for f in files}
  # A kill while shard 2 was written: its data half there (a .tmp), no done-record.
  os.remove(split / files[2].replace(".array_record", ".json"))
  with open(split / (files[2] + ".tmp"), "wb") as f:
    f.write(b"half")
  digest = json.loads((out / "prepared.json").read_text())["splits"]["train"]["shards_sha256"]
  capsys.readouterr()
  assert _prepare(folder, out, "--splits", "train") == 0
  assert "resuming, 14 of 18 images already in finished shards" in capsys.readouterr().out
  assert {f: os.stat(split / f).st_mtime_ns for f in files if f != files[2]} == \
         {f: t for f, t in mtimes.items() if f != files[2]}  # finished shards never rewritten
  assert not os.path.exists(split / (files[2] + ".tmp"))
  assert json.loads((out / "prepared.json").read_text())["splits"]["train"]["shards_sha256"] == digest


def test_other_options_into_the_same_out_are_refused(folder, tmp_path, capsys):
  assert _prepare(folder, tmp_path / "out", "--splits", "train") == 0
  assert console.main(["prepare", "--dir", folder, "--out", str(tmp_path / "out"), "--splits", "train",
                       "--short-side", "48", "--shard-images", "5", "--workers", "0"]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "differing: options" in err and "another --out" in err


def test_unreadable_images_are_left_out_and_listed_until_the_threshold(folder, tmp_path, capsys):
  bad = os.path.join(folder, "train", "c1", "broken.jpg")
  with open(bad, "wb") as f:
    f.write(b"\xff\xd8 not really a jpeg")
  assert _prepare(folder, tmp_path / "ok", "--splits", "train", "--max-unreadable", "0.1") == 0
  assert "1 unreadable image(s) left out" in capsys.readouterr().out
  source = prepared.PreparedSource(str(tmp_path / "ok"), "train")
  assert len(source) == CLASSES * PER_CLASS
  listed = json.loads((tmp_path / "ok" / "prepared.json").read_text())["splits"]["train"]["unreadable"]
  assert [u["image"] for u in listed] == ["train/c1/broken.jpg"]
  assert source.identity()["unreadable_left_out"] == 1
  # Past the threshold (default 0.001 of 19 images): one line, exit 1.
  assert _prepare(folder, tmp_path / "strict", "--splits", "train") == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "1 images of train cannot be read" in err and "broken.jpg" in err


def test_a_full_disk_is_one_line_and_keeps_the_finished_shards(folder, tmp_path, monkeypatch, capsys):
  real = prepared.write_shard
  calls = []

  def fill_up(source, start, end, path, options):
    calls.append(path)
    if len(calls) == 3:
      raise OSError(errno.ENOSPC, "No space left on device")
    return real(source, start, end, path, options)

  monkeypatch.setattr(prepared, "write_shard", fill_up)
  assert _prepare(folder, tmp_path / "out", "--splits", "train") == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "is full" in err and "after 2 of 4 train shards" in err
  assert "rerun the same command to resume" in err
  assert len([p for p in os.listdir(tmp_path / "out" / "train") if p.endswith(".json")]) == 1 + 2


def test_the_train_loader_reads_prepared_shards(folder, tmp_path):
  assert _prepare(folder, tmp_path / "out", "--splits", "train") == 0
  source = prepared.PreparedSource(str(tmp_path / "out"), "train")
  batch = next(iter(pipeline.train_loader(source, global_batch_size=4, image_size=24, seed=0, workers=0)))
  assert batch["image"].shape == (4, 24, 24, 3) and batch["mask"].all() and not batch["corrupt"].any()
  assert set(batch["label"]) <= set(range(CLASSES))


def test_raw_records_hold_the_bounded_pixels_and_both_transforms_take_them(folder, tmp_path, capsys):
  """--raw-fraction: that share of the train images as raw pixels (binary PPM records), bounded
  as the JPEGs are; the Grain train and eval transforms read them without decoding, eval exactly
  as from decoded pixels; a cut-short raw record is masked and counted, as a broken JPEG is."""
  from jaxnet.core.data import transforms
  assert _prepare(folder, tmp_path / "out", "--splits", "train", "--raw-fraction", "0.5") == 0
  assert "50% raw pixels" in capsys.readouterr().out
  source = prepared.PreparedSource(str(tmp_path / "out"), "train")
  original = ImageFolderSource(folder, "train")
  raw = [i for i in range(len(source)) if decode.ppm_pixels(source[i]["image"]) is not None]
  assert raw == [i for i in range(len(source)) if prepared.stored_raw(i, 0.5)] and 6 <= len(raw) <= 12
  for i in raw:
    pixels, before = decode.ppm_pixels(source[i]["image"]), decode.decode_full(original[i]["image"])
    assert min(pixels.shape[:2]) == min(32, *before.shape[:2]) and source[i]["label"] == original[i]["label"]
    if min(before.shape[:2]) <= 32:  # within the bound: the decoded pixels themselves
      np.testing.assert_array_equal(pixels, before)
  record = {"image": source[raw[0]]["image"], "label": 1}
  pixels = decode.ppm_pixels(record["image"])
  out = transforms.EvalDecodeCrop(24).map(record)
  np.testing.assert_array_equal(out["image"], transforms.eval_resize_crop(pixels, 24))
  trained = transforms.TrainDecodeCrop(24).random_map(record, np.random.default_rng(0))
  assert trained["image"].shape == (24, 24, 3) and trained["mask"]
  cut = transforms.TrainDecodeCrop(24).random_map({"image": record["image"][:-5], "label": 1},
                                                  np.random.default_rng(0))
  assert not cut["mask"] and cut["corrupt"] == 1
  batch = next(iter(pipeline.train_loader(source, global_batch_size=8, image_size=24, seed=0, workers=0)))
  assert batch["mask"].all() and batch["image"].shape == (8, 24, 24, 3)


def test_missing_shards_say_how_to_make_them(tmp_path):
  with pytest.raises(FileNotFoundError, match="jaxnet prepare --dir SOURCE --out"):
    prepared.PreparedSource(str(tmp_path), "train")


def test_flip_is_the_mirror_image():
  image = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
  flipped = flip_left_right(image)
  assert flipped.flags.c_contiguous and (flipped == image[:, ::-1]).all()


class _Clock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def test_input_watch_warns_when_the_step_waits_on_data_and_not_when_the_device_is_slower(monkeypatch):
  clock = _Clock()
  monkeypatch.setattr(pipeline.time, "perf_counter", clock)
  monkeypatch.setattr(pipeline, "cores_available", lambda: 8)
  watch = pipeline.InputWatch(batch_size=100, workers=7)

  def window(wait_s, sync_s, other_s, steps=10):
    with watch.waiting():
      clock.now += wait_s
    with watch.synced():
      clock.now += sync_s
    clock.now += other_s
    return watch.window(steps)

  assert window(wait_s=0.0, sync_s=0.0, other_s=30.0)[1] == []  # the compile's window: no verdict
  # Device-bound: the host waited a little for data but a lot for the device at the log step.
  metrics, lines = window(wait_s=0.5, sync_s=3.0, other_s=1.5)
  assert metrics["train/data_wait_fraction"] == pytest.approx(0.1)
  assert len(lines) == 1 and lines[0].startswith("input: 200 img/s delivered over 10 steps")
  assert "222 img/s without waiting" in lines[0] and "the input keeps up" in lines[0]
  assert "7 data workers, 8 cores" in lines[0]
  # Input-bound: 80% of the window waiting on data, the device idle at the log step: one warning.
  metrics, lines = window(wait_s=4.0, sync_s=0.01, other_s=0.99)
  assert metrics["train/data_wait_fraction"] == pytest.approx(0.8)
  assert len(lines) == 1 and lines[0].startswith("warning: the step waited on data 80% of the last 10 steps")
  assert "raise data.workers (now 7, 8 cores)" in lines[0]
  assert window(wait_s=4.0, sync_s=0.01, other_s=0.99)[1] == []  # said once while it lasts
  assert window(wait_s=0.0, sync_s=4.0, other_s=1.0)[1] == []
  # The host ran ahead of a slower device and then waited on data, but the device still had
  # 9 steps' work at the sync (0.9 s of 5 s over 50 steps): not the input's fault.
  metrics, lines = window(wait_s=4.0, sync_s=0.9, other_s=0.1, steps=50)
  assert metrics["train/data_wait_fraction"] == pytest.approx(0.8) and lines == []
  # Too few steps to say, or a CPU backend (the step and the input share the cores): no warning.
  assert window(wait_s=4.0, sync_s=0.01, other_s=0.99, steps=9)[1] == []
  watch.warn = False
  assert window(wait_s=0.0, sync_s=4.0, other_s=1.0)[1] == []
  assert window(wait_s=4.0, sync_s=0.01, other_s=0.99)[1] == []


def test_data_workers_minus_one_is_a_worker_per_core_less_one(monkeypatch):
  monkeypatch.setattr(pipeline, "cores_available", lambda: 16)
  assert pipeline.worker_count(-1) == 15 and pipeline.worker_count(3) == 3 and pipeline.worker_count(0) == 0
  monkeypatch.setattr(pipeline, "cores_available", lambda: 1)
  assert pipeline.worker_count(-1) == 1


def test_the_fast_recipe_reads_prepared_shards_with_per_gpu_batch_norm_on_every_core():
  from jaxnet.core.config import from_file
  fast = from_file("resnet50:fast")
  assert (fast.data.source, fast.bn_group_size, fast.data.workers, fast.target_accuracy) == \
         ("prepared", 1, -1, 0.759)
  assert fast.progressive_resizing == ((0.0, 160), (0.4, 192), (0.85, 224))


class _RecordsSource:
  """A source of records without file paths, as tfds's is: images named by their index."""

  def __init__(self, images):
    self.images = images

  def __len__(self):
    return len(self.images)

  def __getitem__(self, index):
    return {"image": self.images[index], "label": index % 2}

  def identity(self):
    return {"source": "records", "examples": len(self.images)}


def test_parallel_workers_write_the_same_shards_as_one_process(folder, tmp_path):
  source = ImageFolderSource(folder, "train")
  options = prepared.Options(short_side=32, shard_images=5)
  one = prepared.prepare_split(source, str(tmp_path / "one"), "train", options, report=lambda _: None)
  two = prepared.prepare_split(source, str(tmp_path / "two"), "train", options, workers=2,
                               report=lambda _: None)
  assert one["shards_sha256"] == two["shards_sha256"] and one["examples"] == CLASSES * PER_CLASS


def test_records_without_paths_are_named_by_index_when_unreadable(tmp_path):
  good = simplejpeg.encode_jpeg(np.zeros((40, 48, 3), np.uint8))
  lines = []
  entry = prepared.prepare_split(_RecordsSource([good, b"junk", good]), str(tmp_path), "train",
                                 prepared.Options(short_side=32), max_unreadable=0.5, report=lines.append)
  assert entry["examples"] == 2 and [u["image"] for u in entry["unreadable"]] == ["record 1"]
  assert entry["prepared_from"] == {"source": "records", "examples": 3}
  assert lines and "3/3 images" in lines[-1] and "ETA" in lines[-1]
