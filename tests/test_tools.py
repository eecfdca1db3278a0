"""report, predict, export and the API's evaluate/restore, on a workdir made by a short CLI run."""

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image

from jaxnet.cli import report as report_command
from jaxnet.cli import export as export_command
from jaxnet import api

from jaxnet.tools import bundle as bundle_lib
from jaxnet.tools import export

from jaxnet.tools import report

from jaxnet.tools import report as runlog
from jaxnet.core import checkpoint as ckpt
from jaxnet.core.data import sources
from jaxnet.core.metrics import read_jsonl
from tests.helpers import REPO, copy_run, max_abs_diff, run_main
from tests.notebooks import kernel_env


@pytest.fixture(scope="module")
def workdir(digits_run):
  """The session's trained digits classifier (tests/conftest.py); tests that write take a copy."""
  return digits_run


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
  assert [r["step"] for r in records if "eval/top1" in r] == [60, 120]
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
  assert report_command.main([str(workdir), str(other), "--out", str(out)]) == 0

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
  assert mine["final_step"] == 120
  assert summary["other"]["best_eval_top1"] == pytest.approx(0.5 * best["eval/top1"])
  final = evals[-1]
  assert (mine["final_eval_top1"], mine["final_eval_step"]) == (final["eval/top1"], 120)
  text = (out / "summary.txt").read_text()
  assert f"final eval top-1 {final['eval/top1']:.4f} at step 120; " in text
  assert f"best eval top-1 {best['eval/top1']:.4f} at step {best['step']}" in text
  assert text in capsys.readouterr().out


def test_report_summary_s_best_skips_evals_whose_metric_is_nan():
  """A nan eval (a segmenter's mean IoU while a class is in neither truth nor predictions:
  torchvision's plain mean) is never the best; every eval nan: no best (n/a), the final kept."""
  records = [{"step": 1, "time": 10.0, "eval/top1": float("nan")}, {"step": 2, "time": 20.0, "eval/top1": 0.3},
             {"step": 3, "time": 30.0, "eval/top1": float("nan")}, {"step": 4, "time": 40.0, "eval/top1": 0.2}]
  s = report.summary(records)
  assert (s["best_eval_top1"], s["best_eval_step"], s["time_to_best_sec"]) == (0.3, 2, 20.0)
  assert (s["final_eval_top1"], s["final_eval_step"]) == (0.2, 4)
  s = report.summary([{**r, "eval/top1": float("nan")} for r in records])
  assert s["best_eval_top1"] is None and s["best_eval_step"] is None and np.isnan(s["final_eval_top1"])
  assert "best eval top-1 n/a at step n/a" in report.format_summary("run", s)


def test_report_draws_the_run_s_own_learning_rate_schedule(workdir, tmp_path):
  """The schedule from the run's config.json and length: each logged learning rate (the mean
  over its log interval) is the mean of the schedule's values over those steps."""
  schedule = report.learning_rate_schedule(str(workdir))
  assert list(schedule.steps) == list(range(1, 121))
  by_step = dict(zip(schedule.steps, schedule.values))
  logged = [r for r in read_jsonl(workdir) if "train/learning_rate" in r]
  assert len(logged) == 24
  for r in logged:
    window = [by_step[s] for s in range(r["step"] - 4, r["step"] + 1)]
    assert float(np.mean(window)) == pytest.approx(r["train/learning_rate"], rel=1e-5), r["step"]
  warmup = 1438 // 64  # the digits recipe's one warmup epoch, in this run's steps
  assert np.argmax(schedule.values) + 1 == warmup + 1 and schedule.values[0] == 0.0
  assert report.learning_rate_schedule(str(tmp_path)) is None  # no run there: the logged values only


def test_report_command_line(workdir, tmp_path, capsys):
  # In this process (`python -m jaxnet.cli.report` is this main; a Python start costs seconds).
  assert report_command.main([str(workdir), "--out", str(tmp_path)]) == 0
  assert sorted(p for p in os.listdir(tmp_path) if p.endswith(".png")) == [
      "accuracy.png", "learning_rate.png", "loss.png", "throughput.png"]
  assert "best eval top-1" in capsys.readouterr().out


def test_environment_json_records_versions_devices_and_revision(workdir):
  import flax
  import optax
  env = json.load(open(workdir / "environment.json"))
  assert (env["jax"], env["flax"], env["optax"]) == (jax.__version__, flax.__version__, optax.__version__)
  assert env["python"] == platform.python_version()
  # The run had one CPU device (kernel_env), the first of this process's eight.
  assert env["platform"] == "cpu" and env["process_count"] == 1
  assert env["devices"] == [str(jax.devices()[0])] and env["device_kind"] == jax.devices()[0].device_kind
  git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
  revision = git.stdout.strip() if git.returncode == 0 else ""
  assert env["git_revision"] == revision and len(revision) in (0, 40)


def test_evaluate_and_restore_agree_with_training_eval(workdir, test_set, tmp_path):
  final = _final_eval(workdir)
  again = api.evaluate(str(copy_run(workdir, tmp_path)))  # the config comes from config.json
  assert again["eval/top1"] == pytest.approx(final["eval/top1"], abs=1e-9)
  images, labels = test_set
  model = api.restore(str(workdir))
  assert model.step == 120 and model.image_shape == (16, 16, 1)
  logits = model.logits(images)
  accuracy = float(np.mean(logits.argmax(-1) == labels))
  assert accuracy == pytest.approx(final["eval/top1"], abs=1e-9)
  # eval/top5 counts the label among the five largest logits.
  top5 = np.argsort(-logits, axis=-1)[:, :5]
  assert final["eval/top5"] == pytest.approx(float(np.mean(np.any(top5 == labels[:, None], -1))), abs=1e-9)
  assert final["eval/top5"] > final["eval/top1"]


