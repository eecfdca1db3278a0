"""Weights in and out (jaxnet/weights): round trip, head re-initialisation, mismatch
reports, files jaxnet refuses, hub specs without network. No torch needed."""

import importlib.util
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
from flax.traverse_util import unflatten_dict
from safetensors.numpy import load_file, save_file

from jaxnet.core import models
from jaxnet.tools.weights import export, hub, pretrained, tensor_files
from jaxnet.tools.weights.preprocessing import Preprocessing
from jaxnet.core.errors import InvalidValueError
from tests import reference_weights
from tests.helpers import REPO
from tests.test_torch_reference import model_shapes, torchvision_shapes


def drawn_file(tmp_path, name="resnet18", num_classes=1000):
  """A torchvision-named .safetensors of seeded weights for `name`; returns (path, tensors, shapes)."""
  shapes = model_shapes(models.create(name, num_classes=num_classes), size=32)
  names = torchvision_shapes(shapes)
  # A complete torchvision state dict has each BN's counter too.
  names.update({n.replace("running_var", "num_batches_tracked"): () for n in names if "running_var" in n})
  _, tensors = reference_weights.draw(names)
  path = str(tmp_path / f"{name}_{num_classes}.safetensors")
  save_file(tensors, path, metadata={"note": "drawn"})
  return path, tensors, shapes


def test_round_trip_gives_identical_tensors(tmp_path):
  path, tensors, shapes = drawn_file(tmp_path)
  values, reason = pretrained.fill(shapes, pretrained.load(path, shapes), keep_head=True)
  assert reason is None
  out = export.torch_tensors(unflatten_dict(values), "resnet18")
  tensor_files.write(str(tmp_path / "out.safetensors"), out, {})
  back = load_file(str(tmp_path / "out.safetensors"))
  assert set(back) == set(tensors) and len(back) == 122  # torchvision resnet18's state dict
  for name, value in tensors.items():
    assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
    np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_head_is_reinitialised_when_classes_differ_or_asked(tmp_path):
  path, tensors, _ = drawn_file(tmp_path, num_classes=1000)
  shapes = model_shapes(models.create("resnet18", num_classes=7), size=32)
  source = pretrained.load(path, shapes)
  values, reason = pretrained.fill(shapes, source, keep_head=True)
  assert reason == "the weights have 1000 classes, this run 7"
  assert set(shapes) - set(values) == {("params", "head", "kernel"), ("params", "head", "bias")}
  np.testing.assert_array_equal(values[("params", "stem_conv", "kernel")],
                                tensors["conv1.weight"].transpose(2, 3, 1, 0))
  same_classes = model_shapes(models.create("resnet18", num_classes=1000), size=32)
  values, reason = pretrained.fill(same_classes, source, keep_head=False)
  assert reason == "init.keep_head=False" and ("params", "head", "bias") not in values


def test_mismatched_architecture_lists_every_problem_in_one_error(tmp_path):
  path, _, _ = drawn_file(tmp_path, "resnet18")
  shapes = model_shapes(models.create("resnet34", num_classes=1000), size=32)
  with pytest.raises(pretrained.WeightsMismatchError) as info:
    pretrained.fill(shapes, pretrained.load(path, shapes), keep_head=True, spec="init.weights=r18")
  message = str(info.value)
  # resnet34 has 3, 4, 6, 3 blocks where resnet18 has 2 of each: 8 more blocks of 2 convs
  # and 2 BNs (4 tensors each), 10 tensors per block.
  assert message.count("missing from the weights") == 80
  assert "missing from the weights: layer3.5.conv2.weight (stage3_block6/Conv_1/kernel) (3, 3, 256, 256)" in message
  assert message.startswith("init.weights=r18 does not fit the model:")
  assert "(80 problems;" in message


def test_unknown_and_misshapen_tensors_are_reported(tmp_path):
  path, tensors, shapes = drawn_file(tmp_path)
  tensors = dict(tensors, **{"layer1.0.se.fc.weight": np.zeros((4, 4), np.float32)})
  tensors["layer2.0.conv1.weight"] = np.zeros((128, 64, 1, 1), np.float32)
  save_file(tensors, path)
  with pytest.raises(pretrained.WeightsMismatchError) as info:
    pretrained.fill(shapes, pretrained.load(path, shapes), keep_head=True)
  message = str(info.value)
  assert "not used by the model: layer1.0.se.fc.weight" in message
  assert ("shape differs: layer2.0.conv1.weight (stage2_block1/Conv_0/kernel) is (1, 1, 64, 128), "
          "the model needs (3, 3, 64, 128)") in message
  assert "(2 problems;" in message


