"""The DALI loader (config.data.loader="dali", jaxnet/core/data/dali.py), on DALI's CPU
operators: the same examples as the Grain loader, eval batches equal within the decoders'
rounding, train crops drawn from the same distribution, an exact resume, and one line where
DALI is missing or cannot read the source; the same for prepared shards (`jaxnet prepare`, read
through DALI's external_source). Skips, saying so, without NVIDIA DALI (.ci/run installs it on the
newest leg)."""

import math
import os

import numpy as np
import pytest

from jaxnet.core.data.imagefolder import ImageFolderSource
from jaxnet.core.errors import UserError
from tests.helpers import REPO


def _dali():
  try:
    import nvidia.dali  # noqa: F401
  except ImportError:
    pytest.skip("NVIDIA DALI is not installed (pip install -e '.[dali]'); .ci/run installs it on one leg")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  from jaxnet.tools.make_imagefolder import make_imagefolder
  return make_imagefolder(str(tmp_path_factory.mktemp("folder")), classes=3, per_class=8, val_per_class=5,
                          seed=0, verbose=False)


@pytest.fixture(scope="module")
def shards(folder, tmp_path_factory):
  """The folder's train and val splits prepared, half of the train images as raw pixels (PPM
  records) and half JPEG, so both kinds of record go through DALI's decoder."""
  from jaxnet.core.data import prepared
  out = str(tmp_path_factory.mktemp("shards"))
  for split, options in (("train", prepared.Options(short_side=40, raw_fraction=0.5, shard_images=10)),
                         ("val", prepared.Options(short_side=0, shard_images=10))):
    source = ImageFolderSource(folder, split)
    entry = prepared.prepare_split(source, out, split, options, report=lambda _: None)
    prepared.write_manifest(out, {split: entry}, source.class_names, options)
  return out


def _source(kind, folder, shards, split):
  from jaxnet.core.data.prepared import PreparedSource
  return ImageFolderSource(folder, split) if kind == "folder" else PreparedSource(shards, split)


def test_shard_samples_read_every_record_of_the_share_once_per_epoch():
  """The train order of prepared shards under DALI: a permutation of the process's records per
  epoch, a function of (seed, epoch), another each epoch; eval in order, padded with the last."""
  from jaxnet.core.data.dali import ShardSamples
  import pickle
  samples = ShardSamples(["unused"], 10, 17, seed=3)
  epochs = [[samples.index(i) for i in range(e * 7, (e + 1) * 7)] for e in range(3)]
  assert all(sorted(e) == list(range(10, 17)) for e in epochs) and epochs[0] != epochs[1]
  again = pickle.loads(pickle.dumps(samples))  # what a DALI worker gets
  assert [again.index(i) for i in range(7, 14)] == epochs[1]
  assert [ShardSamples(["unused"], 10, 17).index(i) for i in range(9)] == [10, 11, 12, 13, 14, 15, 16, 16, 16]


def test_without_dali_or_with_another_source_it_is_one_line(monkeypatch):
  import builtins
  from jaxnet.core.data import dali
  real_import = builtins.__import__

  def no_dali(name, *args, **kwargs):
    if name.startswith("nvidia.dali"):
      raise ImportError(name)
    return real_import(name, *args, **kwargs)
  monkeypatch.setattr(builtins, "__import__", no_dali)
  with pytest.raises(UserError, match=r"loader=dali needs NVIDIA DALI, which is not installed: pip install"):
    dali.require()
  monkeypatch.undo()
  from jaxnet.core.data.sources import digits_source
  with pytest.raises(UserError, match="reads image folders .* and prepared shards .* not data.source=digits"):
    dali.check_source(digits_source("train"), "digits", 0)