def test_an_eval_goes_through_the_workdirs_gate(workdir, tmp_path):
  """The gate (jaxnet.core.workdir.Workdir) holds an eval to what the run measured: another
  image_size is refused, naming it, and writes nothing; an eval of a workdir a training run holds
  (its lock taken) gives its numbers but records nothing."""
  from jaxnet.core import workdir as workdir_lib
  workdir = copy_run(workdir, tmp_path)
  record = open(workdir / "metrics.jsonl").read()
  other = api.with_overrides(api.load_config(str(workdir)), image_size=8)
  with pytest.raises(workdir_lib.ConfigChangedError, match="image_size"):
    api.evaluate(str(workdir), other)
  with workdir_lib.Lock(str(workdir)):  # as a training run holds it
    again = api.evaluate(str(workdir))
  assert again["eval/top1"] == _final_eval(workdir)["eval/top1"]
  assert open(workdir / "metrics.jsonl").read() == record
  assert not (workdir / workdir_lib.EVALS_WITH_CHANGES_FILE).exists()


def test_restore_uses_the_ema_params_the_run_kept(workdir, test_set):
  images, _ = test_set
  tree, step = ckpt.load_arrays(workdir)
  model = api.restore(str(workdir))
  assert model.config.ema_decay > 0 and step == model.step
  params = jax.device_get(model.variables["params"])
  assert max_abs_diff(params, tree["ema_params"]) == 0
  assert max_abs_diff(params, tree["params"]) > 1e-4    # the EMA lags the live params
  live = model.predict_fn({"params": tree["params"], "batch_stats": tree["batch_stats"]}, images[:16])
  assert np.max(np.abs(model.logits(images[:16]) - np.asarray(live))) > 1e-3


def test_prediction_resizes_array_source_images_to_image_size(workdir, test_set):
  """Digits are stored upsampled (bilinear) from 8x8 to image_size; prediction resizes any image so."""
  from sklearn.datasets import load_digits
  raw = (load_digits().images * (255.0 / 16.0)).round().astype(np.uint8)  # all 1,797, 8x8
  model = api.restore(str(workdir))
  batch = model.preprocess(list(raw))
  assert batch.shape == (len(raw), 16, 16, 1) and batch.dtype == np.uint8
  # Every test image eval saw is one of these: prediction sees digits as eval did.
  predicted = {x.tobytes() for x in batch}
  assert all(x.tobytes() in predicted for x in test_set[0])
  big = np.kron(raw[0], np.ones((5, 5), np.uint8))  # 40x40
  want = np.asarray(Image.fromarray(big).resize((16, 16), Image.BILINEAR))
  np.testing.assert_array_equal(model.preprocess([big])[0, ..., 0], want)


