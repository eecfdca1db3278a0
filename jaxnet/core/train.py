"""The training loop and evaluation: restore -> for each step: batch -> train_step -> log ->
eval -> checkpoint -> stop when asked; then the final checkpoint and the final eval.

This file only orders things in time. What it orders is built elsewhere: the experiment
(data, model, optimizer, jitted steps) in experiment.py, the loss and gradients in
steps.py, shardings in sharding.py, batches in data/, checkpoints in checkpoint.py, the
config check on resume in workdir.py, metrics in metrics.py. The process around it (the
command line: signals, the workdir lock, the multi-process heartbeat) talks to the loop
through a RunControl.

Evaluation sums the eval step's metric sums (not means) over the whole eval set, so the
padded last batch and its masked examples count exactly once: eval/top1 is exact.
"""

import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
from typing import Callable

import jax
import numpy as np

from jaxnet.core import checkpoint as ckpt
from jaxnet.core import config as config_lib
from jaxnet.core import mlperf_log, sharding, steps
from jaxnet.core import workdir as workdir_lib
from jaxnet.core.adapters import xla
from jaxnet.core.data.pipeline import InputWatch
from jaxnet.core.errors import DIVERGED_HINT, MissingFileError, NonFiniteError, UserError
from jaxnet.core.experiment import Experiment
from jaxnet.core.metrics import Progress, RunWriteError
from jaxnet.core.state import TrainState

# What the person running this is told (progress, notes, warnings): shown by the shell
# (jaxnet.api.show_reports), and routable or silenced by whoever embeds the core.
_REPORT = logging.getLogger("jaxnet.report")

# The train step runs under jax.transfer_guard at this level. Tests set
# JAXNET_TRANSFER_GUARD=disallow, so an implicit host<->device copy in the hot
# loop (a Python scalar or numpy array passed to the step) fails them.
_TRANSFER_GUARD = os.environ.get("JAXNET_TRANSFER_GUARD", "allow")


@dataclasses.dataclass
class RunControl:
  """What the process around a run shares with the loop: it asks the loop to stop (a signal
  arrived; checked between steps, and on log steps only when several processes must agree),
  and the loop says where it is (for a heartbeat's message)."""
  stop_requested: Callable[[], bool] = lambda: False
  step: int | None = None            # the last step the loop finished
  checkpoint_sentence: Callable[[], str] = lambda: "There is no intact checkpoint in this workdir yet."


class NonFiniteEvalError(NonFiniteError):
  """An evaluation whose loss is inf/NaN: its numbers are wrong, so it is an error, never a metric."""


def itstime(step: int, every: int, total: int, *, last: bool) -> bool:
  """Whether a periodic action runs after `step`: every `every` steps (0: never), and at the
  final step `total` exactly when `last` (as big_vision's utils.itstime).

  Logging asks for the final step; eval and saving do not, as the loop's end does those once.
  """
  if step == total:
    return last
  return bool(every) and step % every == 0


def train_and_evaluate(config, workdir: str, accept_config_changes=(), *, init_params=None,
                       control: RunControl | None = None, records: dict | None = None) -> dict:
  """Trains (resuming from WORKDIR/checkpoints if present) and returns the final eval metrics,
  or {"stopped_at_step": N} when `control` asked the loop to stop (after saving step N).

  The workdir is opened through its gate (workdir.Workdir: the lock, then the config check,
  before anything is written). `accept_config_changes`: config keys (or "all") that may differ
  from the workdir's config.json on resume, beyond those that always may (workdir.RESUMABLE).
  `init_params(variables) -> variables`: the initial params and BN statistics of a run that
  starts fresh (fine-tuning: jaxnet/tools/weights); never used on resume. `records`: {file name:
  JSON content} the caller's own records for the workdir (the init weights' preprocessing),
  written once the check has passed.
  """
  config_lib.validate(config)
  control = control or RunControl()
  with workdir_lib.Workdir.open(workdir, workdir_lib.TRAIN) as gate, contextlib.ExitStack() as stack:
    try:
      return _train(config, gate, tuple(accept_config_changes), init_params, control, stack, records or {})
    except RunWriteError as e:  # a full disk under metrics, TensorBoard, config or run info
      raise e.stopped_at(control.step, control.checkpoint_sentence()) from None


