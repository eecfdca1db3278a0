"""Tasks: what differs between training a classifier and a detector, behind one interface.

A task owns the data it reads (its sources and the examples they make), its loss (the one
train step in steps.py takes it: mixed precision, loss scaling, micro-batches, FSDP's gathers,
EMA and the optimizer stay there, the same for every task), its eval step and the evaluator
that turns the eval step's outputs into metrics, its headline metric, and what a restored
model computes for an image. A model's registry entry names its task (`TASK` on its module
class, jaxnet/core/models); everything else asks the task object, never its name.

  classification.py   labels: cross-entropy (label smoothing, mixup/CutMix), top-1/top-5
  detection.py        boxes: RetinaNet's focal and box losses, COCO's mAP

A new task (segmentation, keypoints, ...) is one module here with a class like these, added
to TASKS.
"""

import dataclasses
from typing import Callable

from jaxnet.core import models


@dataclasses.dataclass(frozen=True)
class Task:
  """The interface. `name` is what a model's TASK says; `headline` the eval metric a run is
  judged by; `exports` the --format values (and "int8") its models can be exported to;
  `returns` what a restored model gives for an image ("classes" or "boxes": the Python API's
  predictor for it, jaxnet/tools/predictor.py)."""
  name: str = ""
  headline: str = ""
  exports: tuple = ()
  returns: str = ""

  def check_config(self, config) -> None:
    """Refuses, in one line, what this task does not build (before anything runs)."""

  def make_source(self, config, split: str):
    """The data source of `split` ("train" or "eval") for config.data."""
    raise NotImplementedError

  def transform(self, source, image_size: int, train: bool, config):
    """The Grain transform that makes the source's records into examples, or None for the
    input pipeline's own (decode and crop an image, jaxnet/core/data/pipeline.py)."""
    return None

  def batch_fields(self, config) -> dict:
    """The batch's fields besides image, mask and corrupt: {name: (per-example shape, dtype name)}."""
    raise NotImplementedError

  def loss(self, model, config, num_classes: int, batch_devices: int = 1) -> Callable:
    """`loss(apply, batch, key) -> (loss summed over the batch's real examples, {metric: sum})`
    for steps.make_train_step: `apply(images)` runs the model in training mode on uint8 or
    float NHWC images (normalised inside). The step divides both by the batch's example
    count. `batch_devices`: the devices the batch is split over."""
    raise NotImplementedError

  def make_eval_step(self, model, policy, config, *, num_classes: int, mean, std, fsdp=None):
    raise NotImplementedError

  def evaluate(self, outputs, eval_source) -> dict:
    """The eval metrics from the eval step's outputs over the whole eval set (an iterator of
    them, each on the host's side of jax.device_get), with eval/examples."""
    raise NotImplementedError

  def describe(self, metrics: dict) -> str:
    """The eval metrics in a few words, for the progress lines."""
    raise NotImplementedError

  def make_predict_fn(self, model, policy, config):
    """`predict_fn(variables, images)`: what a restored model computes for uint8 images
    (classification: logits; detection: boxes, scores, classes)."""
    raise NotImplementedError


def _registry() -> dict:
  from jaxnet.core.tasks import classification, detection
  return {t.name: t for t in (classification.TASK, detection.TASK)}


def headlines() -> list[str]:
  """Every task's headline metric (a run's metrics.jsonl holds its own task's)."""
  return [t.headline for t in _registry().values()]


def get(name: str) -> Task:
  return _registry()[name]


def for_model(model_name: str) -> Task:
  """The task of registered model `model_name`."""
  return get(models.task(model_name))