def test_pth_without_torch_suggests_safetensors(tmp_path, monkeypatch):
  path = tmp_path / "resnet50.pth"
  path.write_bytes(b"not read")
  monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails, as where it is not installed
  with pytest.raises(ValueError, match=r"needs torch, which is not installed.*\.safetensors"):
    pretrained.load(str(path), {})


class _StandInTorch:
  """`torch` where it is not installed: its load raises what torch 2.13's does on a file cut short."""
  Tensor = type("Tensor", (), {})

  def __init__(self, error):
    self.error = error

  def load(self, *args, **kwargs):
    raise self.error


@pytest.mark.parametrize("error", [RuntimeError("PytorchStreamReader failed reading zip archive"), EOFError()])
def test_a_truncated_pth_is_one_line_naming_the_file(tmp_path, monkeypatch, error):
  path = tmp_path / "resnet50.pth"
  path.write_bytes(b"PK\x03\x04" + bytes(96))
  monkeypatch.setitem(sys.modules, "torch", _StandInTorch(error))
  with pytest.raises(InvalidValueError) as e:
    tensor_files.read(str(path))
  why = str(error) or "EOFError"
  assert str(e.value) == (
      f"weights file {path} (100 bytes) is not a torch state dict jaxnet can read ({why}): a download "
      f"or copy cut short leaves one unreadable, and jaxnet reads torch files with weights_only=True, "
      f"running none of their code: fetch it again, or save the state dict alone, "
      f"torch.save(model.state_dict(), PATH), or as .safetensors")


