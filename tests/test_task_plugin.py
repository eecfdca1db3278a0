"""A task is a plug-in (issue 54): a third task, written in this file only and registered from
here with the public registries (jaxnet.core.models.register, jaxnet.core.tasks.register),
trains, evaluates, resumes, predicts, reports and exports (--format=jax) through the public
entry points (jaxnet.api, and the commands' mains in-process) without a jaxnet file knowing it.

The task: the digit's value as a number, per image (scalar regression on the digits), with a
config block of its own (`value.scale`: the target is the digit / scale).
"""

import json
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from PIL import Image

from jaxnet import api
from jaxnet.core import models, tasks
from jaxnet.core.data import sources
from jaxnet.core.tasks import Task

MODEL = "digit_value_net"


class DigitValueNet(nn.Module):
  """One convolution, the mean over the image, one number."""
  TASK = "digit_value"
  num_classes: int = 1  # every run passes the dataset's class count; the output is one number
  features: int = 8
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.relu(nn.Conv(self.features, (3, 3), dtype=self.dtype)(x))
    return nn.Dense(1, dtype=self.dtype)(jnp.mean(x, axis=(1, 2)))[:, 0].astype(jnp.float32)


class DigitValue(Task):
  def add_config(self, c) -> None:
    c.value = ml_collections.ConfigDict()
    c.value.scale = 1.0              # the target is the digit / scale

  def make_source(self, config, split: str):
    return tasks.get("classification").make_source(config, split)  # the digits, their labels

  def batch_fields(self, config) -> dict:
    return {"label": ((), "int32")}

  def loss(self, model, config, num_classes: int, batch_devices: int = 1):
    scale = config.value.scale

    def loss(apply, batch, key):
      error = apply(batch["image"]) - batch["label"] / scale
      return jnp.sum(jnp.square(error) * batch["mask"]), {}

    return loss

  def eval_outputs(self, model, config, num_classes: int):
    scale = config.value.scale

    def outputs(apply, batch):
      error = apply(batch["image"]) * scale - batch["label"]
      mask = batch["mask"].astype(jnp.float32)
      return {"squares": jnp.sum(jnp.square(error) * mask), "within1": jnp.sum((jnp.abs(error) < 1) * mask),
              "count": jnp.sum(mask)}

    return outputs

  def evaluate(self, outputs, eval_source) -> dict:
    sums = _sums(outputs)
    return {"eval/mse": sums["squares"] / sums["count"], "eval/within1": sums["within1"] / sums["count"],
            "eval/examples": int(sums["count"])}

  def describe(self, metrics: dict) -> str:
    return f"mse {metrics['eval/mse']:.3f}  within 1 {metrics['eval/within1']:.3f}"

  def predict_outputs(self, model, config):
    scale = config.value.scale
    return lambda apply, images: apply(images) * scale

  def preprocess(self, data: bytes, config, channels: int) -> dict:
    return tasks.get("classification").preprocess(data, config, channels)  # the same images

  def postprocess(self, outputs, examples, class_names, **options) -> list:
    return [float(v) for v in outputs]

  def lines(self, path, result) -> list[str]:
    return [f"{path}: {result:.3f}"]


def _sums(outputs) -> dict:
  sums = {}
  for out in outputs:
    for k, v in jax.device_get(out).items():
      sums[k] = sums.get(k, 0.0) + float(v)
  return sums


TASK = DigitValue(name="digit_value", headline="eval/within1", headline_label="eval within-1", exports=("jax",),
                  plots=(("mse", "squared error", (("eval/mse", "o--", "eval"),)),), eval_keys=("value.",),
                  rules=(("value.scale", lambda v: v > 0, "> 0"),))


@pytest.fixture
def digit_value():
  models.register(MODEL)(DigitValueNet)
  tasks.register(TASK)
  yield
  # Gone with the test: other tests list every registered model and task.
  del models._REGISTRY[MODEL], tasks._ADDED[TASK.name]


def test_a_task_written_outside_jaxnet_brings_its_config_block_rules_and_report(digit_value):
  """The quick part of the proof below: its keys in every config, range-checked; its headline
  and figure in a report of its metrics."""
  from jaxnet.core import config as config_lib
  from jaxnet.tools import report
  config = api.load_config("digits", **{"model.name": MODEL, "value.scale": 0.0})
  with pytest.raises(config_lib.InvalidConfigError, match=r"value.scale=0.0 must be > 0"):
    config_lib.validate(config)
  records = [{"step": 4, "time": 1.0, "eval/within1": 0.5, "eval/mse": 3.0},
             {"step": 8, "time": 2.0, "eval/within1": 0.25, "eval/mse": 2.0}]
  summary = report.summary(records)
  assert summary["best_eval_within1"] == 0.5 and summary["best_eval_step"] == 4
  assert report.format_summary("run", summary).startswith(
      "run: final eval within-1 0.2500 at step 8; best eval within-1 0.5000 at step 4 ")
  plots, drawn_when_logged = report.figures()
  assert plots["mse"] == ("squared error", [("eval/mse", "o--", "eval")]) and "mse" in drawn_when_logged