def test_predict_command_on_a_png(workdir, test_set, tmp_path, capsys):
  """`predict --step=60 --top=3`: the earlier checkpoint's top 3, as restore(step=60) predicts them."""
  images, labels = test_set
  early = api.restore(str(workdir), step=60)
  assert early.step == 60
  right = np.flatnonzero(early.logits(images).argmax(-1) == labels)
  # Two images the step-60 model gets right in eval, of different classes.
  first = right[0]
  second = next(i for i in right if labels[i] != labels[first])
  paths = []
  for i in (first, second):
    paths.append(str(tmp_path / f"digit{i}.png"))
    Image.fromarray(images[i][..., 0]).save(paths[-1])

  # The command in this process (`python -m jaxnet.cli.predict` is its main; a Python start costs seconds).
  from jaxnet.cli import predict
  capsys.readouterr()
  assert predict.main([f"--workdir={workdir}", "--step=60", "--top=3", *paths]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 8 and lines[0] == paths[0] and lines[4] == paths[1]
  for block, i, want in zip((lines[1:4], lines[5:8]), (first, second), early.predict(paths, top_k=3)):
    probs = [float(line.split()[0]) for line in block]
    names = [line.split()[1] for line in block]
    assert names[0] == str(labels[i])                    # top-1 is the true class
    assert names == [name for name, _ in want]
    np.testing.assert_allclose(probs, [p for _, p in want], atol=1e-4)  # printed to 4 decimals
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0 + 1e-3
  # The latest checkpoint predicts other probabilities: --step chose the checkpoint.
  latest = api.restore(str(workdir)).predict(paths, top_k=3)
  assert max(abs(p - q) for a, b in zip(latest, early.predict(paths, top_k=3))
             for (_, p), (_, q) in zip(a, b)) > 1e-3


def test_predict_over_many_files_names_each_unreadable_one_and_predicts_the_others(workdir, test_set, tmp_path,
                                                                                    capsys):
  """One file that is not an image failed the whole call: now each such file is named, the
  others are predicted, and the exit status is non-zero."""
  from jaxnet.cli import predict as predict_command
  images, _ = test_set
  good = [str(tmp_path / f"digit{i}.png") for i in range(2)]
  for i, path in enumerate(good):
    Image.fromarray(images[i][..., 0]).save(path)
  broken, missing = tmp_path / "broken.png", tmp_path / "missing.png"
  broken.write_bytes(b"not an image")
  assert predict_command.main([f"--workdir={workdir}", "--top=1", good[0], str(broken), good[1], str(missing)]) == 1
  out, err = capsys.readouterr()
  assert [line for line in out.splitlines() if not line.startswith(" ")] == good
  errors = [line for line in err.splitlines() if line.startswith("error:")]
  assert len(errors) == 3 and str(broken) in errors[0] and str(missing) in errors[1], err
  assert errors[2] == "error: 2 of 4 images could not be read (named above); the others are predicted"


def test_predict_draw_of_a_model_that_does_not_draw_is_refused_before_predicting(tmp_path, capsys, monkeypatch):
  """`predict --draw` on a classifier printed every prediction, then refused the drawing: now it
  is one line before anything is predicted, printed or written (tests/data's committed digits
  workdir: no training)."""
  from jaxnet.cli import predict as predict_command
  from jaxnet.tools import predictor
  workdir = tmp_path / "w"
  shutil.copytree(os.path.join(REPO, "tests", "data", "workdir_ab264ba"), workdir)
  image = tmp_path / "digit.png"
  Image.fromarray(np.zeros((16, 16), np.uint8)).save(image)
  predicted = []
  monkeypatch.setattr(predictor.Predictor, "predict", lambda self, images, **o: predicted.append(images) or
                      [[("0", 1.0)] for _ in images])
  monkeypatch.delenv("JAXNET_DEBUG", raising=False)
  for hook in ("excepthook", "unraisablehook"):  # one_line_errors installs filters: put them back
    monkeypatch.setattr(sys, hook, getattr(sys, hook))
  with pytest.raises(SystemExit) as exit_:
    predict_command.main([f"--workdir={workdir}", f"--draw={tmp_path / 'out.png'}", str(image)])
  out, err = capsys.readouterr()
  assert exit_.value.code == 1 and out == "" and predicted == []
  assert err.splitlines()[0] == "error: --draw: a classification model's results are not drawn; leave --draw out"
  assert sorted(os.listdir(tmp_path)) == ["digit.png", "w"]


def test_export_round_trips_logits(workdir, test_set, tmp_path):
  """`export --step=60 --platforms=cpu,cuda`: the step-60 model (its EMA params), lowered for both."""
  images, _ = test_set
  out = tmp_path / "digits.jaxexport"
  assert export_command.main([f"--workdir={workdir}", f"--out={out}", "--step=60", "--platforms=cpu,cuda"]) == 0
  loaded = export.load(str(out))
  assert loaded.image_shape == (16, 16, 1)
  assert str(loaded.exported.in_avals[0].shape[0]) == "b"   # batch-polymorphic
  assert tuple(loaded.exported.platforms) == ("cpu", "cuda")
  assert loaded.class_names == [str(d) for d in range(10)]
  assert loaded.metadata["step"] == 60 and loaded.metadata["platforms"] == ["cpu", "cuda"]
  model = api.restore(str(workdir), step=60)
  for batch in (3, 17):
    want = model.logits(images[:batch])
    got = np.asarray(loaded(images[:batch]))
    assert got.shape == (batch, 10) and got.dtype == np.float32
    assert np.max(np.abs(got - want)) <= 1e-5
  # It is step 60's EMA model: neither step 60's live params nor step 120's model.
  tree60, tree120 = ckpt.load_arrays(workdir, 60)[0], ckpt.load_arrays(workdir, 120)[0]
  exported = np.asarray(loaded(images[:16]))
  for params, stats in ((tree60["params"], tree60["batch_stats"]),
                        (tree120["ema_params"], tree120["batch_stats"])):
    other = np.asarray(model.predict_fn({"params": params, "batch_stats": stats}, images[:16]))
    assert np.max(np.abs(exported - other)) > 1e-3
  with pytest.raises(TypeError, match="uint8"):
    loaded(images[:2].astype(np.float32))


def test_workdir_as_init_weights_and_torchvision_export(workdir, tmp_path):
  """A workdir is an `init.weights` source, directly or through its torchvision export."""
  from flax.traverse_util import flatten_dict
  from jaxnet.tools.weights import pretrained
  from jaxnet.tools.weights.preprocessing import Preprocessing
  restored = flatten_dict(api.restore(str(workdir)).variables)
  shapes = {p: tuple(x.shape) for p, x in restored.items()}
  assert pretrained.preprocessing_of(str(workdir))[0] == Preprocessing((0.2,), (0.35,), 1.0, "bilinear")  # configs/digits.py
  out = str(tmp_path / "digits.safetensors")
  assert export_command.main([f"--workdir={workdir}", "--format=torch", f"--out={out}"]) == 0
  for source in (str(workdir), out):
    values, reason = pretrained.fill(shapes, pretrained.load(source, shapes), keep_head=True)
    assert reason is None and set(values) == set(shapes)
    for path, value in values.items():
      np.testing.assert_array_equal(value, restored[path], err_msg=f"{source}: {path}")
  # The export carries the run's preprocessing: one grey channel, digits' mean/std.
  assert pretrained.preprocessing_of(out)[0] == Preprocessing((0.2,), (0.35,), 1.0, "bilinear")
  with pytest.raises(SystemExit):  # argparse: the torchvision format is a .safetensors file
    export_command.main([f"--workdir={workdir}", "--format=torch", f"--out={tmp_path / 'x.pt'}"])


# --- what made a run, and verify (docs/reproducibility.md) ------------------------------------

def _copy_workdir(workdir, tmp_path):
  import shutil
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns("lock"))
  return copy


def _recorded_code(workdir) -> dict:
  """The code state the run recorded, as provenance.code_state gives it."""
  env = json.loads((workdir / "environment.json").read_text())
  diff_path = workdir / "code.diff"
  return {"jaxnet": env["jaxnet"], "git_revision": env["git_revision"],
          "diff": diff_path.read_text() if diff_path.exists() else ""}


def _edit_json(path, edit):
  content = json.loads(path.read_text())
  edit(content)
  path.write_text(json.dumps(content, indent=2))


def test_the_workdir_records_data_versions_code_and_config_file(workdir):
  from jaxnet.core import provenance
  identity = json.loads((workdir / "data_identity.json").read_text())
  assert set(identity) == {"train", "eval"}
  assert identity["eval"]["generator"] == "sklearn.datasets.load_digits" and identity["eval"]["examples"] == 359
  assert identity == provenance.data_identity({"train": sources.digits_source("train", 16),
                                               "eval": sources.digits_source("test", 16)})
  env = json.loads((workdir / "environment.json").read_text())
  for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "numpy", "tensorstore", "ml_dtypes"):
    assert env["packages"][name] == provenance.package_versions()[name], name
  assert env["device_count"] == 1 and env["jaxnet"] == provenance.code_state()["jaxnet"]
  assert len(env["git_revision"]) in (0, 40)
  # The tree as the fixture's run saw it (it may have been edited since): code.diff where it
  # was dirty, matching its recorded digest.
  diff = _recorded_code(workdir)["diff"]
  assert env["code_diff_sha256"] == (provenance.text_sha256(diff) if diff else "")
  text = (workdir / "config_file.py").read_text()
  assert text.startswith("# jaxnet: the config file this run was started with: configs/digits.py\n")
  assert text.endswith(open(os.path.join(REPO, "jaxnet/configs/digits.py")).read())  # the recipe that path names