def _train(config, gate: workdir_lib.Workdir, accept: tuple, init_params, control: RunControl,
           cleanup: contextlib.ExitStack, records: dict) -> dict:
  run = _start(config, gate, accept, init_params, control, cleanup, records)
  try:
    return run.loop()
  finally:
    run.profiler.stop()
    # The checkpoints first: closing them removes a failed save's partial files, giving
    # the disk space back before the writer flushes its buffered TensorBoard events.
    _close_all((run.checkpoints.close, run.writer.close), failing=sys.exc_info()[0] is not None)


def _start(config, gate: workdir_lib.Workdir, accept: tuple, init_params, control: RunControl,
           cleanup: contextlib.ExitStack, records: dict) -> "_Run":
  """Everything before the first step: the config checked against the workdir's (before
  anything is written), the Experiment, the state restored (or initialised), the records."""
  init_start_ms = mlperf_log.now_ms()
  config_json = config.to_json_best_effort(indent=2)
  config_dict = json.loads(config_json)
  gate.check(config_dict, accept)  # is this the run the checkpoints came from?
  exp = Experiment(config)
  _check_imported_head(gate.path, exp)
  gate.check_data({"train": exp.train_source, "eval": exp.eval_source}, accept, config.data.identity)
  gate.keep_previous_start()  # before this start's records replace the previous start's
  for name, content in records.items():
    gate.write_json(name, content)
  is_chief = exp.process_index == 0
  if is_chief and exp.data_note:
    _REPORT.info(exp.data_note)
  checkpoints = gate.checkpoints(config.keep_checkpoints, config.async_checkpointing)
  control.checkpoint_sentence = checkpoints.complete_sentence

  exp.data_elements = _resumed_data_elements(gate.path, checkpoints.steps(), config.data.loader, is_chief)
  # However the run ends (done, stopped, an error), the loader's workers stop and
  # their ready batches leave /dev/shm.
  batches = cleanup.enter_context(exp.device_batches())
  state, start_step = checkpoints.restore_newest(exp.abstract_state, batches.iterator, gate.data_change_accepted)
  if state is None:
    state, start_step = exp.init_state(init_params), 0
    logging.info("no checkpoint in %s: starting from scratch", gate.path)
  else:
    _REPORT.info(f"resumed from checkpoint at step {start_step} in {gate.path}/checkpoints")
  batches.restored()
  gate.record_config(config_json, start_step, report=_REPORT.info)
  gate.record_data_identity(start_step)
  gate.write_run_info(total_steps=exp.total_steps, steps_per_epoch=exp.steps_per_epoch,
                      num_classes=exp.num_classes, class_names=exp.class_names, started_at_step=start_step)
  gate.drop_records_after(start_step)
  writer = gate.metric_writer()
  writer.write_config(config_json)
  _REPORT.info(f"training {config.model.name} on {config_lib.data_name(config)}: {exp.total_steps} steps "
               f"({exp.steps_per_epoch} per epoch), global batch {config.batch_size} on "
               f"{exp.mesh.devices.size} {jax.default_backend()} device(s), precision {config.precision}")
  if exp.fsdp_summary and is_chief:
    _REPORT.info(exp.fsdp_summary.line())
  mllog = gate.mlperf_log(fresh=start_step == 0)
  cleanup.callback(mllog.close)
  mllog.start("init_start", time_ms=init_start_ms)
  mllog.settings(config, devices=f"{exp.mesh.devices.size}x{exp.mesh.devices.flat[0].device_kind}",
                 train_samples=len(exp.train_source), eval_samples=len(exp.eval_source))
  return _Run(config=config, config_dict=config_dict, exp=exp, checkpoints=checkpoints, batches=batches,
              writer=writer, control=control, state=state, start_step=start_step, step=start_step,
              progress=Progress(exp.total_steps, config.batch_size, start_step, enabled=is_chief,
                                describe=exp.task.describe_train),
              input_watch=InputWatch(config.batch_size, exp.data_workers,
                                     warn=jax.default_backend() != "cpu"), mllog=mllog,
              profiler=StepProfiler(config.profile_steps, os.path.join(gate.path, "tensorboard"),
                                    enabled=is_chief))


