"""The Python API: the command line's operations as functions, for notebooks and scripts.

    from jaxnet import api
    config = api.load_config("digits", **{"optim.learning_rate": 0.2})
    metrics = api.train(config, "/tmp/digits", steps=200)   # final eval metrics
    api.evaluate("/tmp/digits")                              # config from the workdir
    model = api.restore("/tmp/digits")
    model.predict(["seven.png"])                             # [[("7", 0.98), ...]]

`python -m jaxnet.main` calls api.train / api.evaluate, so the command line and the API
share one path, and print the same lines: the core reports progress, notes and warnings
through the logger "jaxnet.report", which importing this module shows as plain lines
(progress on stdout, warnings on stderr); `show_reports(False)` turns the progress off, and
an application that embeds the core routes that logger as it likes. Training, an eval's
record and the weights import open the workdir through its gate (its lock, then the config
check), as the command line does. Otherwise the API leaves the process as it finds it: no
XLA flags, compilation cache or signal handlers (call `jaxnet.cli.process.setup()` first to
get the command line's XLA flags and cache). See docs/api.md.
"""

import logging
import os
import sys

from jaxnet.core import config as config_lib
from jaxnet.core.errors import UserError
from jaxnet.core.metrics import read_jsonl as read_metrics  # noqa: F401  (re-exported)
from jaxnet.tools.predictor import Predictor  # noqa: F401  (re-exported)

ConfigOverrideError = config_lib.ConfigOverrideError


class _Lines(logging.Handler):
  """A report as the line the command line prints: progress on stdout, warnings on stderr
  (the streams of the moment, so a notebook's or a test's capture sees them)."""

  def emit(self, record: logging.LogRecord) -> None:
    stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
    print(record.getMessage(), file=stream, flush=True)


def show_reports(progress: bool = True) -> None:
  """Shows the core's reports (logger "jaxnet.report") as plain lines; `progress=False` keeps
  the warnings only. Done once on import; call again to turn the progress off or back on."""
  logger = logging.getLogger("jaxnet.report")
  if not any(isinstance(h, _Lines) for h in logger.handlers):
    logger.addHandler(_Lines())
  logger.setLevel(logging.INFO if progress else logging.WARNING)
  logger.propagate = False  # not again through absl's or the root logger's handlers


show_reports()


def load_config(path: str, overrides: dict | None = None, **kwargs):
  """A locked config from a packaged recipe (`"digits"`, `"resnet50:fast"`), a config file
  (`my_config.py[:ARG]`), a config.json or a workdir.

  Overrides are dotted keys, as keyword arguments or a dict:
  `load_config(path, total_steps=50, **{"optim.learning_rate": 0.1})`. A key the
  config does not have raises ConfigOverrideError naming it, as the CLI does.
  """
  return config_lib.load(path, {**(overrides or {}), **kwargs})


def with_overrides(config, **overrides):
  """A locked copy of `config` with dotted-key overrides; `config` itself is unchanged."""
  copy = config.copy_and_resolve_references()
  copy.lock()
  config_lib.apply_overrides(copy, overrides)
  return copy


def train(config, workdir: str, steps: int | None = None, accept_config_changes=(),
          control=None, config_file: str | None = None) -> dict:
  """Trains (resuming from WORKDIR's checkpoints, if any) and returns the final eval metrics.

  `steps` sets config.total_steps, the length of the whole run: training a workdir that
  stopped at step 100 with steps=200 resumes and runs 100 more. Resuming with a config
  that differs from the workdir's config.json raises ConfigChangedError unless every
  changed key may change on resume (jaxnet.core.workdir.RESUMABLE) or is named in
  `accept_config_changes` (or "all"). With `config.init.weights`, a run that starts fresh
  takes its params from those weights and the preprocessing they expect (recorded in the
  workdir). `control`: a jaxnet.core.train.RunControl (the command line's signals).
  `config_file`: the config file or recipe the config was loaded from (`NAME[:ARG]`), whose
  text the workdir keeps (config_file.py) beside the config it made.
  """
  from jaxnet.core import checkpoint as ckpt
  from jaxnet.core import provenance
  from jaxnet.core import train as train_lib
  from jaxnet.tools.weights import pretrained
  if steps is not None:
    config = with_overrides(config, total_steps=int(steps))
  init_params, records = None, config_file_record(config_file)
  if config.init.weights:
    config, record = pretrained.preprocessing_for(config, str(workdir))
    if record:  # kept in the workdir once its gate has checked the config
      records[pretrained.preprocessing.FILE] = record
    init_params = pretrained.initialiser(config)
    if not ckpt.has_checkpoints(str(workdir)):  # a fresh start reads them: what they were is kept
      records[provenance.INIT_WEIGHTS_FILE] = pretrained.weights_record(config.init.weights)
  return train_lib.train_and_evaluate(config, str(workdir), accept_config_changes,
                                      init_params=init_params, control=control, records=records)


def config_file_record(config_file: str | None) -> dict:
  """{"config_file.py": the text of the config file run, headed by the name it was run as},
  or {} for a config from a workdir, a config.json, or none named."""
  from jaxnet.core import provenance
  try:
    path = config_lib.resolve(config_file)[0] if config_file else ""
  except UserError:
    return {}
  if not path.endswith(".py") or not os.path.isfile(path):
    return {}
  with open(path) as f:
    text = f.read()
  return {provenance.CONFIG_TEXT_FILE: f"# jaxnet: the config file this run was started with: {config_file}\n{text}"}


def evaluate(workdir: str, config=None, step: int | None = None, accept_config_changes=()) -> dict:
  """Eval metrics of WORKDIR's latest (or given) checkpoint; the config defaults to its
  config.json. A config that changes what the model sees is refused (ConfigChangedError)
  unless its changes are in `accept_config_changes`; such an eval is recorded apart
  (WORKDIR/evals_with_changes.jsonl). WORKDIR may be a bundle (nothing is recorded in it)."""
  from jaxnet.core import train as train_lib
  from jaxnet.tools import bundle
  from jaxnet.tools.weights import pretrained
  # A bundle (export --format=bundle): its files as they were made; its eval records nothing,
  # which would change them.
  is_bundle = bundle.check_bundle(str(workdir)) is not None
  config = config or config_lib.load(str(workdir))
  config = pretrained.with_recorded_preprocessing(config, str(workdir))  # reads no weights
  return train_lib.evaluate_checkpoint(config, str(workdir), step, accept_config_changes, record=not is_bundle)


def restore(workdir: str, step: int | None = None, config=None) -> Predictor:
  """The workdir's model in eval mode with the checkpoint's variables, whatever its task: its
  `predict(images)` gives each image's result as the task says (a classifier's top-k classes,
  a detector's boxes)."""
  from jaxnet.tools import predictor
  return predictor.restore(str(workdir), step, config)


def predict(model, images, **options) -> list:
  """Per image, the restored model's result: a classifier's top-k (class name, probability)
  (option top_k=5), a detector's (class name, score, (x0, y0, x1, y1) in the image's pixels)
  scoring at least min_score=0.3. `model` is a restored model (a Predictor) or a workdir."""
  if isinstance(model, (str, os.PathLike)):
    model = restore(model)
  return model.predict(images, **options)
