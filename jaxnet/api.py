"""The Python API: the command line's operations as functions, for notebooks and scripts.

    from jaxnet import api
    config = api.load_config("configs/digits.py", **{"optim.learning_rate": 0.2})
    metrics = api.train(config, "/tmp/digits", steps=200)   # final eval metrics
    api.evaluate("/tmp/digits")                              # config from the workdir
    model = api.restore("/tmp/digits")
    model.predict(["seven.png"])                             # [[("7", 0.98), ...]]

`python -m jaxnet.main` calls api.train / api.evaluate, so the command line and
the API share one path: runtime.setup, then train.train_and_evaluate or
evaluation.evaluate_checkpoint. See docs/api.md.
"""

from jaxnet import config_io, runtime
from jaxnet.metrics import read_jsonl as read_metrics  # noqa: F401  (re-exported)
from jaxnet.predictor import Predictor  # noqa: F401  (re-exported)

ConfigOverrideError = config_io.ConfigOverrideError


def load_config(path: str, overrides: dict | None = None, **kwargs):
  """A locked config from a config file (`configs/digits.py`), a config.json or a workdir.

  Overrides are dotted keys, as keyword arguments or a dict:
  `load_config(path, total_steps=50, **{"optim.learning_rate": 0.1})`. A key the
  config does not have raises ConfigOverrideError naming it, as the CLI does.
  """
  return config_io.load(path, {**(overrides or {}), **kwargs})


def with_overrides(config, **overrides):
  """A locked copy of `config` with dotted-key overrides; `config` itself is unchanged."""
  copy = config.copy_and_resolve_references()
  copy.lock()
  config_io.apply_overrides(copy, overrides)
  return copy


def train(config, workdir: str, steps: int | None = None, accept_config_changes=()) -> dict:
  """Trains (resuming from WORKDIR's checkpoints, if any) and returns the final eval metrics.

  `steps` sets config.total_steps, the length of the whole run: training a
  workdir that stopped at step 100 with steps=200 resumes and runs 100 more.
  Resuming with a config that differs from the workdir's config.json raises
  ConfigChangedError unless every changed key may change on resume
  (jaxnet.workdir.RESUMABLE) or is named in `accept_config_changes` (or "all").
  """
  if steps is not None:
    config = with_overrides(config, total_steps=int(steps))
  runtime.setup(config.distributed)
  from jaxnet import train as train_lib
  return train_lib.train_and_evaluate(config, str(workdir), accept_config_changes)


def evaluate(workdir: str, config=None, step: int | None = None) -> dict:
  """Eval metrics of WORKDIR's latest (or given) checkpoint; the config defaults to its config.json."""
  config = config or config_io.load(str(workdir))
  runtime.setup(config.distributed)
  from jaxnet import evaluation
  return evaluation.evaluate_checkpoint(config, str(workdir), step)


def restore(workdir: str, step: int | None = None, config=None) -> Predictor:
  """A Predictor: the eval-mode model function with the checkpoint's variables."""
  runtime.setup()
  from jaxnet import predictor
  return predictor.restore(str(workdir), step, config)


def predict(model, images, top_k: int = 5) -> list[list[tuple[str, float]]]:
  """Top-k (class name, probability) per image; `model` is a Predictor or a workdir."""
  if not isinstance(model, Predictor):
    model = restore(model)
  return model.predict(images, top_k)