def test_changed_data_is_refused_in_one_line_and_an_accepted_eval_is_recorded_apart(workdir, tmp_path, capsys):
  from jaxnet.core import provenance
  copy = _copy_workdir(workdir, tmp_path)
  _edit_json(copy / "data_identity.json", lambda d: d["eval"].update(examples=360))
  _edit_json(copy / "environment.json", lambda d: d["packages"].update(jaxlib="0.0.1"))
  metrics_before = (copy / "metrics.jsonl").read_text()
  for run in (lambda: api.evaluate(str(copy)),
              lambda: api.train(api.load_config(str(copy)), str(copy))):  # a resume, refused before a step
    with pytest.raises(provenance.DataChangedError) as refused:
      run()
    line = str(refused.value)
    assert "\n" not in line and "eval.examples 360 -> 359" in line, line
    assert "--accept_config_changes=data_identity" in line
  capsys.readouterr()
  metrics = api.evaluate(str(copy), accept_config_changes=["data_identity"])
  assert f"warning: jaxlib 0.0.1 made this workdir, this is {provenance.package_versions()['jaxlib']}" \
      in capsys.readouterr().err
  apart = [json.loads(line) for line in open(copy / "evals_with_changes.jsonl")]
  assert apart[-1]["changes"] == {"data_identity.eval.examples": [360, 359]}
  assert apart[-1]["eval/top1"] == metrics["eval/top1"]
  assert (copy / "metrics.jsonl").read_text() == metrics_before  # never over the run's record


def test_an_image_folder_s_identity_changes_with_a_file_and_not_with_a_move(tmp_path):
  import shutil
  from jaxnet.core import provenance
  from jaxnet.core.data.imagefolder import ImageFolderSource
  from jaxnet.tools import make_imagefolder, verify
  root = make_imagefolder.make_imagefolder(str(tmp_path / "f"), classes=2, per_class=3, verbose=False)
  before = ImageFolderSource(root, "train").identity()
  assert before["files"] == 6 and before["classes"] == ["class_000", "class_001"]
  shutil.copytree(root, tmp_path / "moved")
  assert ImageFolderSource(str(tmp_path / "moved"), "train").identity() == before
  extra = os.path.join(root, "train", before["classes"][1], "extra.jpg")
  shutil.copy(ImageFolderSource(root, "train").path(0), extra)
  config = api.load_config("configs/digits.py", **{"data.source": "imagefolder", "data.dir": root,
                                                  "data.eval_split": "val"})
  recorded = {"train": before, "eval": ImageFolderSource(root, "val").identity()}
  rows = {c.what: c for c in verify.data_checks(config, recorded)}
  assert rows["data eval"].holds and not rows["data train"].holds
  assert "train.files 6 -> 7" in rows["data train"].now and "train.listing_sha256" in rows["data train"].now
  with pytest.raises(provenance.DataChangedError, match="train.files 6 -> 7"):
    provenance.check_identity(root, recorded, {"train": ImageFolderSource(root, "train").identity()}, ())
  # Data that is not there (a bundle on another machine): its rows fail, saying why.
  elsewhere = api.with_overrides(config, **{"data.dir": str(tmp_path / "not-here")})
  rows = verify.data_checks(elsewhere, recorded)
  assert [(c.verdict, c.now.split(":")[0]) for c in rows] == [("NOT READ", "cannot read it")] * 2


def test_a_content_exact_identity_sees_new_pixels_at_the_same_size_and_verify_says_its_kind(tmp_path):
  """The listing (paths and sizes) misses new pixels at the same byte size; data.identity=sampled
  (blocks of each file) and content (every byte) see them, a moved copy is still the same data,
  and verify's row says which kind was recorded."""
  import shutil
  from jaxnet.core import provenance
  from jaxnet.core.data.imagefolder import ImageFolderSource
  from jaxnet.tools import make_imagefolder, verify
  root = make_imagefolder.make_imagefolder(str(tmp_path / "f"), classes=2, per_class=3, verbose=False)
  before = {kind: ImageFolderSource(root, "train").identity(kind) for kind in provenance.IDENTITY_KINDS}
  assert [provenance.kind_of(before[k]) for k in provenance.IDENTITY_KINDS] == list(provenance.IDENTITY_KINDS)
  moved = shutil.copytree(root, tmp_path / "moved")
  assert {k: ImageFolderSource(str(moved), "train").identity(k) for k in before} == before
  path = ImageFolderSource(root, "train").path(0)
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0xFF  # other pixels, the same size
  open(path, "wb").write(bytes(data))
  after = {kind: ImageFolderSource(root, "train").identity(kind) for kind in provenance.IDENTITY_KINDS}
  assert after["listing"] == before["listing"]
  assert after["sampled"]["sampled_sha256"] != before["sampled"]["sampled_sha256"]
  assert after["content"]["content_sha256"] != before["content"]["content_sha256"]
  config = api.load_config("configs/digits.py", **{"data.source": "imagefolder", "data.dir": root,
                                                  "data.eval_split": "val"})
  (row,) = verify.data_checks(config, {"train": before["content"]})
  assert not row.holds and "(every byte)" in row.recorded and "train.content_sha256" in row.now
  (row,) = verify.data_checks(config, {"train": before["listing"]})
  assert row.holds and "(paths and sizes)" in row.recorded


