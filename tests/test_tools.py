"""report, predict, export and the API's evaluate/restore, on a workdir made by a short CLI run."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from jaxnet import api, export, report, runlog
from jaxnet.data import sources
from jaxnet.metrics import read_jsonl
from tests.helpers import REPO, run_main
from tests.notebooks import kernel_env


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("short")
  # The quick start shortened to 40 steps in a one-device process, as the notebook
  # tests run it: its train and eval steps compile once for both (persistent cache).
  run_main(workdir, "total_steps=40", "log_every_steps=5", "eval_every_steps=20",
           "checkpoint_every_steps=0", env=kernel_env())
  return workdir


@pytest.fixture(scope="module")
def test_set():
  source = sources.digits_source("test", 16)
  return source.images, source.labels


def _final_eval(workdir):
  return [r for r in read_jsonl(workdir) if "eval/top1" in r][-1]


def test_training_records_wall_time_and_classes(workdir):
  records = read_jsonl(workdir)
  assert all("time" in r for r in records)
  times = [r["time"] for r in records]
  assert times == sorted(times) and times[0] > 0
  assert [r["step"] for r in records if "eval/top1" in r] == [20, 40]
  assert json.load(open(workdir / "classes.json")) == {"num_classes": 10,
                                                      "class_names": [str(d) for d in range(10)]}


def test_report_writes_plots_and_summary(workdir, tmp_path, capsys):
  # A second run to overlay: the same log with every number made worse.
  other = tmp_path / "other"
  other.mkdir()
  with open(other / "metrics.jsonl", "w") as f:
    for r in read_jsonl(workdir):
      f.write(json.dumps({k: (v * 0.5 if isinstance(v, float) and k != "time" else v)
                          for k, v in r.items()}) + "\n")
  out = tmp_path / "report"
  assert report.main([str(workdir), str(other), "--out", str(out)]) == 0

  for name in ("loss", "accuracy", "learning_rate", "throughput"):
    with Image.open(out / f"{name}.png") as png:
      assert png.format == "PNG" and png.size[0] > 500
  assert not (out / "loss_scale.png").exists()          # fp32: no loss scale logged

  records = read_jsonl(workdir)
  evals = [r for r in records if "eval/top1" in r]
  best = max(evals, key=lambda r: r["eval/top1"])
  rates = [r["train/images_per_sec"] for r in records if "train/images_per_sec" in r]
  summary = json.load(open(out / "summary.json"))
  mine = summary[workdir.name]
  assert mine["best_eval_top1"] == best["eval/top1"]
  assert mine["best_eval_step"] == best["step"]
  assert mine["time_to_best_sec"] == best["time"]
  assert mine["median_images_per_sec"] == pytest.approx(float(np.median(rates)), rel=1e-12)
  assert mine["final_step"] == 40
  assert summary["other"]["best_eval_top1"] == pytest.approx(0.5 * best["eval/top1"])
  text = (out / "summary.txt").read_text()
  assert f"best eval top-1 {best['eval/top1']:.4f} at step {best['step']}" in text
  assert text in capsys.readouterr().out


def test_report_command_line(workdir, tmp_path):
  proc = subprocess.run([sys.executable, "-m", "jaxnet.report", str(workdir), "--out", str(tmp_path)],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert sorted(p for p in os.listdir(tmp_path) if p.endswith(".png")) == [
      "accuracy.png", "learning_rate.png", "loss.png", "throughput.png"]
  assert "best eval top-1" in proc.stdout


def test_evaluate_and_restore_agree_with_training_eval(workdir, test_set):
  final = _final_eval(workdir)
  again = api.evaluate(str(workdir))                     # the config comes from config.json
  assert again["eval/top1"] == pytest.approx(final["eval/top1"], abs=1e-9)
  images, labels = test_set
  model = api.restore(str(workdir))
  assert model.step == 40 and model.image_shape == (16, 16, 1)
  accuracy = float(np.mean(model.logits(images).argmax(-1) == labels))
  assert accuracy == pytest.approx(final["eval/top1"], abs=1e-9)


def test_predict_command_on_a_png(workdir, test_set, tmp_path):
  images, labels = test_set
  model = api.restore(str(workdir))
  right = np.flatnonzero(model.logits(images).argmax(-1) == labels)
  # Two images the model gets right in eval, of different classes.
  first = right[0]
  second = next(i for i in right if labels[i] != labels[first])
  paths = []
  for i in (first, second):
    paths.append(str(tmp_path / f"digit{i}.png"))
    Image.fromarray(images[i][..., 0]).save(paths[-1])

  proc = subprocess.run([sys.executable, "-m", "jaxnet.predict", f"--workdir={workdir}", *paths],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert lines[0] == paths[0] and lines[6] == paths[1]
  for block, i in ((lines[1:6], first), (lines[7:12], second)):
    probs = [float(line.split()[0]) for line in block]
    names = [line.split()[1] for line in block]
    assert names[0] == str(labels[i])                    # top-1 is the true class
    assert probs == sorted(probs, reverse=True) and len(set(names)) == 5
    assert 0 < sum(probs) <= 1.0 + 1e-3


def test_export_round_trips_logits(workdir, test_set, tmp_path):
  images, _ = test_set
  out = tmp_path / "digits.jaxexport"
  assert export.main([f"--workdir={workdir}", f"--out={out}"]) == 0
  loaded = export.load(str(out))
  assert loaded.image_shape == (16, 16, 1)
  assert str(loaded.exported.in_avals[0].shape[0]) == "b"   # batch-polymorphic
  assert loaded.class_names == [str(d) for d in range(10)]
  model = api.restore(str(workdir))
  for batch in (3, 17):
    want = model.logits(images[:batch])
    got = np.asarray(loaded(images[:batch]))
    assert got.shape == (batch, 10) and got.dtype == np.float32
    assert np.max(np.abs(got - want)) <= 1e-5
  with pytest.raises(TypeError, match="uint8"):
    loaded(images[:2].astype(np.float32))


def test_workdir_as_init_weights_and_torchvision_export(workdir, tmp_path):
  """A workdir is an `init.weights` source, directly or through its torchvision export."""
  from flax.traverse_util import flatten_dict
  from jaxnet.weights import pretrained
  from jaxnet.weights.preprocessing import Preprocessing
  restored = flatten_dict(api.restore(str(workdir)).variables)
  shapes = {p: tuple(x.shape) for p, x in restored.items()}
  assert pretrained.preprocessing_of(str(workdir))[0] == Preprocessing((0.2,), (0.35,), 0.875, "bilinear")
  out = str(tmp_path / "digits.safetensors")
  assert export.main([f"--workdir={workdir}", "--format=torchvision", f"--out={out}"]) == 0
  for source in (str(workdir), out):
    values, reason = pretrained.fill(shapes, pretrained.load(source), keep_head=True)
    assert reason is None and set(values) == set(shapes)
    for path, value in values.items():
      np.testing.assert_array_equal(value, restored[path], err_msg=f"{source}: {path}")
  # The export carries the run's preprocessing: one grey channel, digits' mean/std.
  assert pretrained.preprocessing_of(out)[0] == Preprocessing((0.2,), (0.35,), 0.875, "bilinear")
  with pytest.raises(SystemExit):  # argparse: the torchvision format is a .safetensors file
    export.main([f"--workdir={workdir}", "--format=torchvision", f"--out={tmp_path / 'x.pt'}"])