def _resumed_data_elements(workdir: str, steps, loader: str, report: bool) -> str:
  """The kind of Grain train loader this run uses: the kind of the newest checkpoint with a
  data position, so a position saved by the record-level loader (jaxnet before 2026-11-29)
  resumes exactly, in that loader, for the whole run (its later checkpoints are record-level
  too); "batches" otherwise (a fresh run, weights imported without data)."""
  for step in sorted(steps, reverse=True):
    elements = ckpt.position_elements(workdir, step)
    if elements is None:
      continue
    if elements == ckpt.RECORDS and loader == "grain" and report:
      _REPORT.info(f"checkpoint {step}'s data position is record-level (saved by jaxnet before 2026-11-29): "
                   f"this run resumes with that loader; a new workdir gets the faster whole-batch loader")
    return elements
  return ckpt.BATCHES


def _check_imported_head(workdir: str, exp: Experiment, evaluating: bool = False) -> None:
  """Weights imported without data (a newest checkpoint with no data position) have the
  weights' head: data that makes a head of another width can neither resume nor evaluate
  them, which is one line naming the fix (a new workdir from these weights, its class layer
  trained afresh; for an eval, data of the head's classes)."""
  step, _ = ckpt.newest_saved_config(workdir)
  if step is None or ckpt.holds_data_position(workdir, step):
    return
  try:
    with open(os.path.join(workdir, "classes.json")) as f:
      imported = int(json.load(f)["num_classes"])
  except (OSError, ValueError, KeyError, TypeError):  # verify reports an unreadable record
    return
  if imported == exp.num_classes:
    return
  source = exp.eval_source if evaluating else exp.train_source
  fix = (f"fine-tune them in a new --workdir with --config.init.weights={workdir} (the class layer is then "
         f"trained afresh for these classes)")
  raise UserError(
      f"{workdir} holds weights imported without data, with a {imported}-class head, and this "
      f"{'eval' if evaluating else 'run'}'s head has {exp.num_classes} (the data "
      f"{config_lib.data_name(exp.config)} has {source.num_classes} classes): "
      + (f"evaluate it on data of its {imported} classes, or {fix}" if evaluating else fix))