def test_verify_holds_and_each_check_fails_when_what_it_guards_changes(workdir, tmp_path, monkeypatch):
  from jaxnet.core import provenance
  from jaxnet.tools import verify
  copy = _copy_workdir(workdir, tmp_path)
  # The code as the run had it: this checkout may have been edited since the fixture ran.
  recorded_code = _recorded_code(workdir)
  monkeypatch.setattr(provenance, "code_state", lambda: recorded_code)
  checks = verify.verify(str(copy), step=120)
  assert verify.all_hold(checks), verify.table(checks)
  rows = {c.what: c for c in checks}
  # The run had one CPU device, this process has eight: evaluated on one, compared to a tolerance.
  assert rows["numbers compared"].now.startswith("to a tolerance")
  assert rows["eval/top1 at step 120"].holds and rows["data train"].holds
  # A tampered metric, a recorded package version that is not the one installed, other data,
  # a tree with uncommitted changes: each is its row's DIFFERS, and only those rows fail.
  records = [json.loads(line) for line in open(copy / "metrics.jsonl")]
  for r in records:
    if r["step"] == 120 and "eval/top1" in r:
      r["eval/top1"] -= 5 / 359  # beyond the tolerance
  (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  _edit_json(copy / "environment.json", lambda d: d["packages"].update(numpy="1.0.0"))
  _edit_json(copy / "data_identity.json", lambda d: d["train"].update(examples=1439))
  monkeypatch.setattr(provenance, "code_state",
                      lambda: {**recorded_code, "diff": recorded_code["diff"] + "+ one more line\n"})
  failed = {c.what for c in verify.verify(str(copy), step=120) if c.holds is False}
  assert failed == {"eval/top1 at step 120", "package numpy", "data train", "uncommitted changes"}, failed


def test_verify_finds_each_record_edited_deleted_or_unreadable_and_names_a_held_workdir(workdir, tmp_path,
                                                                                         monkeypatch):
  """The records that decide what the model is carry the sha256 written with them, config.json
  is compared with each checkpoint's own config, an unreadable record is its row (no traceback),
  a deleted final checkpoint is noticed, and a workdir a training holds is named as held."""
  import shutil
  from jaxnet.core import provenance
  from jaxnet.core import workdir as workdir_lib
  from jaxnet.tools import verify
  copy = _copy_workdir(workdir, tmp_path)
  recorded_code = _recorded_code(workdir)
  monkeypatch.setattr(provenance, "code_state", lambda: recorded_code)
  checks = verify.verify(str(copy), evaluate=False)
  assert verify.all_hold(checks), verify.table(checks)
  assert {"classes.json", "config_file.py", "config.json"} <= {c.what for c in checks if c.holds}
  with workdir_lib.Lock(str(copy)):  # a training's lock: named, not taken (it is held here)
    held = {c.what: c for c in verify.verify(str(copy), evaluate=False)}["workdir"]
  assert held.verdict == "held" and f"PID {os.getpid()}" in held.now
  with open(copy / "config_file.py", "a") as f:
    f.write("config.optim.learning_rate = 1.0\n")
  _edit_json(copy / "classes.json", lambda d: d["class_names"].__setitem__(slice(0, 2), ["1", "0"]))
  _edit_json(copy / "config.json", lambda d: d["optim"].update(learning_rate=d["optim"]["learning_rate"] * 2))
  if (copy / "code.diff").exists():
    os.remove(copy / "code.diff")
  else:
    (copy / "code.diff").write_text("diff --git a/x b/x\n")
  (copy / "environment.json").write_text("{not json")
  (copy / "data_identity.json").write_text("[1, 2")
  shutil.rmtree(copy / "checkpoints" / "120")
  checks = verify.verify(str(copy), evaluate=False)
  failed = {c.what: c for c in checks if c.holds is False}
  assert set(failed) == {"config.json vs checkpoint 60", "environment.json", "data_identity.json",
                         "checkpoint 120"}, verify.table(checks)
  assert "optim.learning_rate" in failed["config.json vs checkpoint 60"].now
  assert failed["environment.json"].recorded.startswith("unreadable") and failed["checkpoint 120"].verdict == "MISSING"
  # The digests and code.diff are checked against environment.json's record: with it back, they fail.
  _edit_json(copy / "config.json", lambda d: d["optim"].update(learning_rate=d["optim"]["learning_rate"] / 2))
  shutil.copy(workdir / "environment.json", copy / "environment.json")
  failed = {c.what for c in verify.verify(str(copy), evaluate=False) if c.holds is False}
  assert failed == {"config_file.py", "classes.json", "code.diff", "data_identity.json", "checkpoint 120"}, failed


def test_retrain_names_the_first_logged_step_whose_loss_differs():
  from jaxnet.tools import verify
  recorded = [{"step": 5, "train/loss": 2.5}, {"step": 10, "train/loss": 2.25, "eval/top1": 0.1}]
  assert verify.first_difference(recorded, [dict(r) for r in recorded], exact=True) is None
  rerun = [{"step": 5, "train/loss": 2.5}, {"step": 10, "train/loss": 2.25 + 1e-9}]
  assert verify.first_difference(recorded, rerun, exact=True) == (10, 2.25, 2.25 + 1e-9)
  assert verify.first_difference(recorded, rerun, exact=False) is None  # other devices: a tolerance
  assert verify.first_difference(recorded, rerun[:1], exact=True) == (10, 2.25, None)


@pytest.mark.slow  # 18 to 50 s on 2 shared cores: compiles and runs the train step again
def test_verify_retrain_reruns_the_first_steps_and_names_the_first_differing_step(workdir, tmp_path):
  from jaxnet.core import provenance
  from jaxnet.tools import verify
  config = api.load_config(str(workdir))
  config, exact = verify.on_the_runs_devices(config, json.loads((workdir / "environment.json").read_text()),
                                             provenance.environment())
  recorded = read_jsonl(workdir)
  checks = verify.retrain_checks(str(workdir), config, recorded, 5, exact, scratch=str(tmp_path / "rerun"))
  # One device of this process's eight, as the run had one: to a tolerance (jax 0.12 differs in
  # the third digit by step 10 and in the fourth at step 5; bit for bit in a process of one device,
  # as the quick start's).
  assert not exact and [c.holds for c in checks] == [True], verify.table(checks)
  assert checks[0].what == "train/loss, steps 1-5 (1 logged)"
  tampered = [dict(r, **({"train/loss": r["train/loss"] * 1.01} if r["step"] == 5 else {})) for r in recorded]
  assert verify.first_difference(tampered, read_jsonl(tmp_path / "rerun"), exact)[0] == 5


def test_verify_command_line_bad_input_is_one_line(tmp_path, capsys):
  from jaxnet.cli import console
  with pytest.raises(SystemExit) as exited:
    console.main(["verify", str(tmp_path)])
  assert exited.value.code != 0
  errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
  assert errors == [f"error: {tmp_path} is not a trained jaxnet workdir (it lacks config.json, environment.json, "
                    f"metrics.jsonl): give the --workdir a training run wrote"], errors


def test_a_bundle_restores_evaluates_and_verifies_as_its_workdir_and_refuses_a_changed_file(workdir, tmp_path,
                                                                                           capsys, monkeypatch):
  from jaxnet.core import provenance
  from jaxnet.tools import bundle, verify
  recorded_code = _recorded_code(workdir)  # this checkout may have been edited since the fixture ran
  monkeypatch.setattr(provenance, "code_state", lambda: recorded_code)
  out = tmp_path / "digits-bundle"
  assert export_command.main([f"--workdir={workdir}", "--format=bundle", f"--out={out}", "--step=120"]) == 0
  assert "bundled step 120" in capsys.readouterr().out
  manifest = json.loads((out / "bundle.json").read_text())
  assert manifest["step"] == 120 and os.listdir(out / "checkpoints") == ["120"]
  umask = os.umask(0o022)
  os.umask(umask)
  assert (out.stat().st_mode & 0o777) == 0o777 & ~umask  # shared as the umask says (not 0700)
  assert not [p for p in os.listdir(tmp_path) if p.startswith(".bundle-")]
  for name in ("config.json", "classes.json", "environment.json", "data_identity.json", "config_file.py",
               "metrics.jsonl", "MODEL_CARD.md"):
    assert name in manifest["files"], name
  assert not any(name.endswith((".pkl", ".pickle")) for name in manifest["files"])
  card = (out / "MODEL_CARD.md").read_text()
  final = _final_eval(workdir)
  assert "resnet_tiny on digits" in card and f"| `eval/top1` | {final['eval/top1']:.6g} |" in card
  assert api.restore(str(out)).step == 120
  checks = verify.verify(str(out))  # it evaluates to its recorded numbers, bit for bit
  assert verify.all_hold(checks) and "bundle files" in {c.what for c in checks}, verify.table(checks)
  assert bundle.check_bundle(str(out)) == manifest  # the eval in verify wrote nothing the bundle holds
  with open(out / "config_file.py", "a") as f:
    f.write("# changed\n")
  with pytest.raises(bundle.BundleError, match=r"config_file.py is not the file the bundle was made with"):
    api.restore(str(out))


def test_a_bundle_is_exactly_its_manifest_and_nothing_writes_into_it(workdir, tmp_path):
  """Another run's checkpoint copied into a bundle was restored, evaluated and verified; with
  bundle.json deleted or its list emptied, edited files passed, and an eval wrote its records
  into the bundle. Now restore, eval, predict (restore) and verify refuse each in one line, and
  training or an import into a bundle is refused."""
  import shutil
  from jaxnet.tools import bundle, verify
  out = tmp_path / "b"
  manifest = bundle.write_bundle(str(workdir), str(out), step=120)
  kept = (out / "bundle.json").read_text()

  def refused(match):
    for attempt in (lambda: api.restore(str(out)), lambda: api.evaluate(str(out)),
                    lambda: verify.verify(str(out), evaluate=False)):
      with pytest.raises(bundle.BundleError, match=match):
        attempt()

  shutil.copytree(workdir / "checkpoints" / "60", out / "checkpoints" / "60")
  refused(r"holds files its bundle.json does not list: checkpoints/60/")
  shutil.rmtree(out / "checkpoints" / "60")
  (out / "metrics.jsonl.extra").write_text("{}")
  refused(r"does not list: metrics.jsonl.extra\. A bundle is exactly its manifest")
  os.remove(out / "metrics.jsonl.extra")
  os.remove(out / "bundle.json")
  refused(r"has a MODEL_CARD.md but no bundle.json")
  (out / "bundle.json").write_text(json.dumps({**manifest, "files": {}}))
  refused(r"is not a bundle's manifest \(its file list is empty\)")
  (out / "bundle.json").write_text(kept)
  assert bundle.check_bundle(str(out)) == manifest
  from jaxnet.core.errors import UserError
  with pytest.raises(UserError, match=r"is a bundle \(it has bundle.json\): nothing is written into a bundle"):
    api.train(api.load_config(str(workdir)), str(out))
  assert bundle.check_bundle(str(out)) == manifest


def test_a_bundle_of_an_eight_device_run_evaluates_to_its_numbers_on_one_device(tmp_path):
  """Another machine: a run trained on 8 (simulated CPU) devices, its bundle opened in a process
  of one device. Restore and the eval there give the recorded numbers, to verify's tolerance
  for another device count, and `verify BUNDLE` says so (a checkpoint read without a model,
  as restore reads it, once failed there: "Topology mismatch")."""
  from tests.notebooks import kernel_env
  from jaxnet.tools import verify
  run = tmp_path / "run"
  run_main(run, "total_steps=16", "log_every_steps=8", "eval_every_steps=16", "checkpoint_every_steps=16")
  assert json.loads((run / "environment.json").read_text())["device_count"] == 8
  recorded = _final_eval(run)
  out = tmp_path / "bundle"
  assert export_command.main([f"--workdir={run}", "--format=bundle", f"--out={out}"]) == 0
  # One process for the three: each Python start and compile costs seconds on a shared machine.
  probe = ("import json, sys, jax, numpy as np\n"
           "from jaxnet import api\n"
           "from jaxnet.tools import verify\n"
           "from jaxnet.core.data import sources\n"
           "test = sources.digits_source('test', 16)\n"
           "model = api.restore(sys.argv[1])\n"
           "top1 = float(np.mean(model.logits(test.images).argmax(-1) == test.labels))\n"
           "metrics = api.evaluate(sys.argv[1])\n"
           "checks = verify.verify(sys.argv[1])\n"
           "print(verify.table(checks))\n"
           "print(json.dumps({'devices': jax.device_count(), 'step': model.step, 'restore_top1': top1,\n"
           "                  'loss': metrics['eval/loss'], 'top1': metrics['eval/top1'],\n"
           "                  'verify': {c.what: c.holds for c in checks}}))\n")
  env = kernel_env(XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", probe, str(out)], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  there = json.loads(proc.stdout.splitlines()[-1])
  assert there["devices"] == 1 and there["step"] == 16
  for key, value in (("loss", there["loss"]), ("top1", there["top1"]), ("top1", there["restore_top1"])):
    assert verify.close_enough(recorded[f"eval/{key}"], value, exact=False), (key, recorded, there)
  # verify holds there, comparing to the tolerance (the code rows aside: this checkout may be
  # edited while the test runs); the evals recorded nothing in the bundle.
  rows = there["verify"]
  for what in ("eval/loss at step 16", "eval/top1 at step 16", "eval/examples at step 16", "data eval",
               "bundle files"):
    assert rows[what] is True, proc.stdout[-3000:]
  assert {what for what, holds in rows.items() if holds is False} <= {"uncommitted changes", "git revision"}
  assert "to a tolerance" in proc.stdout
  assert bundle_lib.check_bundle(str(out)) is not None


def test_only_process_0_computes_the_data_identity_and_its_refusal_stops_every_process(tmp_path, monkeypatch):
  """A multi-process run: process 0 alone computes the identity (it may hash a whole folder)
  and decides; another process refuses when process 0 does, and only then. The processes are
  played here by the gate's `chief` and sharding.any_process (process 0's verdict, gathered)."""
  from jaxnet.core import provenance, sharding
  from jaxnet.core import workdir as workdir_lib

  class Counted:
    calls = 0

    def __init__(self, examples):
      self.examples = examples

    def identity(self):
      Counted.calls += 1
      return {"source": "counted", "examples": self.examples}

  (tmp_path / "data_identity.json").write_text(json.dumps({"eval": {"source": "counted", "examples": 10}}))
  gathered = []

  def gate(chief, process_0_refuses=False):
    g = workdir_lib.Workdir(str(tmp_path), workdir_lib.EVAL)
    g.chief, g.changes = chief, {}
    monkeypatch.setattr(sharding, "any_process", lambda flag: gathered.append(flag) or flag or process_0_refuses)
    return g

  # Process 1: no identity computed, process 0's refusal is its own, in one line naming the fix.
  with pytest.raises(provenance.DataChangedError) as refused:
    gate(chief=False, process_0_refuses=True).check_data({"eval": Counted(11)})
  line = str(refused.value)
  assert "\n" not in line and "process 0" in line and "--accept_config_changes=data_identity" in line, line
  other = gate(chief=False)
  assert other.check_data({"eval": Counted(11)}) == {} and other.data_identity is None
  assert Counted.calls == 0 and gathered == [False, False]
  # Process 0: computes it once, refuses naming the change, and tells the others (True gathered).
  with pytest.raises(provenance.DataChangedError, match="eval.examples 10 -> 11"):
    gate(chief=True).check_data({"eval": Counted(11)})
  assert Counted.calls == 1 and gathered[-1] is True
  chief = gate(chief=True)
  assert chief.check_data({"eval": Counted(10)}) == {} and chief.data_identity == {
      "eval": {"source": "counted", "examples": 10}}
  assert Counted.calls == 2 and gathered[-1] is False


def test_a_resume_keeps_the_previous_start_s_records(workdir, tmp_path):
  """A resume writes its own environment.json, code.diff and config_file.py; the first
  start's are kept in WORKDIR/starts/0/, as they were, and verify reads the current ones."""
  from jaxnet.core import workdir as workdir_lib
  copy = _copy_workdir(workdir, tmp_path)
  first = {name: (copy / name).read_text() for name in workdir_lib.START_RECORDS if (copy / name).exists()}
  assert json.loads(first["environment.json"])["started_at_step"] == 0 and "config_file.py" in first
  config_file = tmp_path / "digits_again.py"  # the same config, from another file
  config_file.write_text(open(os.path.join(REPO, "jaxnet/configs/digits.py")).read() + "# resumed\n")
  run_main(copy, "total_steps=125", "ema_decay=0.9", config=str(config_file), env=kernel_env())
  kept = copy / "starts" / "0"
  assert sorted(os.listdir(copy / "starts")) == ["0"]
  assert {name: (kept / name).read_text() for name in os.listdir(kept)} == first
  now = json.loads((copy / "environment.json").read_text())
  assert (now["started_at_step"], now["total_steps"]) == (120, 125)
  assert (copy / "config_file.py").read_text().endswith("# resumed\n")
  assert not (kept / "config_file.py").read_text().endswith("# resumed\n")
  from jaxnet.tools import verify
  assert verify.open_workdir(str(copy))["environment"]["started_at_step"] == 120  # the current start's
  # A third start at the same step keeps the second's records beside the first's.
  assert workdir_lib.keep_start_records(str(copy)) == str(copy / "starts" / "120")
  assert workdir_lib.keep_start_records(str(copy)) == str(copy / "starts" / "120")  # not twice
  (copy / "environment.json").write_text(first["environment.json"].replace('"python"', '"python" ', 1))
  assert workdir_lib.keep_start_records(str(copy)) == str(copy / "starts" / "0-2")


@pytest.fixture(scope="module")
def run_from_weights(workdir, tmp_path_factory):
  """(workdir, weights file) of a 5-step run started from `init.weights`: the `workdir`
  fixture's params, exported under torchvision's names."""
  folder = tmp_path_factory.mktemp("from_weights")
  weights = folder / "digits.safetensors"
  assert export_command.main([f"--workdir={workdir}", "--format=torch", f"--out={weights}"]) == 0
  run = folder / "finetuned"
  run_main(run, "total_steps=5", "log_every_steps=5", f"init.weights={weights}", env=kernel_env())
  return run, weights


@contextlib.contextmanager
def _put_back(path):
  """The file at `path` as it was after the block, which may change or remove it."""
  kept = path.read_bytes()
  try:
    yield
  finally:
    path.write_bytes(kept)


def _verify_row(out: str, what: str) -> list[str]:
  """The lines of verify's table (its stdout) whose check is `what`."""
  return [line for line in out.splitlines() if line.startswith(what + "  ")]


def test_retrain_of_a_run_from_init_weights_refuses_a_missing_or_other_weights_file(run_from_weights, capsys):
  """init.weights are not in the workdir, yet --retrain reads them again: the run records the
  file's path and sha256 at its start, and verify --retrain refuses in one line, naming the
  file and the fix, when the file is gone or another."""
  from jaxnet.cli import console
  from jaxnet.core import provenance
  from jaxnet.tools.weights import pretrained
  run, weights = run_from_weights
  record = json.loads((run / "init_weights.json").read_text())
  assert record == {"weights": str(weights), "path": str(weights), "sha256": provenance.file_sha256(str(weights))}
  pretrained.check_weights_record(record, str(weights))  # the same file: no refusal

  def refusal():
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
      console.main(["verify", str(run), "--no-eval", "--retrain=5"])
    assert exited.value.code != 0
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "train/loss" not in err, err
    return errors[0]

  with _put_back(weights):
    with open(weights, "ab") as f:
      f.write(b"\0")
    line = refusal()
    assert f"the init weights {weights} are not the file this run started from" in line, line
    assert f"recorded {record['sha256'][:12]}" in line and f"put that file back at {weights}" in line
    os.remove(weights)
    line = refusal()
    assert f"the init weights {weights} this run started from are missing" in line, line
    assert "or verify without --retrain" in line


def test_verify_retrain_of_a_run_from_init_weights_starts_from_them(run_from_weights, workdir, capsys,
                                                                     monkeypatch):
  """--retrain of a run from `init.weights` re-reads them: its losses are the recorded ones,
  which are those of trained weights (below the random init's of the `workdir` fixture, the
  same config), so the rerun did not start from a random init."""
  from jaxnet.cli import console
  from jaxnet.core import provenance
  run, _ = run_from_weights
  recorded_code = _recorded_code(run)  # this checkout may have been edited since the run
  monkeypatch.setattr(provenance, "code_state", lambda: recorded_code)
  loss_at_5 = {w: [r["train/loss"] for r in read_jsonl(w) if r["step"] == 5 and "train/loss" in r][0]
               for w in (run, workdir)}
  assert loss_at_5[run] < loss_at_5[workdir] / 2, loss_at_5
  capsys.readouterr()
  assert console.main(["verify", str(run), "--no-eval", "--retrain=5"]) == 0
  out = capsys.readouterr().out
  rows = _verify_row(out, "train/loss, steps 1-5 (1 logged)")
  assert len(rows) == 1 and rows[0].endswith("  same"), out
  assert _verify_row(out, "init weights")[0].endswith("  same"), out
  assert f"verified: every check of {run} holds" in out


def test_verify_notes_the_init_weights_file_and_only_warns_where_it_changed(run_from_weights, workdir, capsys,
                                                                           monkeypatch):
  """Plain verify shows the `init.weights` file against init_weights.json: the same, another
  (its sha256) or missing. A note, not a failure: the checkpoints re-evaluated do not depend on
  it (only --retrain refuses). A run from random init has no such row."""
  from jaxnet.cli import console
  from jaxnet.core import provenance
  from jaxnet.tools import verify
  run, weights = run_from_weights
  recorded_code = _recorded_code(run)  # this checkout may have been edited since the run
  monkeypatch.setattr(provenance, "code_state", lambda: recorded_code)
  sha = json.loads((run / "init_weights.json").read_text())["sha256"]

  def row():
    capsys.readouterr()
    assert console.main(["verify", str(run), "--no-eval"]) == 0
    out = capsys.readouterr().out
    rows = _verify_row(out, "init weights")
    assert len(rows) == 1, out
    return rows[0].split()

  assert row()[-4:] == [f"{weights},", "sha256", sha[:12], "same"]
  with _put_back(weights):
    with open(weights, "ab") as f:
      f.write(b"\0")
    now = provenance.file_sha256(str(weights))
    assert row()[-6:] == ["sha256", f"{now[:12]}:", "--retrain", "would", "refuse", "differs"]
    os.remove(weights)
    assert row()[-5:] == ["missing:", "--retrain", "would", "refuse", "missing"]
  assert "init weights" not in {c.what for c in verify.verify(str(workdir), evaluate=False)}
  # Nothing to compare: a workdir or hub name (no sha256), a workdir older than the record.
  hub = "hf-hub:timm/resnet50.tv_in1k"
  assert [(c.now, c.holds) for c in verify.init_weights_checks({"weights": hub, "sha256": None}, hub)] == [
      ("not a file: not compared", None)]
  assert [(c.recorded, c.holds) for c in verify.init_weights_checks(None, str(weights))] == [
      ("(not recorded: a workdir older than init_weights.json)", None)]
