"""The Python API's config handling and the metrics-log reader, without training."""

import json
import os

import ml_collections
import pytest

from jaxnet.cli import process

from jaxnet import api

from jaxnet.core import config as config_io

from jaxnet.tools import report as runlog
from tests.helpers import REPO

DIGITS = "configs/digits.py"


def test_overrides_dotted_nested_and_keyword():
  config = api.load_config(DIGITS, {"optim": {"momentum": 0.5}}, total_steps=7,
                           **{"optim.learning_rate": 0.25, "data.mean": [0.5]})
  assert config.total_steps == 7
  assert config.optim.learning_rate == 0.25 and config.optim.momentum == 0.5
  assert config.data.mean == (0.5,)                      # a list becomes the field's tuple
  assert config.model.name == "resnet_tiny"              # the rest is configs/digits.py
  assert config.is_locked


def test_mistyped_key_is_an_error_naming_it():
  with pytest.raises(api.ConfigOverrideError) as e:
    api.load_config(DIGITS, batchsize=8)
  assert "'batchsize'" in str(e.value) and "'batch_size'" in str(e.value)
  with pytest.raises(api.ConfigOverrideError, match="'optim.learnin_rate'.*'optim.learning_rate'"):
    api.load_config(DIGITS, **{"optim.learnin_rate": 0.1})
  with pytest.raises(api.ConfigOverrideError, match="'optim'"):
    api.load_config(DIGITS, optim=3)                     # a section, not a value
  with pytest.raises(api.ConfigOverrideError, match="'batch_size'"):
    api.load_config(DIGITS, batch_size="big")            # wrong type


def test_with_overrides_copies():
  config = api.load_config(DIGITS)
  changed = api.with_overrides(config, precision="bf16", **{"model.name": "resnet18_small"})
  assert (changed.precision, changed.model.name) == ("bf16", "resnet18_small")
  assert (config.precision, config.model.name) == ("fp32", "resnet_tiny")
  with pytest.raises(api.ConfigOverrideError):
    api.with_overrides(config, precison="bf16")


def test_config_json_round_trip(tmp_path):
  """What train.py writes as WORKDIR/config.json loads back as the same config."""
  config = api.load_config(DIGITS, **{"data.mean": (0.1, 0.2, 0.3), "data.std": (1.0, 2.0, 3.0),
                                      "num_epochs": 2.5})
  with config.unlocked():
    config.extra = ml_collections.ConfigDict({"sizes": (1, 2)})  # a key base_config lacks
  (tmp_path / "config.json").write_text(config.to_json_best_effort(indent=2))
  assert isinstance(json.loads((tmp_path / "config.json").read_text())["data"]["mean"], list)

  loaded = api.load_config(str(tmp_path))                # a workdir
  assert loaded.data.mean == (0.1, 0.2, 0.3) and isinstance(loaded.data.mean, tuple)
  assert loaded.extra.sizes == (1, 2)
  assert loaded.to_dict() == config.to_dict()
  assert isinstance(loaded.num_epochs, float) and isinstance(loaded.batch_size, int)
  with pytest.raises(api.ConfigOverrideError):
    api.load_config(str(tmp_path / "config.json"), batchsize=1)