@pytest.mark.parametrize("kind", ["folder", "prepared"])
def test_eval_batches_equal_the_grain_loaders_within_the_decoders_rounding(folder, shards, kind):
  _dali()
  from jaxnet.core.data import dali, pipeline
  source = _source(kind, folder, shards, "val")
  grain_batches = list(pipeline.eval_batches(source, global_batch_size=4, image_size=32))
  dali_batches = list(dali.eval_batches(source, global_batch_size=4, image_size=32))
  assert len(grain_batches) == len(dali_batches) == math.ceil(len(source) / 4)
  worst, mean = 0, []
  for g, d in zip(grain_batches, dali_batches):
    np.testing.assert_array_equal(g["mask"], d["mask"])
    np.testing.assert_array_equal(g["label"][g["mask"]], d["label"][d["mask"]])
    difference = np.abs(g["image"][g["mask"]].astype(int) - d["image"][d["mask"]].astype(int))
    worst, mean = max(worst, int(difference.max())), mean + [difference.mean()]
  print(f"\nDALI vs Grain eval pixels: max difference {worst}, mean {np.mean(mean):.3f} grey levels")
  # Measured: max 1 grey level, mean 0.06 (DALI's and PIL's antialiased filters round apart).
  assert worst <= 2 and np.mean(mean) < 0.2


@pytest.mark.parametrize("kind", ["folder", "prepared"])
def test_train_crops_are_drawn_as_the_grain_loader_draws_them(folder, shards, kind):
  """Area fraction and aspect ratio of DALI's crop windows against the Grain loader's
  random_resized_crop_box, on the same images (two-sample Kolmogorov-Smirnov distances)."""
  _dali()
  from jaxnet.core.data import dali
  from jaxnet.core.data.transforms import random_resized_crop_box
  source = _source(kind, folder, shards, "train")
  loader = dali.TrainLoader(source, global_batch_size=8, image_size=32, seed=0)
  pipe = loader.pipeline(windows=True)
  rng = np.random.default_rng(0)
  a1, r1, a2, r2 = [], [], [], []
  for _ in range(40):
    _, _, shapes, wholes = pipe.run()
    for (h, w), (height, width, _) in zip(np.asarray(shapes.as_tensor())[:, :2], np.asarray(wholes.as_tensor())):
      a1.append(h * w / (height * width))
      r1.append(math.log(w / h))
      _, _, gh, gw = random_resized_crop_box(rng, int(height), int(width))  # Grain's, same image
      a2.append(gh * gw / (height * width))
      r2.append(math.log(gw / gh))
  a1, r1, a2, r2 = map(np.array, (a1, r1, a2, r2))
  ks = lambda x, y: np.max(np.abs(np.searchsorted(np.sort(x), np.sort(np.concatenate([x, y])), "right") / len(x)
                                  - np.searchsorted(np.sort(y), np.sort(np.concatenate([x, y])), "right") / len(y)))
  print(f"\ncrop area fraction: DALI mean {a1.mean():.3f}, Grain {a2.mean():.3f}, KS {ks(a1, a2):.3f}; "
        f"log aspect ratio: DALI {r1.mean():+.3f}, Grain {r2.mean():+.3f}, KS {ks(r1, r2):.3f}")
  assert ks(a1, a2) < 0.12 and ks(r1, r2) < 0.12  # 320 crops each: 0.12 is p ~ 0.02
  # DALI clips a window that does not fit the image where Grain draws again: a few crops fall
  # below the 8% area floor.
  assert np.mean(a1 < 0.08) < 0.05 and a1.max() <= 1.0


def test_dali_on_prepared_shards_resumes_exactly_and_shuffles_each_epoch(shards):
  """The train loader over prepared shards (JPEG and raw records): every record once an epoch,
  with its label, and after set_state(get_state()) the batches an uninterrupted loader gives."""
  _dali()
  from jaxnet.core.data import dali
  from jaxnet.core.data.prepared import PreparedSource
  source = PreparedSource(shards, "train")  # 24 records, batches of 8: 3 an epoch
  loader = dali.TrainLoader(source, global_batch_size=8, image_size=16, seed=0)
  straight = iter(loader)
  batches = [next(straight) for _ in range(3)]
  state = straight.get_state()
  after = [next(straight) for _ in range(2)]
  labels = sorted(np.concatenate([b["label"] for b in batches]).tolist())
  assert labels == sorted(source[i]["label"] for i in range(len(source)))
  assert batches[0]["image"].shape == (8, 16, 16, 3) and batches[0]["image"].dtype == np.uint8
  resumed = iter(loader)
  resumed.set_state(state)
  for a, b in zip(after, [next(resumed) for _ in range(2)]):
    np.testing.assert_array_equal(a["image"], b["image"])
    np.testing.assert_array_equal(a["label"], b["label"])
  straight.close(), resumed.close()


