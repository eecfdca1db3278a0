"""Fine-tuning pieces without a training run: the preprocessing that init weights bring
(and where it is recorded), and frozen BN statistics. The end-to-end fine-tune (export,
head re-initialisation, beating a run from scratch) is notebooks/finetune.ipynb, run by
tests/test_notebooks.py."""

import json
import os

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxnet.core import models
from jaxnet.core.config import base_config
from jaxnet.tools.weights import pretrained
from jaxnet.tools.weights.preprocessing import TORCHVISION, Preprocessing
from tests.helpers import REPO
from tests.models_helpers import NUM_CLASSES, TINY_SHAPE, tiny_variables

TIMM_A1 = Preprocessing((0.5, 0.45, 0.4), (0.25, 0.25, 0.25), 0.95, "bicubic")


def weights_file(tmp_path, preprocessing=None) -> str:
  path = str(tmp_path / "w.safetensors")
  metadata = {"preprocessing": preprocessing.to_json()} if preprocessing else None
  save_file({"fc.bias": np.zeros(3, np.float32)}, path, metadata=metadata)
  return path


def fetch_and_record_preprocessing(config, workdir: str, log=lambda _: None):
  """pretrained.preprocessing_for, its record kept as api.train keeps it: by the workdir's gate."""
  from jaxnet.core import workdir as workdir_lib
  resolved, record = pretrained.preprocessing_for(config, workdir, log)
  if record:
    with workdir_lib.Workdir.open(workdir, workdir_lib.TRAIN) as gate:
      gate.check({})
      gate.write_json("preprocessing.json", record)
  return resolved


def test_preprocessing_of_the_weights_is_applied_and_recorded(tmp_path):
  config = base_config()
  config.init.weights = weights_file(tmp_path, TIMM_A1)
  lines = []
  resolved = fetch_and_record_preprocessing(config, str(tmp_path / "run"), log=lines.append)
  d = resolved.data
  assert (d.mean, d.std, d.eval_crop_fraction, d.eval_interpolation) == \
      ((0.5, 0.45, 0.4), (0.25, 0.25, 0.25), 0.95, "bicubic")
  assert config.data.eval_interpolation == "bilinear"  # the caller's config is left alone
  assert lines == [f"init: preprocessing from the metadata of {config.init.weights}: mean (0.5, 0.45, "
                   f"0.4), std (0.25, 0.25, 0.25), eval crop fraction 0.95, bicubic (set "
                   f"init.preprocessing=config to keep data.*)"]
  record = json.load(open(tmp_path / "run" / "preprocessing.json"))
  assert record["weights"] == config.init.weights and record["preprocessing"]["crop_fraction"] == 0.95

  # A resumed run or --mode=eval reads the record: the weights file is not needed any more.
  (tmp_path / "w.safetensors").unlink()
  lines.clear()
  again = fetch_and_record_preprocessing(config, str(tmp_path / "run"), log=lines.append)
  assert again.data.eval_interpolation == "bicubic" and lines == []


def test_eval_applies_the_record_and_never_reads_the_weights(tmp_path):
  """--mode=eval's preprocessing: the run's record, else the config's data.*; the weights'
  own preprocessing is neither fetched nor recorded."""
  config = base_config()
  config.init.weights = weights_file(tmp_path, TIMM_A1)
  workdir = tmp_path / "run"
  assert pretrained.with_recorded_preprocessing(config, str(workdir)) is config
  assert not workdir.exists()
  fetch_and_record_preprocessing(config, str(workdir), log=lambda _: None)
  (tmp_path / "w.safetensors").unlink()
  d = pretrained.with_recorded_preprocessing(config, str(workdir)).data
  assert (d.mean, d.std, d.eval_crop_fraction, d.eval_interpolation) == \
      ((0.5, 0.45, 0.4), (0.25, 0.25, 0.25), 0.95, "bicubic")
  config.init.weights = str(tmp_path / "other.safetensors")  # a record of other weights is not used
  assert pretrained.with_recorded_preprocessing(config, str(workdir)) is config


def test_weights_without_preprocessing_get_torchvision_eval(tmp_path):
  config = base_config()
  config.init.weights = weights_file(tmp_path)
  config.data.mean, config.data.eval_crop_fraction = (0.1, 0.2, 0.3), 1.0
  resolved = fetch_and_record_preprocessing(config, str(tmp_path / "run"), log=lambda _: None)
  assert (resolved.data.mean, resolved.data.eval_crop_fraction) == (TORCHVISION.mean, 0.875)


def test_preprocessing_config_keeps_data_keys(tmp_path):
  config = base_config()
  config.init.weights, config.init.preprocessing = weights_file(tmp_path, TIMM_A1), "config"
  assert pretrained.preprocessing_for(config, str(tmp_path / "run"))[0] is config
  assert not (tmp_path / "run").exists()
  config.init.preprocessing = "timm"
  with pytest.raises(ValueError, match="init.preprocessing must be 'weights' or 'config'"):
    fetch_and_record_preprocessing(config, str(tmp_path / "run"))


def test_frozen_bn_stats_normalise_with_running_statistics_in_training():
  images = np.random.default_rng(1).normal(1.0, 3.0, (4,) + TINY_SHAPE).astype(np.float32)
  frozen = models.create("resnet_tiny", num_classes=NUM_CLASSES, freeze_bn_stats=True)
  variables = tiny_variables(zero_init_last_bn=False)
  # Running statistics unlike the batch's, so batch statistics would give other outputs.
  variables = {"params": variables["params"], "batch_stats": jax.tree.map(
      lambda x: x + 0.5, variables["batch_stats"])}
  apply = lambda model, v, train: model.apply(v, images, train=train, mutable=["batch_stats"])
  train_out, updates = apply(frozen, variables, True)
  eval_out, _ = apply(frozen, variables, False)
  np.testing.assert_allclose(train_out, eval_out, rtol=1e-6, atol=1e-6)
  jax.tree.map(np.testing.assert_array_equal, updates["batch_stats"], variables["batch_stats"])

  normal = models.create("resnet_tiny", num_classes=NUM_CLASSES)
  train_out, updates = apply(normal, variables, True)
  assert np.abs(np.asarray(train_out) - np.asarray(eval_out)).max() > 1e-2
  assert not np.allclose(updates["batch_stats"]["stem_bn"]["mean"], variables["batch_stats"]["stem_bn"]["mean"])


def test_a_weights_import_into_a_held_workdir_is_refused_and_writes_nothing(tmp_path):
  """The import opens the workdir through its gate: a workdir a training run holds is refused
  before the weights are read, and nothing is written into it (no checkpoint 0, no config.json)."""
  from jaxnet.core import config as config_lib
  from jaxnet.core import workdir as workdir_lib
  held = tmp_path / "run"
  held.mkdir()
  with workdir_lib.Lock(str(held)):
    with pytest.raises(workdir_lib.WorkdirLockedError, match="in use by another training run"):
      pretrained.import_to_workdir(config_lib.load(os.path.join(REPO, "configs", "digits.py")), str(held),
                                   str(tmp_path / "never-read.safetensors"))
  assert os.listdir(held) == ["lock"]