@dataclasses.dataclass
class _Run:
  """A training run from its first step to its end: what the loop reads and moves on."""
  config: object
  config_dict: dict
  exp: Experiment
  checkpoints: object
  batches: object
  writer: object
  control: RunControl
  progress: Progress
  profiler: "StepProfiler"
  input_watch: InputWatch
  mllog: mlperf_log.MlperfLog
  state: TrainState
  start_step: int
  step: int
  history: list = dataclasses.field(default_factory=list)  # the log window's per-step metrics
  checked: int = 0                                          # how many of them were checked finite

  @property
  def is_chief(self) -> bool:
    return self.exp.process_index == 0

  def loop(self) -> dict:
    """Steps until the total (or a stop request), then the final save and eval."""
    exp, total, record = self.exp, self.exp.total_steps, {}
    if self.step < total:
      sharding.compile_then_sync(exp.train_step, (self.state, self.batches.peek()), "train_step compiled")
      self.input_watch.restart()  # the first window is the steps', not the compile's
    self.mllog.end("init_stop")  # set-up and compiles are MLPerf's init time
    self.mllog.start("run_start")
    self.mllog.start("block_start", metadata=self._samples())
    while self.step < total:
      self.train_step()
      step = self.step
      log_now = itstime(step, self.config.log_every_steps, total, last=True)
      record = self.log_window() if log_now else {}
      if itstime(step, exp.eval_every, total, last=False):  # the final eval comes after the loop
        self.mllog.end("block_stop", metadata=self._samples())
        eval_metrics = self.evaluate()
        self.mllog.start("block_start", metadata=self._samples())
        record.update(eval_metrics, time=self.progress.elapsed())
        if self.is_chief:
          _REPORT.info(f"eval at step {step}: {exp.task.describe(eval_metrics)}")
      # One line per step, appended once (readers tail the file): a step's train and eval
      # metrics together; the final step's line waits for the final eval.
      if record and step != total:
        self.writer.write(step, record)
      if itstime(step, exp.checkpoint_every, total, last=False):  # so does the final save
        self.save()
      if step < total and _should_stop(self.control, sync=log_now):  # at total the run ends anyway
        self.save()
        self.checkpoints.wait()
        self.mllog.end("run_stop", metadata={"status": self.mllog.status, **self._samples()})
        return {"stopped_at_step": step}
    return self.finish(record)

  def train_step(self) -> None:
    image_size = self.exp.train_image_size(self.step)
    if image_size != self.batches.image_size and self.is_chief:  # progressive resizing (recompiles once)
      _REPORT.info(f"step {self.step}: training resolution is now {image_size}px")
    with self.input_watch.waiting():
      batch = self.batches.next(image_size)
    try:
      with self.profiler.step(self.step + 1) as traced, jax.transfer_guard(_TRANSFER_GUARD):
        self.state, metrics = self.exp.train_step(self.state, batch)
        traced.append(self.state)
    finally:
      # Batches from data.workers sit in /dev/shm while anything refers to them, and an
      # exception's traceback keeps this frame alive: drop the one taken. `batches` (closed
      # by the caller's exit stack) drops those read ahead.
      batch = None  # noqa: F841
    self.history.append(metrics)
    self.step += 1
    self.control.step = self.step

  def log_window(self) -> dict:
    """The log step's record: the window's train metrics (checked finite), throughput, time,
    and how long the step waited on data."""
    with self.input_watch.synced():  # fetching the metrics waits for the device
      self.check_finite()
    input_metrics, lines = self.input_watch.window(len(self.history))
    if self.is_chief:
      for line in lines:
        (_REPORT.warning if line.startswith("warning:") else _REPORT.info)(line)
    record = _summarize_window(self.history)
    record.update(input_metrics)
    record["train/window_steps"] = len(self.history)  # fewer than log_every_steps after a resume
    self.history, self.checked = [], 0
    record["train/images_per_sec"] = self.progress.rate(self.step)
    record["train/epoch"] = self.step / self.exp.steps_per_epoch
    record["time"] = self.progress.elapsed()  # seconds since this process started training
    self.progress.report(self.step, record, record["train/images_per_sec"], self.config.log_every_steps)
    return record

  def check_finite(self) -> None:
    """Each step's loss and gradient norm, once, at a log step or a save."""
    check_finite_metrics(self.history[self.checked:], self.step, self.checkpoints.intact_sentence(),
                         self.exp.policy.uses_loss_scale)
    self.checked = len(self.history)

  def _samples(self) -> dict:
    return {"samples_count": self.step * self.config.batch_size}

  def evaluate(self) -> dict:
    """evaluate(), between MLPerf's eval_start and eval_stop, and its eval_accuracy."""
    epoch = self.step / self.exp.steps_per_epoch
    self.mllog.start("eval_start", metadata={"epoch_num": round(epoch, 4), **self._samples()})
    eval_metrics = evaluate(self.exp, self.state)
    self.mllog.end("eval_stop", metadata={"epoch_num": round(epoch, 4), **self._samples()})
    self.mllog.eval(eval_metrics.get(self.exp.task.headline), self.step, self.step * self.config.batch_size,
                    epoch, self.config.target_accuracy)
    return eval_metrics

  def save(self) -> None:
    self.check_finite()
    self.checkpoints.save(self.step, self.state, self.batches.position, self.config_dict,
                          data_elements=self.exp.data_elements)

  def finish(self, record: dict) -> dict:
    """The final save (unless this step's is already there) and the final eval."""
    if self.step > self.start_step or self.checkpoints.newest_intact != self.step:
      self.save()
    self.mllog.end("block_stop", metadata=self._samples())
    eval_metrics = self.evaluate()
    if not self.config.target_accuracy:  # no target: a completed run is MLPerf's success
      self.mllog.status = "success"
    self.mllog.end("run_stop", metadata={"status": self.mllog.status, **self._samples()})
    elapsed = self.progress.elapsed()
    self.checkpoints.wait()
    # With the final step's train metrics; a rerun of a finished run has none, and
    # MetricWriter then merges the eval into that step's existing line.
    self.writer.write(self.step, {**record, **eval_metrics, "train/elapsed_sec": elapsed, "time": elapsed})
    if self.is_chief:
      _REPORT.info(f"final: step {self.step}  test {self.exp.task.describe(eval_metrics)}  ({elapsed:.1f}s)")
    return eval_metrics