@pytest.mark.parametrize("kind", ["folder", pytest.param("prepared", marks=pytest.mark.slow)])
def test_a_resumed_dali_run_sees_the_batches_an_uninterrupted_one_sees(folder, shards, kind, tmp_path):
  _dali()
  from jaxnet import api
  from jaxnet.core import checkpoint as ckpt
  from jaxnet.core.train import RunControl
  data = {"folder": ("imagefolder", folder), "prepared": ("prepared", shards)}[kind]
  config = lambda: api.load_config(os.path.join(REPO, "configs", "resnet.py:runlocal"), {
      "data.loader": "dali", "data.source": data[0], "data.dir": data[1], "data.eval_split": "val",
      "image_size": 32, "batch_size": 8, "total_steps": 6, "log_every_steps": 3,
      "checkpoint_every_steps": 3, "eval_every_steps": 0})
  api.train(config(), tmp_path / "straight")
  stop = []
  control = RunControl(stop_requested=lambda: bool(stop))
  import jaxnet.core.train as train_lib
  original = train_lib.check_finite_metrics
  calls = []

  def stop_after_3(history, step, *args, **kwargs):
    calls.append(step)
    if step == 3:
      stop.append(True)
    return original(history, step, *args, **kwargs)
  train_lib.check_finite_metrics = stop_after_3
  try:
    assert api.train(config(), tmp_path / "resumed", control=control)["stopped_at_step"] == 3
  finally:
    train_lib.check_finite_metrics = original
  api.train(config(), tmp_path / "resumed")
  a, _ = ckpt.load_arrays(tmp_path / "straight")
  b, _ = ckpt.load_arrays(tmp_path / "resumed")
  import jax
  for x, y in zip(jax.tree.leaves(a["params"]), jax.tree.leaves(b["params"])):
    np.testing.assert_array_equal(x, y)


def test_a_file_dali_cannot_decode_is_one_line_naming_it(tmp_path):
  """DALI's decode error (nvImageCodec's message, 57 lines) names no file; the loaders name
  the first file that is no image. Runs without DALI: a pipeline standing in for DALI's
  raises what DALI raises (RuntimeError) (issue 46)."""
  import simplejpeg
  from PIL import Image
  from jaxnet.core.data import dali
  good = tmp_path / "a.jpg"
  good.write_bytes(simplejpeg.encode_jpeg(np.full((8, 8, 3), 9, np.uint8)))
  png = tmp_path / "b.jpg"  # a PNG named .jpg is an image
  Image.new("RGB", (4, 4)).save(png, format="PNG")
  bad = tmp_path / "c.jpg"
  bad.write_bytes(b"<html>not an image</html>")

  class Pipe:
    def __init__(self, error=None):
      self.error = error

    def run(self):
      if self.error:
        raise self.error
      return "batch"

  files = [str(good), str(png), str(bad)]
  assert dali.run(Pipe(), files) == "batch"
  with pytest.raises(UserError) as e:
    dali.run(Pipe(RuntimeError("nvImageCodec: unsupported format")), files)
  assert str(e.value).startswith(f"data.loader=dali cannot decode {bad} (not an image: ")
  assert str(e.value).endswith("; DALI stops at a file it cannot decode: remove or replace it, or use "
                               "data.loader=grain, which skips, masks and counts unreadable images")
  assert dali.unreadable_file(files[:2]) is None
  assert dali.unreadable_file([str(tmp_path / "gone.jpg")]) == (str(tmp_path / "gone.jpg"), "not found")
  with pytest.raises(RuntimeError, match="out of memory"):  # not a file's fault: DALI's error as it is
    dali.run(Pipe(RuntimeError("out of memory")), files[:2])