def test_missing_config_json_says_so(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    config_io.load(str(tmp_path))


def test_import_jaxnet_is_cheap():
  import subprocess, sys
  from tests.helpers import REPO
  out = subprocess.run([sys.executable, "-c", "import jaxnet, sys; print('jax' in sys.modules)"],
                       capture_output=True, text=True, check=True, cwd=REPO)
  assert out.stdout.strip() == "False"


def test_wall_time_continues_across_resumes():
  records = [
      {"step": 10, "train/loss": 2.0, "time": 5.0},
      {"step": 20, "train/loss": 1.0, "time": 6.0},
      {"step": 30, "train/loss": 0.9, "time": 7.0},      # killed after the step-20 checkpoint
      {"step": 30, "eval/top1": 0.5},                     # --mode=eval: no time
      {"step": 30, "train/loss": 0.8, "time": 4.0},      # resumed process: its clock restarts
      {"step": 40, "train/loss": 0.7, "time": 4.5},
      {"step": 40, "eval/top1": 0.9, "time": 5.0},
  ]
  loss = runlog.series(records, "train/loss")
  assert loss.steps.tolist() == [10, 20, 30, 40]
  assert loss.values.tolist() == [2.0, 1.0, 0.8, 0.7]    # the re-run step 30 wins
  assert loss.times.tolist() == [5.0, 6.0, 11.0, 11.5]   # 7 s of the first process + 4, 4.5
  top1 = runlog.series(records, "eval/top1")
  assert top1.values.tolist() == [0.5, 0.9]
  summary = runlog.summary(records)
  assert summary["best_eval_top1"] == 0.9 and summary["best_eval_step"] == 40
  assert summary["time_to_best_sec"] == 12.0
  assert summary["final_step"] == 40


def test_command_line_overrides_are_read_as_each_keys_type():
  rest, overrides = process.split_command_line(
      ["prog", "--config=configs/digits.py", "--config.batch_size=32", "--config.data.dir", "/d",
       "--workdir=/w", "--config.async_checkpointing=false", "--config.optim.learning_rate=1e-3",
       "--config.progressive_resizing=((0.5, 8),)", "--config.data.mean=(0.5,)"])
  assert rest == ["prog", "--config=configs/digits.py", "--workdir=/w"]
  config = config_io.load(os.path.join(REPO, "configs/digits.py"), overrides)
  assert config.batch_size == 32 and config.data.dir == "/d" and config.async_checkpointing is False
  assert config.optim.learning_rate == 1e-3 and config.progressive_resizing == ((0.5, 8),)
  assert config.data.mean == (0.5,)
  for key, text, message in (("batch_size", "abc", "cannot read 'abc' as int"),
                             ("async_checkpointing", "maybe", "as bool"),
                             ("data.mean", "0.5", "is a tuple")):
    with pytest.raises(config_io.ConfigOverrideError, match=message):
      config_io.load(os.path.join(REPO, "configs/digits.py"), {key: text})


def test_durations_in_epochs_follow_the_batch_size():
  from jaxnet.core.config import duration_in_steps
  for batch, per_epoch in ((1024, 1251), (512, 2502)):  # ImageNet's 1,281,167 images
    config = api.load_config(os.path.join(REPO, "configs/resnet50.py"), batch_size=batch)
    assert config.eval_every_steps == 0 and config.eval_every_epochs == 5
    steps_per_epoch = 1_281_167 // batch
    assert steps_per_epoch == per_epoch
    assert duration_in_steps(config, "eval_every", steps_per_epoch) == 5 * per_epoch
    assert duration_in_steps(config, "checkpoint_every", steps_per_epoch) == per_epoch
    assert duration_in_steps(config, "total", steps_per_epoch) == 90 * per_epoch
    assert duration_in_steps(config, "warmup", steps_per_epoch) == 5 * per_epoch
  # A number of steps > 0 wins over its epochs twin; both 0 turns a cadence off.
  config = api.load_config(os.path.join(REPO, "configs/resnet50.py"), eval_every_steps=500)
  assert duration_in_steps(config, "eval_every", 1251) == 500
  config = api.load_config(os.path.join(REPO, "configs/resnet50.py"), eval_every_epochs=0.0)
  assert duration_in_steps(config, "eval_every", 1251) == 0


def test_one_resnet_recipe_file_takes_depth_recipe_and_runlocal():
  load = lambda arg: config_io.from_file(os.path.join(REPO, "configs", arg))
  assert (load("resnet.py").model.name, load("resnet.py").optim.name) == ("resnet50", "sgd")
  fast = load("resnet.py:depth=101,recipe=fast")
  assert (fast.model.name, fast.optim.name, fast.batch_size) == ("resnet101", "lars", 2048)
  assert load("resnet50.py:fast").to_dict() == load("resnet.py:fast").to_dict()  # the documented alias
  assert load("resnet50.py").to_dict() == load("resnet.py").to_dict()
  small = load("resnet.py:fast,runlocal")
  assert (small.model.name, small.image_size, small.optim.name) == ("resnet_tiny", 32, "lars")
  with pytest.raises(config_io.ConfigFileError, match="not one of depth, recipe, runlocal"):
    load("resnet.py:width=2")


def test_a_run_s_data_is_named_by_its_dataset_or_folder():
  # The header line of a run and a bundle's MODEL_CARD: the shapes data, not its format (coco).
  name = lambda spec, **o: config_io.data_name(config_io.load(spec, o))
  assert name("retinanet:shapes", **{"data.dir": "/tmp/shapes/"}) == "shapes"
  assert name("resnet50", **{"data.source": "imagefolder", "data.dir": "/data/flowers"}) == "flowers"
  assert name("resnet50") == "imagenet2012" and name("digits") == "digits"
