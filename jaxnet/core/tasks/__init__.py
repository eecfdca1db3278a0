"""Tasks: what differs between training a classifier and a detector, behind one interface.

A task is the whole vertical slice of what a model does: the data it reads (its sources and
the examples they make), its config block, its loss (the one train step in steps.py takes it:
mixed precision, loss scaling, micro-batches, FSDP's gathers, EMA and the optimizer stay
there, the same for every task), what its eval step computes and the evaluator that turns
that into metrics, its headline metric and plots, and what a restored model does with an
image (preprocess, postprocess, print, draw). A model's registry entry names its task
(`TASK` on its module class, jaxnet/core/models); everything else asks the task object,
never its name.

  classification/   labels: cross-entropy (label smoothing, mixup/CutMix), top-1/top-5; which
                    of jaxnet/core/data's image sources each data.source it reads is
  detection/        boxes: focal and box losses over the model's anchors, COCO's mAP;
                    coco.py: its sources (COCO-format folders, tfds, synthetic boxes)

A new task (segmentation, keypoints, ...) is one package (or module) here whose `TASK` is a
Task: every package and module of this package is imported, as models are, and nothing
outside it names the task. A task defined elsewhere (a test's, a user's) is added with
`register`.
"""

import dataclasses
import functools
import importlib
import pkgutil
from typing import Callable

from jaxnet.core import models
from jaxnet.core.errors import InvalidValueError, UserError


@dataclasses.dataclass(frozen=True)
class Task:
  """The interface. `name` is what a model's TASK says; `headline` the eval metric a run is
  judged by and `headline_label` its words in a report; `plots` the report's figures of its
  own (((figure, y label, ((metric, line style, legend suffix), ...)), ...): drawn when a
  run logged them); `exports` the --format values (and "int8") its models can be exported
  to; `eval_keys` the keys it adds (`add_config`) that change what an eval
  sees and `source_keys` those its sources are made from (dotted; "block." for a whole
  block); `rules` their ranges, as config._RULES: ((key, test, what the value must be), ...);
  `sources` the config.data.source values its make_source reads (empty: not checked here) and
  `loaders` the config.data.loader values that load them (DALI makes image-and-label batches)."""
  name: str = ""
  headline: str = ""
  headline_label: str = ""
  exports: tuple = ()
  plots: tuple = ()
  eval_keys: tuple = ()
  source_keys: tuple = ()
  rules: tuple = ()
  sources: tuple = ()
  loaders: tuple = ("grain",)

  def add_config(self, c) -> None:
    """Adds this task's keys to the config `c` with their defaults, as base_config writes its
    own (`c.KEY = VALUE  # what it does`: jaxnet config shows the comment). base_config calls
    it for every task: the names are public (config.json, --config.KEY)."""

  def check_config(self, config) -> None:
    """Refuses, in one line, what this task does not build (before anything runs)."""

  def check_data(self, config) -> None:
    """Refuses a config.data.source this task does not read, naming the tasks that do, and a
    config.data.loader that does not load its data."""
    source, loader = config.data.source, config.data.loader
    if self.sources and source not in self.sources:
      readers = [t.name for t in all_tasks() if source in t.sources]
      whose = f"; {source} is read by {' and '.join(readers)} models" if readers else ""
      raise InvalidValueError(f"config.data.source={source!r}: a {self.name} model "
                              f"(config.model.name={config.model.name}) reads {', '.join(self.sources)}{whose}")
    if loader not in self.loaders:
      raise InvalidValueError(f"config.data.loader={loader}: a {self.name} model's data loads with "
                              f"data.loader={' or '.join(self.loaders)}")

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

  def eval_outputs(self, model, config, num_classes: int) -> Callable:
    """`outputs(apply, batch)` for steps.make_eval_step: what the eval step returns for a
    batch (`apply(images)`: the model in eval mode, normalised inside), for `evaluate`."""
    raise NotImplementedError

  def evaluate(self, outputs, eval_source) -> dict:
    """The eval metrics from the eval step's outputs over the whole eval set (an iterator of
    them, each on the host's side of jax.device_get), with eval/examples."""
    raise NotImplementedError

  def describe(self, metrics: dict) -> str:
    """The eval metrics in a few words, for the progress lines."""
    raise NotImplementedError

  def describe_train(self, metrics: dict) -> str:
    """The loss's own train metrics in a few words, for the progress lines ("": none)."""
    return ""

  def predict_outputs(self, model, config) -> Callable:
    """`outputs(apply, images)` for steps.make_predict_fn: what a restored model computes for
    uint8 images (classification: logits; detection: boxes, scores, classes)."""
    raise NotImplementedError

  # What a restored model does for an image (jaxnet/tools/predictor.py).
  def preprocess(self, data: bytes, config, channels: int) -> dict:
    """An encoded image -> the example eval would have made of it: {"image": uint8 HWC with
    `channels` channels, "mask": whether it decoded, ...: what `postprocess` needs of it}."""
    raise NotImplementedError

  def postprocess(self, outputs, examples: list, class_names: list, **options) -> list:
    """The predict function's outputs for a batch (host arrays) -> each image's result."""
    raise NotImplementedError

  def lines(self, path, result) -> list[str]:
    """One image's result as `python -m jaxnet.cli.predict` prints it."""
    return [f"{path}: {result}"]

  def draw(self, image, result, path: str) -> None:
    """Writes `image` with its result drawn as PNG at `path` (a task that draws overrides it)."""
    self.check_draw()

  def check_draw(self) -> None:
    """Refuses, in one line, to draw the results of a task that does not draw them: asked
    before anything is predicted (python -m jaxnet.cli.predict --draw)."""
    if type(self).draw is Task.draw:
      raise UserError(f"--draw: a {self.name} model's results are not drawn; leave --draw out")


def found_in(path: list, package: str) -> dict:
  """{name: task} of every package and module directly in `path` (the folders of `package`)
  that defines TASK: a new task is a new package, listed nowhere else."""
  found = {}
  for module in pkgutil.iter_modules(path):
    task = getattr(importlib.import_module(f"{package}.{module.name}"), "TASK", None)
    if isinstance(task, Task):
      found[task.name] = task
  return found


@functools.cache
def _modules() -> dict:
  return found_in(__path__, __name__)


_ADDED: dict[str, Task] = {}


def register(task: Task) -> Task:
  """Adds a task defined outside this package (a model's TASK then names it)."""
  _ADDED[task.name] = task
  return task


def all_tasks() -> list[Task]:
  return list({**_modules(), **_ADDED}.values())


def get(name: str) -> Task:
  found = {t.name: t for t in all_tasks()}
  if name not in found:
    raise InvalidValueError(f"no task {name!r} (a model's TASK): the tasks are {', '.join(sorted(found))}")
  return found[name]


def for_model(model_name: str) -> Task:
  """The task of registered model `model_name`."""
  return get(models.task(model_name))


def for_records(records: list[dict]) -> Task:
  """The task whose headline metric a run's metrics records hold (the first task's if none)."""
  tasks = all_tasks()
  return next((t for t in tasks if any(t.headline in r for r in records)), tasks[0])