def _should_stop(control: RunControl, sync: bool) -> bool:
  """Whether to stop now. With several processes, only on `sync` steps, where all of them
  ask: every process must stop at the same step, or the collective save would hang."""
  if jax.process_count() == 1:
    return control.stop_requested()
  return sync and sharding.any_process(control.stop_requested())


def _summarize_window(history: list[dict]) -> dict:
  """One record for a log window's per-step metrics (steps.WINDOW_REDUCTION says how)."""
  stacked = jax.device_get(history)
  reduce = {"mean": lambda v: float(np.mean(v)), "sum": lambda v: np.sum(v).item(),
            "last": lambda v: v[-1].item()}
  return {k: reduce[steps.WINDOW_REDUCTION.get(k, "mean")]([m[k] for m in stacked])
          for k in stacked[-1]}


def check_finite_metrics(history: list[dict], last_step: int, intact_sentence: str, fp16: bool) -> None:
  """Stops the run at the first step of `history` whose loss or gradient norm is not finite.

  The values stay on the device until here (a log step or a save), so the check costs no
  host sync per step. fp16 runs skip steps with non-finite gradients by design (loss
  scaling), so only their loss is checked.
  """
  if not history:
    return
  values = jax.device_get([(m["train/loss"], m["train/grad_norm"]) for m in history])
  for i, (loss, grad_norm) in enumerate(values):
    if np.isfinite(loss) and (fp16 or np.isfinite(grad_norm)):
      continue
    step = last_step - len(history) + 1 + i
    raise NonFiniteError(
        f"training diverged at step {step}, the first step with a non-finite loss or gradient "
        f"(train/loss {float(loss)}, grad_norm {float(grad_norm)}); training stopped and nothing "
        f"from step {step} on was saved. {intact_sentence} {DIVERGED_HINT}")


def _close_all(closers, failing: bool) -> None:
  """Calls every closer. A run that is already failing reports that first failure alone: a
  close that fails too (the same full disk, say) adds nothing to it, not even a chained
  traceback. Otherwise the first close's error is raised once all have run."""
  first = None
  for close in closers:
    try:
      close()
    except Exception as e:  # noqa: BLE001 (each closer runs; the first failure is kept)
      first = first or e
  if first is not None and not failing:
    raise first


# --- evaluation ---------------------------------------------------------------------

def evaluate(exp: Experiment, state: TrainState) -> dict:
  """The task's eval metrics (a classifier's eval/loss, eval/top1, eval/top5; a detector's COCO
  eval/mAP, eval/AP50, ...) over every example of the eval split once, and eval/examples."""

  def outputs():
    for i, batch in enumerate(exp.eval_batches()):
      if i == 0:
        sharding.compile_then_sync(exp.eval_step, (state, batch), "eval_step compiled")
      yield exp.eval_step(state, batch)

  metrics = exp.task.evaluate(outputs(), exp.eval_source)
  loss = metrics.get("eval/loss", 0.0)
  if not math.isfinite(loss):
    precision, platform = exp.config.precision, exp.mesh.devices.flat[0].platform
    raise NonFiniteEvalError(
        f"eval/loss is {loss} (precision {precision}, backend {platform}, "
        f"{metrics['eval/examples']} examples): the evaluation is wrong and was not recorded. "
        f"{xla.ynn_hint(precision, platform)}Weights that are inf/NaN do this too, and so "
        f"do fp16 activations beyond 65504: compare with config.precision=fp32.")
  return metrics


