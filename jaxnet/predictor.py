"""A trained model restored from a workdir: the eval-mode function and its variables.

`Predictor.logits_fn` is `steps.make_logits_fn`, the same function the eval step
runs, so predictions, eval metrics and `jaxnet.export` agree. The checkpoint is
read without the optimizer or the dataset (classes.json, written at train time,
says how many classes there are and their names).
"""

import json
import os

import jax
import numpy as np

from jaxnet import checkpoint as ckpt
from jaxnet import config_io, models, precision, preprocess, steps
from jaxnet.errors import InvalidValueError


class Predictor:
  def __init__(self, config, model, variables, *, num_classes: int, class_names=None, step=None,
               workdir=None):
    self.config, self.model, self.step, self.workdir = config, model, step, workdir
    self.num_classes = num_classes
    self.class_names = list(class_names) if class_names else [str(i) for i in range(num_classes)]
    self.channels = len(config.data.mean)  # Experiment checks this equals the images' channels
    self.image_shape = (config.image_size, config.image_size, self.channels)
    self.variables = jax.device_put(variables)
    self.logits_fn = steps.make_logits_fn(
        model, precision.get_policy(config.precision),
        mean=tuple(config.data.mean), std=tuple(config.data.std))
    self._logits = jax.jit(self.logits_fn)

  def logits(self, images) -> np.ndarray:
    """uint8 images, (N, H, W, C) as in self.image_shape -> float32 logits (N, classes)."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.shape[1:] != self.image_shape:
      raise InvalidValueError(f"expected uint8 images of shape (N, {', '.join(map(str, self.image_shape))}), "
                              f"got {images.dtype} {images.shape}; use preprocess() for files")
    return np.asarray(self._logits(self.variables, images), np.float32)

  def probabilities(self, images) -> np.ndarray:
    return np.asarray(jax.nn.softmax(self.logits(images), axis=-1))

  def preprocess(self, images) -> np.ndarray:
    """Files, PIL images or arrays -> the uint8 batch eval would have seen."""
    return preprocess.load_batch(images, self.config, self.channels)

  def predict(self, images, top_k: int = 5) -> list[list[tuple[str, float]]]:
    """Top-k (class name, probability) for each image; images are files/PIL images or a uint8 batch."""
    is_batch = isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.ndim == 4
    batch = images if is_batch else self.preprocess(images)
    probs = self.probabilities(batch)
    top = np.argsort(-probs, axis=-1)[:, :min(top_k, self.num_classes)]
    return [[(self.class_names[i], float(p[i])) for i in row] for p, row in zip(probs, top)]


def restore(workdir: str, step: int | None = None, config=None) -> Predictor:
  """The model of WORKDIR's latest (or given) checkpoint, ready for inference."""
  config = config or config_io.load(workdir)
  info = _class_info(workdir, config)
  model = models.from_config(config, info["num_classes"])
  variables, step = load_eval_variables(workdir, config, step)
  _check_matches_model(model, variables, (1, config.image_size, config.image_size,
                                          len(config.data.mean)), workdir)
  return Predictor(config, model, variables, num_classes=info["num_classes"],
                   class_names=info.get("class_names"), step=step, workdir=workdir)


def load_eval_variables(workdir: str, config, step: int | None = None) -> tuple[dict, int]:
  """(the variables eval uses, as host arrays, step) of WORKDIR's latest (or given)
  checkpoint: EMA params when its run (`config`) kept an EMA. Also `init.weights`'s reader."""
  tree, step = ckpt.load_arrays(workdir, step)
  return steps.eval_variables(tree["params"], tree.get("ema_params"), tree["batch_stats"],
                              use_ema=config.ema_decay > 0), step


def _class_info(workdir: str, config) -> dict:
  path = os.path.join(workdir, "classes.json")
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  # A workdir from before classes.json existed: ask the dataset.
  from jaxnet.data import sources
  source = sources.make_source(config.data, "eval", config.image_size)
  return {"num_classes": config.model.num_classes or source.num_classes,
          "class_names": getattr(source, "class_names", None)}


def _check_matches_model(model, variables, input_shape, workdir):
  expected = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), np.zeros(input_shape, np.float32),
                                               train=False))
  shapes = lambda tree: jax.tree.map(lambda x: tuple(x.shape), tree)
  if shapes(dict(expected)) != shapes(dict(variables)):
    raise InvalidValueError(f"the checkpoint in {workdir} does not match the model its config.json builds "
                            f"({model.__class__.__name__}); was config.json edited after training?")