def test_a_truncated_or_foreign_pth_with_torch_installed(tmp_path):
  """The same with torch itself (where it is installed; CI's legs have no torch: the stand-in
  test above holds the wrapping there)."""
  torch = pytest.importorskip("torch")
  import pickle
  path = tmp_path / "w.pth"
  torch.save({"fc.weight": torch.ones(100, 10)}, path)
  whole = path.read_bytes()
  foreign = pickle.dumps({"fc.weight": object()})  # code weights_only will not run
  for data in (whole[:len(whole) // 2], b"", b"not a torch file", foreign):
    path.write_bytes(data)
    with pytest.raises(InvalidValueError) as e:
      tensor_files.read(str(path))
    assert str(e.value).startswith(f"weights file {path} ({len(data)} bytes) is not a torch state dict")
    assert len(str(e.value)) < 600


def test_missing_file_and_unknown_format(tmp_path):
  with pytest.raises(FileNotFoundError, match="weights file .* not found"):
    pretrained.load(str(tmp_path / "nope.safetensors"), {})
  (tmp_path / "w.npz").write_bytes(b"")
  with pytest.raises(ValueError, match="unknown weights format"):
    pretrained.load(str(tmp_path / "w.npz"), {})
  with pytest.raises(FileNotFoundError, match="directory without config.json"):
    pretrained.load(str(tmp_path), {})


def test_hub_spec_without_huggingface_hub(monkeypatch):
  monkeypatch.setitem(sys.modules, "huggingface_hub", None)
  with pytest.raises(ValueError, match=r"needs huggingface_hub: pip install 'jaxnet-train\[hub\]'"):
    hub.fetch("hf-hub:timm/resnet18.tv_in1k")
  with pytest.raises(ValueError, match="hf-hub:OWNER/NAME"):
    hub.fetch("hf-hub:resnet18")


def test_hub_spec_offline_fails_with_one_line(tmp_path):
  """The command line, with the hub unreachable: one error line, exit 1, no traceback."""
  env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
  proc = subprocess.run(
      [sys.executable, "-m", "jaxnet.main", "--config=configs/digits.py", f"--workdir={tmp_path / 'w'}",
       "--config.init.weights=hf-hub:timm/resnet18.tv_in1k"],
      cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
  assert proc.returncode == 1
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in proc.stderr
  import importlib.util
  if importlib.util.find_spec("huggingface_hub") is None:  # the optional `hub` extra is missing
    assert "needs huggingface_hub" in errors[0], errors[0]
  else:
    assert errors[0].startswith("error: cannot fetch hf-hub:timm/resnet18.tv_in1k from the Hugging Face Hub")
  assert "set init.weights to its path" in errors[0]


def test_hub_spec_reads_timm_preprocessing(tmp_path, monkeypatch):
  """A stand-in huggingface_hub serves a timm-style repository: weights and config.json."""
  path, _, shapes = drawn_file(tmp_path)
  config = tmp_path / "config.json"
  config.write_text(json.dumps({"architecture": "resnet18", "num_classes": 1000, "pretrained_cfg": {
      "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "crop_pct": 0.95,
      "interpolation": "bicubic", "crop_mode": "center"}}))
  files = {"model.safetensors": path, "config.json": str(config)}
  fake = types.SimpleNamespace(hf_hub_download=lambda repo, name, **kw: files[name])
  monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
  prep, origin = pretrained.preprocessing_of("hf-hub:timm/resnet18.a1_in1k")
  assert prep == Preprocessing((0.5, 0.5, 0.5), (0.25, 0.25, 0.25), 0.95, "bicubic")
  assert origin == "timm's pretrained_cfg of hf-hub:timm/resnet18.a1_in1k"
  assert len(pretrained.load("hf-hub:timm/resnet18.a1_in1k", shapes).variables) == 102


def test_import_writes_a_workdir_that_evaluates_predicts_and_exports_like_the_original(tmp_path):
  """`python -m jaxnet.cli.weights import`: torchvision-named weights into a workdir, no
  training: its eval, predictions and export are the original run's."""
  import os
  from jaxnet import api
  from jaxnet.cli import export as export_command
  from jaxnet.cli import weights as weights_command
  from tests.helpers import REPO
  digits = os.path.join(REPO, "configs", "digits.py")
  trained = tmp_path / "trained"
  api.train(api.load_config(digits, total_steps=30, log_every_steps=30, checkpoint_every_steps=30), trained)
  file = tmp_path / "digits.safetensors"
  assert export_command.main([f"--workdir={trained}", "--format=torch", f"--out={file}"]) == 0
  imported = tmp_path / "imported"
  assert weights_command.main(["import", f"--from={file}", f"--config={digits}", f"--workdir={imported}",
                               "--config.init.preprocessing=config"]) == 0
  original, again = api.evaluate(trained), api.evaluate(imported)
  assert again["eval/top1"] == original["eval/top1"]
  np.testing.assert_allclose(again["eval/loss"], original["eval/loss"], rtol=1e-6)
  images = np.random.default_rng(0).integers(0, 256, (3, 16, 16, 1), np.uint8)
  np.testing.assert_allclose(api.restore(imported).logits(images), api.restore(trained).logits(images),
                             rtol=1e-5, atol=1e-5)
  with pytest.raises(SystemExit):  # a workdir that holds checkpoints is not overwritten
    weights_command.main(["import", f"--from={file}", f"--config={digits}", f"--workdir={imported}"])


# --- issue 46: an import says what it did, and a refused one leaves nothing behind ---

def _weights_command(capsys, argv):
  """`python -m jaxnet.cli.weights ARGV` in this process: (exit status, stdout, stderr)."""
  from jaxnet.cli import weights as weights_command
  try:
    status = weights_command.main(argv)
  except SystemExit as e:
    status = e.code
  out, err = capsys.readouterr()
  return status, out, err


def _import(tmp_path, capsys, weights, workdir, *overrides):
  """`python -m jaxnet.cli.weights import` in this process: (exit status, stdout, stderr)."""
  argv = ["import", f"--from={weights}", "--config=configs/resnet.py:runlocal", f"--workdir={workdir}",
          "--config.model.name=resnet_tiny", "--config.data.source=synthetic", "--config.image_size=16",
          "--config.batch_size=8", *overrides]
  return _weights_command(capsys, argv)


def test_an_import_with_another_class_count_says_how_many_arrays_came_from_the_weights(tmp_path, capsys):
  path, _, _ = drawn_file(tmp_path, "resnet_tiny", num_classes=3)
  workdir = tmp_path / "w"
  workdir.mkdir()  # another run's records, without a checkpoint: not these weights' (issue 57)
  (workdir / "metrics.jsonl").write_text('{"step": 40, "eval/top1": 0.9}\n')
  status, out, _ = _import(tmp_path, capsys, path, workdir, "--config.data.num_classes=5")
  assert status == 0
  assert (workdir / "metrics.jsonl").read_text() == "" and (workdir / "data_identity.json").read_text() == "{}"
  assert (f"imported 45 arrays of {path} into {workdir} (checkpoint of step 0); the class layer's 2 arrays "
          f"of the model's 47 are freshly initialised (the weights have 3 classes, this run 5): its eval "
          f"and predictions are at chance until it is trained") in out
  assert "imported 47" not in out


def test_an_imported_state_is_the_one_a_fine_tune_from_the_weights_starts_from(tmp_path, capsys):
  """The import builds its state without compiling the model's random init: the weights'
  arrays, the class layer they lack from the model's init (only that computed), the rest as a
  fresh state's. Leaf by leaf, it is what a training run from the same weights
  (init.weights) starts from, and a fresh state with the weights put in."""
  import jax
  from flax.traverse_util import flatten_dict
  from jaxnet import api
  from jaxnet.core import checkpoint as ckpt
  from jaxnet.core.experiment import Experiment
  path, tensors, _ = drawn_file(tmp_path, "resnet_tiny", num_classes=3)
  workdir = tmp_path / "w"
  status, out, _ = _import(tmp_path, capsys, path, workdir, "--config.data.num_classes=5",
                           "--config.ema_decay=0.9", "--config.init.preprocessing=config")
  assert status == 0 and "imported 45 arrays" in out
  config = api.load_config(os.path.join(REPO, "configs", "resnet.py:runlocal"), **{
      "model.name": "resnet_tiny", "data.source": "synthetic", "image_size": 16, "batch_size": 8,
      "data.num_classes": 5, "ema_decay": 0.9, "init.weights": path, "init.preprocessing": "config"})
  exp = Experiment(config, need_train_data=False)
  imported, _ = ckpt.Checkpoints(str(workdir), read_only=True).read(0, exp.abstract_state)
  started = exp.init_state(pretrained.initialiser(config, log=lambda line: None))  # what train.py starts from
  fresh = exp.init_state()
  leaves = lambda state: jax.tree_util.tree_flatten_with_path(state)
  (want, want_tree), (got, got_tree) = leaves(started), leaves(imported)
  assert got_tree == want_tree
  for (name, a), (_, b) in zip(want, got):
    assert a.dtype == b.dtype and a.shape == b.shape, name
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=jax.tree_util.keystr(name))
  # ... and that is a fresh state with the weights' arrays put in: the class layer the model's
  # init gives it, the optimizer's zeros, the EMA at the params.
  params = flatten_dict(started.params)
  np.testing.assert_array_equal(params[("stem_conv", "kernel")], tensors["conv1.weight"].transpose(2, 3, 1, 0))
  for leaf in ("kernel", "bias"):
    np.testing.assert_array_equal(params[("head", leaf)], fresh.params["head"][leaf])
  for (name, a), (_, b) in zip(leaves(started.replace(params=fresh.params, ema_params=fresh.params,
                                                      batch_stats=fresh.batch_stats))[0], leaves(fresh)[0]):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(name))
  for a, b in zip(jax.tree.leaves(started.ema_params), jax.tree.leaves(started.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # 45 s: it traces every registered family's shapes to name the file's architecture
def test_an_import_of_another_architecture_is_one_line_naming_both_and_leaves_nothing(tmp_path, capsys):
  path, _, _ = drawn_file(tmp_path, "resnet_tiny", num_classes=3)
  workdir = tmp_path / "w"
  status, out, err = _import(tmp_path, capsys, path, workdir, "--config.model.name=resnet18",
                             "--config.data.num_classes=3")
  assert status == 1 and "Traceback" not in err
  errors = [line for line in err.splitlines() if line.startswith("error:")]
  assert errors == [f"error: {path} holds the weights of a resnet_tiny, not of a resnet18 (config.model.name): "
                    f"101 tensors do not fit, e.g. missing from the weights: layer1.1.bn1.bias "
                    f"(stage1_block2/BatchNorm_0/bias) (64,). Set --config.model.name=resnet_tiny, or "
                    f"import weights of a resnet18"]
  assert not workdir.exists()  # preprocessing.json was written before the failure: removed with it
  workdir.mkdir()
  (workdir / "mine.txt").write_text("kept")
  status, _, _ = _import(tmp_path, capsys, path, workdir, "--config.model.name=resnet18")
  assert status == 1 and os.listdir(workdir) == ["mine.txt"]


# Every family's smallest members, a few ResNets among them (tracing all 42 registered models'
# shapes, the deep ResNets included, takes minutes on 2 cores: the slow test below does).
SMALL_MODELS = ("alexnet_mini", "convnext_mini", "efficientnet_mini", "resnet18", "resnet18_small", "resnet34",
                "resnet_tiny", "retinanet_tiny", "vit_mini")


@pytest.mark.parametrize("registered", [
    pytest.param("small", id="every_family_small"),
    pytest.param("all", id="every_model", marks=pytest.mark.slow)])
def test_weights_of_no_jaxnet_model_say_so_in_one_line(tmp_path, capsys, monkeypatch, registered):
  """A ResNet's file without one of its tensors fits no model: every family is looked at (the
  ResNets traced, the families whose names the file does not use passed over after their first
  member), then one line."""
  if registered == "small":
    monkeypatch.setattr(models, "names", lambda: list(SMALL_MODELS))
  path, tensors, _ = drawn_file(tmp_path, "resnet_tiny", num_classes=3)
  del tensors["layer1.0.conv1.weight"]
  save_file(tensors, path)
  status, _, err = _import(tmp_path, capsys, path, tmp_path / "w", "--config.model.name=resnet18")
  errors = [line for line in err.splitlines() if line.startswith("error:")]
  assert status == 1 and "Traceback" not in err
  assert errors == [f"error: {path} holds weights of no jaxnet model of their names, not of a resnet18 "
                    f"(config.model.name): 100 tensors do not fit, e.g. missing from the weights: "
                    f"layer1.0.conv1.weight (stage1_block1/Conv_0/kernel) (3, 3, 64, 64). Import weights "
                    f"of a resnet18"]
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("cut", ["empty", "truncated"])
def test_a_truncated_or_empty_safetensors_is_one_line_naming_the_file(tmp_path, capsys, cut):
  path, _, _ = drawn_file(tmp_path, "resnet_tiny", num_classes=3)
  data = open(path, "rb").read()
  with open(path, "wb") as f:
    f.write(b"" if cut == "empty" else data[:len(data) // 2])
  status, _, err = _import(tmp_path, capsys, path, tmp_path / "w")
  errors = [line for line in err.splitlines() if line.startswith("error:")]
  assert status == 1 and len(errors) == 1 and "Traceback" not in err
  size = 0 if cut == "empty" else len(data) // 2
  assert errors[0].startswith(f"error: weights file {path} ({size} bytes) is not a whole .safetensors file (")
  assert errors[0].endswith("): an interrupted download or copy leaves one cut short; fetch or export it again")
  assert not (tmp_path / "w").exists()
  with pytest.raises(InvalidValueError, match=f"^weights file {path} "):
    tensor_files.read(path)


@pytest.mark.parametrize("model,crop,resize,interpolation", [
    ("convnext_tiny", 224, 236, "bilinear"), ("convnext_small", 224, 230, "bilinear"),
    ("convnext_base", 224, 232, "bilinear"), ("efficientnet_b0", 224, 256, "bicubic"),
    ("efficientnet_b3", 300, 320, "bicubic"), ("efficientnet_b7", 600, 600, "bicubic"),
    ("resnet50", 224, 256, "bilinear"),
])
def test_weights_without_a_record_get_the_eval_torchvision_documents_for_their_model(tmp_path, model, crop,
                                                                                   resize, interpolation):
  """Every import recorded ResNet's eval (crop 0.875, bilinear): a ConvNeXt-T's eval was not the
  published model's (224 of 236). A file that records no preprocessing now gets what torchvision
  documents for the model's weights, and eval resizes to exactly their resize size."""
  import math
  from jaxnet.core.data import transforms
  path = tmp_path / "w.safetensors"
  tensor_files.write(str(path), {"x": np.zeros((1,), np.float32)}, {})
  prep, origin = pretrained.preprocessing_of(str(path), model)
  assert (prep.interpolation, prep.mean) == (interpolation, (0.485, 0.456, 0.406))
  assert math.floor(crop / prep.crop_fraction) == resize
  assert transforms.eval_crop_geometry(500, 400, crop, prep.crop_fraction)[0][1] == resize  # the shorter side
  assert origin.startswith("torchvision's") and "records none" in origin


# --- an import without the recipe's data (--no-data) ---

def _import_without_data(tmp_path, capsys, weights, workdir, *flags):
  """`jaxnet weights import` of the ResNet recipe (shrunk: resnet_tiny at 16 px) whose image
  folder is not there: (exit status, stdout, stderr)."""
  argv = ["import", f"--from={weights}", "--config=resnet:runlocal", f"--workdir={workdir}",
          "--config.data.source=imagefolder", f"--config.data.dir={tmp_path / 'absent'}",
          "--config.image_size=16", "--config.batch_size=8", "--config.init.preprocessing=config", *flags]
  return _weights_command(capsys, argv)


def _onnx_metadata(path) -> dict:
  import onnx
  return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


def test_an_import_without_data_predicts_by_index_exports_and_its_eval_names_the_data(tmp_path, capsys):
  """Weights and no data: the head is the weights' (7 classes), shown by index; the checkpoint
  holds no data position; the weights export back as they came; an eval is one line naming
  --config.data.dir; without --no-data, the missing data is one line naming --no-data."""
  from jaxnet import api
  from jaxnet.cli import export as export_command
  from jaxnet.core import checkpoint as ckpt
  from jaxnet.core.errors import MissingFileError
  path, tensors, _ = drawn_file(tmp_path, "resnet_tiny", num_classes=7)
  workdir = tmp_path / "w"
  status, out, err = _import_without_data(tmp_path, capsys, path, workdir)
  errors = [line for line in err.splitlines() if line.startswith("error:")]
  assert status == 1 and len(errors) == 1 and "Traceback" not in err
  assert errors[0].startswith(f"error: the recipe's data is not there (Image folder not found: '{tmp_path / 'absent'}'")
  assert errors[0].endswith("import the weights without it with --no-data, or give it with --config.data.dir=DIR")
  assert not workdir.exists()
  headless = tmp_path / "headless.safetensors"  # a backbone's weights: the head's width must be given
  save_file({k: v for k, v in tensors.items() if not k.startswith("fc.")}, str(headless))
  status, _, err = _import_without_data(tmp_path, capsys, headless, workdir, "--no-data")
  assert status == 1 and [line for line in err.splitlines() if line.startswith("error:")] == [
      f"error: {headless} has no class layer for a resnet_tiny to take its class count from: set "
      f"--config.model.num_classes=N for the head to train"]
  assert not workdir.exists()

  status, out, err = _import_without_data(tmp_path, capsys, path, workdir, "--no-data")
  assert status == 0, err
  assert (f"imported 47 arrays of {path} into {workdir} (checkpoint of step 0): predict with it: jaxnet "
          f"predict --workdir={workdir} IMAGE") in out
  assert (f"without data: 7 classes, shown by index until a training on the recipe's data records their names "
          f"(jaxnet train --config={workdir} --workdir={workdir} --config.data.dir=DIR fine-tunes it)") in out
  assert json.loads((workdir / "classes.json").read_text()) == {"num_classes": 7, "class_names": None}
  assert not ckpt.holds_data_position(str(workdir), 0)
  assert not (workdir / "checkpoints" / "0" / ckpt.DATA_ITER).exists()
  assert json.loads((workdir / "environment.json").read_text())["total_steps"] is None
  from jaxnet.core import provenance
  assert json.loads((workdir / "init_weights.json").read_text())["sha256"] == provenance.file_sha256(path)

  model = api.restore(workdir)
  images = np.random.default_rng(0).integers(0, 256, (2, 16, 16, 3), np.uint8)
  assert model.class_names == [str(i) for i in range(7)]
  logits = model.logits(images)
  for result, row in zip(model.predict(images, top_k=2), logits):  # indices, in the logits' order
    assert [name for name, _ in result] == [str(i) for i in np.argsort(-row)[:2]]
  out_file = tmp_path / "back.safetensors"
  assert export_command.main([f"--workdir={workdir}", "--format=torch", f"--out={out_file}"]) == 0
  back = load_file(str(out_file))
  assert sorted(back) == sorted(tensors)
  for name, value in tensors.items():
    np.testing.assert_array_equal(back[name], value, err_msg=name)
  from jaxnet.tools import export as jax_export
  assert export_command.main([f"--workdir={workdir}", "--format=jax", f"--out={tmp_path / 'm.jax'}"]) == 0
  exported = jax_export.load(str(tmp_path / "m.jax"))
  assert exported.class_names == model.class_names
  np.testing.assert_allclose(np.asarray(exported(images)), logits, rtol=1e-5, atol=1e-5)
  if importlib.util.find_spec("onnx"):  # the onnx extra
    assert export_command.main([f"--workdir={workdir}", "--format=onnx", f"--out={tmp_path / 'm.onnx'}"]) == 0
    assert json.loads(_onnx_metadata(tmp_path / "m.onnx")["jaxnet.class_names"]) == model.class_names

  with pytest.raises(MissingFileError) as e:
    api.evaluate(workdir)
  assert "\n" not in str(e.value)
  assert str(e.value).startswith(f"{workdir} holds weights imported without data, and an eval reads its recipe's "
                                 f"eval split, which is not there (Image folder not found")
  assert str(e.value).endswith(f"give the data with --config.data.dir=DIR, or predict on image files (jaxnet "
                               f"predict --workdir={workdir} IMAGE)")


def test_a_fine_tune_of_an_import_without_data_starts_its_data_afresh_and_records_the_names(tmp_path, capsys):
  """The workdir's own config and the data now there: training resumes the imported step 0 (no
  data position: the data order from its beginning), records the class names and saves a
  position. Data of another class count than the imported head is one line naming the fix."""
  import shutil
  from jaxnet import api
  from jaxnet.core import checkpoint as ckpt
  from jaxnet.core.errors import UserError
  from jaxnet.tools.make_imagefolder import make_imagefolder
  path, _, _ = drawn_file(tmp_path, "resnet_tiny", num_classes=7)
  workdir = tmp_path / "w"
  assert _import_without_data(tmp_path, capsys, path, workdir, "--no-data")[0] == 0
  other = shutil.copytree(workdir, tmp_path / "other")
  five = make_imagefolder(str(tmp_path / "five"), classes=5, per_class=2, val_per_class=1, verbose=False)
  with pytest.raises(UserError) as e:
    api.train(api.load_config(str(other), **{"data.dir": five, "total_steps": 1}), other)
  assert str(e.value) == (f"{other} holds weights imported without data, with a 7-class head, and this run's head "
                          f"has 5 (the data five has 5 classes): fine-tune them in a new --workdir with "
                          f"--config.init.weights={other} (the class layer is then trained afresh for these classes)")
  with pytest.raises(UserError) as e:  # nor does an eval of it on that data read a checkpoint
    api.evaluate(other, api.load_config(str(other), **{"data.dir": five}))
  assert str(e.value).startswith(f"{other} holds weights imported without data, with a 7-class head, and this "
                                 f"eval's head has 5 (the data five has 5 classes): evaluate it on data of its 7 "
                                 f"classes, or fine-tune them in a new --workdir")

  seven = make_imagefolder(str(tmp_path / "seven"), classes=7, per_class=2, val_per_class=1, verbose=False)
  capsys.readouterr()
  api.train(api.load_config(str(workdir), **{"data.dir": seven, "total_steps": 1, "log_every_steps": 1}), workdir)
  out = capsys.readouterr().out
  assert ("checkpoint 0 holds no data position (weights imported without data): the data order starts from "
          "its beginning") in out
  assert "resumed from checkpoint at step 0" in out and "the data moved" not in out
  classes = json.loads((workdir / "classes.json").read_text())
  assert classes == {"num_classes": 7, "class_names": sorted(os.listdir(os.path.join(seven, "train")))}
  assert ckpt.holds_data_position(str(workdir), 1) and (workdir / "checkpoints" / "1" / ckpt.DATA_ITER).is_dir()
  assert json.loads((workdir / "data_identity.json").read_text())["train"]
