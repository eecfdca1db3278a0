"""The training loop: restore -> for each step: batch -> train_step -> log -> eval ->
checkpoint -> stop on a signal; then the final checkpoint and the final eval.

This file only orders things in time. What it orders is built elsewhere: the
experiment (data, model, optimizer, jitted steps) in experiment.py, the loss and
gradients in steps.py, shardings in parallel.py, batches in data/, the eval loop
in evaluation.py, checkpoints in checkpoint.py, the workdir's lock and config
check in workdir.py, metrics in metrics.py, signals and barriers in runtime.py.
"""

import contextlib
import json
import logging
import os
import sys

import jax
import numpy as np

from jaxnet import checkpoint as ckpt
from jaxnet import checkpoint_files, config_io, evaluation, integrity, peers, runtime, steps
from jaxnet import workdir as workdir_lib
from jaxnet.data.device_batches import DeviceBatches
from jaxnet.errors import UserError
from jaxnet.experiment import Experiment
from jaxnet.metrics import (MetricWriter, Progress, RunWriteError, drop_records_after,
                            write_run_info)
from jaxnet.profiling import StepProfiler
from jaxnet.weights import pretrained

# The train step runs under jax.transfer_guard at this level. Tests set
# JAXNET_TRANSFER_GUARD=disallow, so an implicit host<->device copy in the hot
# loop (a Python scalar or numpy array passed to the step) fails them.
_TRANSFER_GUARD = os.environ.get("JAXNET_TRANSFER_GUARD", "allow")


def itstime(step: int, every: int, total: int, *, last: bool) -> bool:
  """Whether a periodic action runs after `step`: every `every` steps (0: never), and at the
  final step `total` exactly when `last` (as big_vision's utils.itstime).

  Logging asks for the final step; eval and saving do not, as the loop's end does those once.
  """
  if step == total:
    return last
  return bool(every) and step % every == 0


def _summarize_window(history: list[dict]) -> dict:
  """One record for a log window's per-step metrics (steps.WINDOW_REDUCTION says how)."""
  stacked = jax.device_get(history)
  reduce = {"mean": lambda v: float(np.mean(v)), "sum": lambda v: np.sum(v).item(),
            "last": lambda v: v[-1].item()}
  return {k: reduce[steps.WINDOW_REDUCTION.get(k, "mean")]([m[k] for m in stacked])
          for k in stacked[-1]}


def train_and_evaluate(config, workdir: str, accept_config_changes=()) -> dict:
  """Trains (resuming from WORKDIR/checkpoints if present) and returns the final eval metrics.

  `accept_config_changes`: config keys (or "all") that may differ from the
  workdir's config.json on resume, beyond those that always may (workdir.RESUMABLE).
  """
  config_io.validate(config)
  workdir_lib.check_path(workdir)
  created = not os.path.exists(workdir)
  os.makedirs(workdir, exist_ok=True)
  try:
    with contextlib.ExitStack() as stack:
      workdir_lib.lock_for_training(stack, workdir)
      signals = stack.enter_context(runtime.StopSignals())
      watch = stack.enter_context(peers.PeerWatch(config.distributed.heartbeat_timeout_sec))
      try:
        return _train(config, workdir, tuple(accept_config_changes), signals, watch, stack)
      except RunWriteError as e:  # a full disk under metrics, TensorBoard, config or run info
        raise e.stopped_at(watch.step, watch.checkpoint_sentence()) from None
      except Exception as e:
        if not isinstance(e, UserError):
          # A process that died fails the others' collectives first (gloo): let the
          # watcher name it, in one line, instead of this exception.
          watch.wait_for_verdict(e)
        raise
  except BaseException:
    if created:  # refused before writing anything (a bad model name, too few devices, ...)
      workdir_lib.remove_if_unused(workdir)
    raise