def test_the_registry_finds_a_task_as_a_package_or_a_module(tmp_path, monkeypatch):
  """A task is a package of jaxnet/core/tasks (classification/, detection/ with its coco.py)
  or a module there: the registry imports every one that defines TASK, listing none of them."""
  import importlib
  import sys
  root = tmp_path / "more_tasks"
  (root / "boxes").mkdir(parents=True)
  (root / "__init__.py").write_text("")
  define = "from jaxnet.core.tasks import Task\nTASK = Task(name={!r})\n"
  (root / "scalar.py").write_text(define.format("scalar"))
  (root / "boxes" / "__init__.py").write_text("from more_tasks.boxes import data  # its own module\n"
                                               + define.format("boxes"))
  (root / "boxes" / "data.py").write_text("EXAMPLE = {}\n")
  (root / "helpers.py").write_text("X = 1\n")  # no TASK: not a task
  monkeypatch.syspath_prepend(str(tmp_path))
  try:
    found = tasks.found_in([str(root)], "more_tasks")
    assert {name: type(task).__name__ for name, task in found.items()} == {"boxes": "Task", "scalar": "Task"}
  finally:
    for name in [m for m in sys.modules if m.split(".")[0] == "more_tasks"]:
      del sys.modules[name]
  packages = {t.name for t in tasks.all_tasks() if hasattr(importlib.import_module(type(t).__module__), "__path__")}
  assert {"classification", "detection"} <= packages


def test_a_task_refuses_the_data_it_does_not_read_naming_the_tasks_that_do():
  """Each task lists the data.source values it reads and the loaders of its data (Task.sources,
  Task.loaders): the core holds no list of them. A task that lists none is not checked here."""
  from jaxnet.core.errors import InvalidValueError
  classifier = api.load_config("digits", **{"data.source": "coco"})
  with pytest.raises(InvalidValueError) as e:
    tasks.for_model(classifier.model.name).check_data(classifier)
  assert str(e.value) == (f"config.data.source='coco': a classification model (config.model.name="
                          f"{classifier.model.name}) reads digits, synthetic, imagefolder, tfds, prepared; "
                          f"coco is read by detection models")
  detector = api.load_config("retinanet:shapes", **{"data.loader": "dali"})
  with pytest.raises(InvalidValueError, match=r"^config.data.loader=dali: a detection model's data loads "
                                              r"with data.loader=grain$"):
    tasks.for_model(detector.model.name).check_data(detector)
  tasks.for_model(detector.model.name).check_data(api.load_config("retinanet:shapes"))
  with pytest.raises(InvalidValueError, match=r"^config.data.loader=spark: a classification model's data "
                                              r"loads with data.loader=grain or dali$"):
    tasks.get("classification").check_data(api.load_config("digits", **{"data.loader": "spark"}))
  Task(name="any").check_data(classifier)


@pytest.mark.slow  # ~25 s on 2 CPU cores: two trainings, an eval, predict, report and export
def test_a_task_written_outside_jaxnet_trains_evaluates_resumes_predicts_reports_and_exports(
    digit_value, tmp_path, capsys):
  from jaxnet.cli import export as export_command
  from jaxnet.cli import predict as predict_command
  from jaxnet.cli import report as report_command
  from jaxnet.tools import export
  workdir = str(tmp_path / "run")
  config = api.load_config("digits", **{
      "model.name": MODEL, "batch_size": 128, "log_every_steps": 1, "eval_every_steps": 8,
      "checkpoint_every_steps": 4, "optim.name": "adamw", "optim.learning_rate": 0.4,
      "optim.warmup_epochs": 0.0, "optim.weight_decay": 0.0, "value.scale": 3.0})
  assert config.model.to_dict() == {"name": MODEL, "num_classes": 0, "features": 8}
  api.train(config, workdir, steps=4)
  final = api.train(config, workdir, steps=8)  # resumes at step 4
  records = api.read_metrics(workdir)
  losses = [r["train/loss"] for r in records if "train/loss" in r]
  assert [r["step"] for r in records if "train/loss" in r] == list(range(1, 9)) and losses[-1] < 0.5 * losses[0], losses
  assert final["eval/examples"] == 359 and final["eval/mse"] < 10, final
  assert json.load(open(os.path.join(workdir, "config.json")))["value"] == {"scale": 3.0}
  assert api.evaluate(workdir)["eval/mse"] == pytest.approx(final["eval/mse"], rel=1e-5)

  test = sources.digits_source("test", 16)
  files = []
  for i in range(3):
    files.append(str(tmp_path / f"{i}.png"))
    Image.fromarray(test.images[i][..., 0]).save(files[-1])
  capsys.readouterr()
  assert predict_command.main([f"--workdir={workdir}", *files]) == 0
  printed = capsys.readouterr().out.splitlines()
  values = api.predict(workdir, files)
  assert printed == [f"{path}: {value:.3f}" for path, value in zip(files, values)]

  assert report_command.main([workdir]) == 0
  summary = (tmp_path / "run" / "report" / "summary.txt").read_text()
  best = max((r for r in records if "eval/within1" in r), key=lambda r: r["eval/within1"])
  assert f"best eval within-1 {best['eval/within1']:.4f} at step {best['step']}" in summary
  assert (tmp_path / "run" / "report" / "mse.png").exists()
  assert not (tmp_path / "run" / "report" / "accuracy.png").exists()

  out = str(tmp_path / "value.jax")
  assert export_command.main([f"--workdir={workdir}", f"--out={out}"]) == 0
  model = api.restore(workdir)
  batch = model.preprocess(files)
  np.testing.assert_allclose(np.asarray(export.load(out)(batch)), values, rtol=1e-5, atol=1e-5)