def evaluate_checkpoint(config, workdir: str, step: int | None = None, accept_config_changes=(),
                        record: bool = True) -> dict:
  """`--mode=eval`: evaluates the latest (or given) checkpoint of WORKDIR and records eval metrics.

  A config that differs from the one WORKDIR was trained with in what the eval measures (the
  model, the eval data as it sees them: workdir.EVAL_INPUTS) is refused, naming the changes,
  unless each is in `accept_config_changes` (or "all"); such an eval is recorded apart, in
  WORKDIR/evals_with_changes.jsonl, never in metrics.jsonl, the training run's own record.
  Reads the workdir only, apart from that record (skipped with a warning where the
  workdir is read-only; never made with `record=False`, as `verify` asks). Data whose
  identity differs from the recorded (data_identity.json) is refused or, accepted, recorded
  apart, as a config change. A damaged checkpoint is an error.
  """
  config_lib.validate(config)
  with workdir_lib.Workdir.open(workdir, workdir_lib.EVAL) as gate:
    gate.check(json.loads(config.to_json_best_effort()), tuple(accept_config_changes))
    checkpoints = ckpt.Checkpoints(workdir, read_only=True)
    try:
      evaluated = checkpoints.resolve_step(step)  # no checkpoint: said before the data is read
      exp = _eval_experiment(config, workdir, evaluated)
      gate.check_data({"eval": exp.eval_source}, tuple(accept_config_changes), config.data.identity)
      if exp.process_index == 0 and exp.data_note:
        _REPORT.info(exp.data_note)
      state, step = checkpoints.read_newest(lambda s: checkpoints.restore(s, exp.abstract_state), step)
    finally:
      checkpoints.close()
    metrics = evaluate(exp, state)
    if exp.process_index == 0:
      _REPORT.info(f"eval of checkpoint {step}: {exp.task.describe(metrics)}  "
                   f"({metrics['eval/examples']} examples)")
      if not record:
        return metrics
      try:
        gate.record_eval(step, metrics)
      except workdir_lib.WorkdirLockedError:  # a training writes this workdir's records
        _REPORT.warning(f"warning: {workdir} is held by {workdir_lib.held_by(workdir) or 'another writer'}: "
                        f"these eval metrics were not recorded")
      except RunWriteError as e:  # a read-only workdir, a full disk: the numbers are printed above
        _REPORT.warning(f"warning: could not record the eval metrics in {workdir} ({e.cause})")
      except UserError as e:  # the lock file could not be written (a full disk)
        _REPORT.warning(f"warning: could not record the eval metrics in {workdir} ({e})")
  return metrics


def _eval_experiment(config, workdir: str, step: int) -> Experiment:
  """The eval's Experiment: weights imported without data (a checkpoint with no data position)
  whose recipe's data is not there, or whose data has other classes than their head, are one
  line naming the fix."""
  try:
    exp = Experiment(config, need_train_data=False)
  except MissingFileError as e:  # the sources' word for data that is not there
    if ckpt.holds_data_position(workdir, step):
      raise
    first = str(e).strip().splitlines()[0].rstrip(":. ")
    raise MissingFileError(
        f"{workdir} holds weights imported without data, and an eval reads its recipe's eval split, which is "
        f"not there ({first}): give the data with --config.data.dir=DIR, or predict on image files "
        f"(jaxnet predict --workdir={workdir} IMAGE)") from None
  _check_imported_head(workdir, exp, evaluating=True)
  return exp


# --- profiling ------------------------------------------------------------------------

class StepProfiler:
  """`config.profile_steps = (first, last)`: a jax.profiler trace of steps first..last
  (1-based, inclusive) into WORKDIR/tensorboard/plugins/profile/, each step annotated with
  `jax.profiler.StepTraceAnnotation`, for TensorBoard's profile plugin (the `tensorboard`
  extra installs it). Steps before `first` are left out, so compilation and warm-up do not
  fill the trace."""

  def __init__(self, steps, logdir: str, enabled: bool = True):
    self.first, self.last = (tuple(steps) + (0, 0))[:2] if steps else (0, 0)
    self.logdir, self.enabled = logdir, enabled and bool(steps)
    self._tracing = False

  @contextlib.contextmanager
  def step(self, step: int):
    """Wraps the call that runs `step` (1-based); yields a list to put the new state in."""
    if not self.enabled or not self.first <= step <= self.last:
      yield []
      return
    if not self._tracing:
      os.makedirs(self.logdir, exist_ok=True)
      jax.profiler.start_trace(self.logdir)
      self._tracing = True
    out = []
    with jax.profiler.StepTraceAnnotation("train", step_num=step):
      yield out
      jax.block_until_ready(out)  # the step's device work belongs inside its annotation
    if step == self.last:
      self.stop()
      _REPORT.info(f"profile of steps {self.first}-{self.last} written to {self.logdir}/plugins/profile "
                   f"(tensorboard --logdir {self.logdir}, Profile tab: pip install -e '.[tensorboard]')")

  def stop(self) -> None:
    if self._tracing:
      jax.profiler.stop_trace()
      self._tracing = False