def _train(config, workdir: str, accept: tuple, signals: runtime.StopSignals,
           watch: peers.PeerWatch, cleanup: contextlib.ExitStack) -> dict:
  config = pretrained.fetch_and_record_preprocessing(config, workdir)  # what init.weights expect
  config_json = config.to_json_best_effort(indent=2)
  config_dict = json.loads(config_json)
  # Before anything is written: is this the run the checkpoints came from?
  changes = (workdir_lib.check_config(workdir, config_dict, accept)
             if checkpoint_files.has_checkpoints(workdir) else {})
  exp = Experiment(config)
  is_chief = exp.process_index == 0
  if is_chief and exp.data_note:
    print(exp.data_note, flush=True)
  checkpoints = ckpt.Checkpoints(workdir, config.keep_checkpoints, config.async_checkpointing)
  watch.checkpoint_sentence = checkpoints.complete_sentence

  # However the run ends (done, preempted, an error), the loader's workers stop and
  # their ready batches leave /dev/shm.
  batches = cleanup.enter_context(DeviceBatches(
      exp.train_loader, exp.batch_sharding, exp.train_image_size(0), config.data.prefetch,
      config.data.workers))
  state, start_step = checkpoints.restore_newest(exp.abstract_state, batches.iterator)
  if state is None:
    state, start_step = exp.init_state(), 0
    logging.info("no checkpoint in %s: starting from scratch", workdir)
  else:
    print(f"resumed from checkpoint at step {start_step} in {workdir}/checkpoints", flush=True)
  batches.restored()
  if is_chief:
    workdir_lib.record_config(workdir, config_json, changes, start_step)
    write_run_info(workdir, total_steps=exp.total_steps, steps_per_epoch=exp.steps_per_epoch,
                   num_classes=exp.num_classes, class_names=exp.class_names)
    # Records past the restored step describe a model that no longer exists.
    drop_records_after(workdir, start_step)
  writer = MetricWriter(workdir, enabled=is_chief)
  writer.write_config(config_json)

  total = exp.total_steps
  print(f"training {config.model.name} on {config.data.source}: {total} steps "
        f"({exp.steps_per_epoch} per epoch), global batch {config.batch_size} on "
        f"{exp.mesh.devices.size} {jax.default_backend()} device(s), precision {config.precision}",
        flush=True)
  if exp.fsdp_summary and is_chief:
    print(exp.fsdp_summary.line(), flush=True)
  progress = Progress(total, config.batch_size, start_step, enabled=is_chief)
  history = []
  fp16 = exp.policy.uses_loss_scale
  profiler = StepProfiler(config.profile_steps, os.path.join(workdir, "tensorboard"), enabled=is_chief)

  def save(step):
    integrity.check_finite_metrics(history, step, checkpoints.intact_sentence(), fp16)
    checkpoints.save(step, state, batches.position, config_dict)

  record = {}
  try:
    step = start_step
    if step < total:
      runtime.compile_then_sync(exp.train_step, (state, batches.peek()), "train_step compiled")
    while step < total:
      image_size = exp.train_image_size(step)
      if image_size != batches.image_size and is_chief:  # progressive resizing (recompiles once)
        print(f"step {step}: training resolution is now {image_size}px", flush=True)
      batch = batches.next(image_size)
      with profiler.step(step + 1) as traced, jax.transfer_guard(_TRANSFER_GUARD):
        state, metrics = exp.train_step(state, batch)
        traced.append(state)
      history.append(metrics)
      step += 1
      watch.step = step

      record = {}
      log_now = itstime(step, config.log_every_steps, total, last=True)
      if log_now:
        integrity.check_finite_metrics(history, step, checkpoints.intact_sentence(), fp16)
        record = _summarize_window(history)
        record["train/window_steps"] = len(history)  # fewer than log_every_steps after a resume
        history = []
        record["train/images_per_sec"] = progress.rate(step)
        record["train/epoch"] = step / exp.steps_per_epoch
        record["time"] = progress.elapsed()  # seconds since this process started training
        progress.report(step, record, record["train/images_per_sec"], config.log_every_steps)

      if itstime(step, exp.eval_every, total, last=False):  # the final eval comes after the loop
        eval_metrics = evaluation.evaluate(exp, state)
        record.update(eval_metrics, time=progress.elapsed())
        if is_chief:
          print(f"eval at step {step}: top1 {eval_metrics['eval/top1']:.4f}  "
                f"loss {eval_metrics['eval/loss']:.4f}", flush=True)
      # One line per step, appended once (readers tail the file): a step's train and eval
      # metrics together; the final step's line waits for the final eval.
      if record and step != total:
        writer.write(step, record)

      if itstime(step, exp.checkpoint_every, total, last=False):  # so does the final save
        save(step)

      if step < total and signals.should_stop(sync=log_now):  # at total the run ends anyway
        save(step)
        checkpoints.wait()
        print(f"{'interrupted' if signals.received == 'SIGINT' else 'preempted'}: checkpoint saved "
              f"at step {step}; rerun the same command to resume", flush=True)
        return {"preempted_at_step": step, "signal": signals.received}

    if step > start_step or checkpoints.newest_intact != step:
      save(step)
    eval_metrics = evaluation.evaluate(exp, state)
    elapsed = progress.elapsed()
    checkpoints.wait()
    # With the final step's train metrics; a rerun of a finished run has none, and
    # MetricWriter then merges the eval into that step's existing line.
    writer.write(step, {**record, **eval_metrics, "train/elapsed_sec": elapsed, "time": elapsed})
    if is_chief:
      print(f"final: step {step}  test top-1 {eval_metrics['eval/top1']:.4f}  "
            f"top-5 {eval_metrics['eval/top5']:.4f}  loss {eval_metrics['eval/loss']:.4f}  "
            f"({elapsed:.1f}s)", flush=True)
    return eval_metrics
  finally:
    # Batches from data.workers sit in /dev/shm while anything refers to them, and an
    # exception's traceback keeps this frame alive: drop the last one taken. `batches`
    # (closed by the caller's exit stack) drops those read ahead.
    batch = None
    profiler.stop()
    # The checkpoints first: closing them removes a failed save's partial files, giving
    # the disk space back before the writer flushes its buffered TensorBoard events.
    _close_all((checkpoints.close, writer.close), failing=sys.exc_info()[0] is not None)


def _close_all(closers, failing: bool) -> None:
  """Calls every closer. A run that is already failing reports that first failure: a
  close that fails for the same cause (a full disk) must not replace it; otherwise the
  first close's UserError is raised once all have run."""
  first = None
  for close in closers:
    try:
      close()
    except UserError as e:
      first = first or e
  if first is not None and not failing:
    raise first
