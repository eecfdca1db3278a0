"""The training loop: build -> restore -> for each step: batch -> train_step -> log -> checkpoint -> eval.

Everything numerical lives in steps.py (loss, gradients), parallel.py (mesh,
shardings) and data/ (batches); this file only orders them in time.
"""

import collections
import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxnet import checkpoint as ckpt
from jaxnet import config_io, durations, mixing, models, optim, parallel, precision, steps, xla_flags
from jaxnet import workdir as workdir_lib
from jaxnet.data import pipeline, sources
from jaxnet.errors import DIVERGED_HINT, NonFiniteError, UserError
from jaxnet.metrics import MetricWriter, Progress, drop_records_after
from jaxnet.profiling import StepProfiler
from jaxnet.state import TrainState, init_state
from jaxnet.weights import pretrained


NonFiniteLossError = NonFiniteError  # the name before jaxnet.errors existed

# The train step runs under jax.transfer_guard at this level. Tests set
# JAXNET_TRANSFER_GUARD=disallow, so an implicit host<->device copy in the hot
# loop (a Python scalar or numpy array passed to the step) fails them.
_TRANSFER_GUARD = os.environ.get("JAXNET_TRANSFER_GUARD", "allow")


class NonFiniteEvalError(NonFiniteLossError):
  """An evaluation whose loss is inf/NaN: its numbers are wrong, so it is an error, never a metric."""


class Experiment:
  """Everything built from a config before the first step: data, model, optimizer, jitted steps."""

  def __init__(self, config, workdir: str, *, need_train_data: bool = True):
    self.config, self.workdir = config, workdir
    self.mesh = parallel.make_mesh(config.mesh.num_devices)
    parallel.check_batch_size(config.batch_size, self.mesh)
    if config.grad_accum_steps > 1:  # each micro-batch is split over the devices too
      parallel.check_batch_size(config.batch_size // config.grad_accum_steps, self.mesh,
                                "batch_size / grad_accum_steps")
    if config.data.eval_batch_size:  # checked now, not after training when the first eval runs
      parallel.check_batch_size(config.data.eval_batch_size, self.mesh, "data.eval_batch_size")
    self.policy = precision.get_policy(config.precision)
    self.process_index, self.process_count = jax.process_index(), jax.process_count()

    self.train_source = sources.make_source(config.data, "train", config.image_size) if need_train_data else None
    self.eval_source = sources.make_source(config.data, "eval", config.image_size)
    ref = self.train_source or self.eval_source
    self.num_classes = config.model.num_classes or ref.num_classes
    self.class_names = getattr(ref, "class_names", None)
    example = ref[0]["image"] if not ref.encoded else None
    channels = example.shape[-1] if example is not None else 3
    self.image_shape = (config.image_size, config.image_size, channels)
    if len(config.data.mean) != channels or len(config.data.std) != channels:
      raise ValueError(f"config.data.mean/std have {len(config.data.mean)} values but images have "
                       f"{channels} channels")

    if config.progressive_resizing and not ref.encoded:
      raise ValueError("config.progressive_resizing needs a JPEG source (imagefolder or tfds): "
                       f"{config.data.source} images have one fixed size")
    train_len = len(self.train_source) if self.train_source is not None else config.batch_size
    self.steps_per_epoch = max(train_len // config.batch_size, 1)
    self.total_steps = durations.steps(config, "total", self.steps_per_epoch)
    self.eval_every = durations.steps(config, "eval_every", self.steps_per_epoch)
    self.checkpoint_every = durations.steps(config, "checkpoint_every", self.steps_per_epoch)

    self.model = models.from_config(config, self.num_classes,
                             parallel.bn_num_groups(config.model.bn_group_size, self.mesh))
    self.schedule = optim.learning_rate_schedule(config.optim, config.batch_size, self.total_steps,
                                                 self.steps_per_epoch)
    self.tx = optim.make_optimizer(config.optim, self.schedule)

    init = lambda: init_state(self.model, self.tx, self.image_shape, config.seed, config.loss_scale)
    abstract_state = jax.eval_shape(init)  # shapes only: nothing is allocated twice
    replicated = parallel.replicated(self.mesh)
    self.state_sharding = jax.tree.map(lambda _: replicated, abstract_state)
    self.abstract_state = ckpt.abstract(abstract_state, self.state_sharding)
    self._init = jax.jit(init, out_shardings=self.state_sharding)
    self.batch_sharding = parallel.batch_sharding(self.mesh)

    norm = dict(num_classes=self.num_classes, mean=tuple(config.data.mean), std=tuple(config.data.std))
    train_step = steps.make_train_step(self.model, self.tx, self.schedule, self.policy,
                                       label_smoothing=config.label_smoothing,
                                       ema_decay=config.ema_decay, mix=mixing.Mix(**config.mix),
                                       grad_accum_steps=config.grad_accum_steps, **norm)
    eval_step = steps.make_eval_step(self.model, self.policy, use_ema=config.ema_decay > 0, **norm)
    # Jitted once, with explicit shardings; the old state's buffers are donated
    # so params and optimizer state are updated in place.
    self.train_step = jax.jit(train_step, in_shardings=(self.state_sharding, self.batch_sharding),
                              out_shardings=(self.state_sharding, replicated), donate_argnums=0)
    self.eval_step = jax.jit(eval_step, in_shardings=(self.state_sharding, self.batch_sharding),
                             out_shardings=replicated)

  def init_state(self) -> TrainState:
    state = self._init()
    if self.config.init.weights:  # fine-tuning: params and BN statistics from pretrained weights
      state = pretrained.initialise(state, self.config)
    return state

  def train_image_size(self, step: int) -> int:
    """The training resolution at `step` under config.progressive_resizing."""
    size = self.config.image_size
    for fraction, stage_size in self.config.progressive_resizing:
      if step >= fraction * self.total_steps:
        size = stage_size
    return size

  def train_loader(self, image_size: int | None = None):
    c = self.config
    return pipeline.train_loader(
        self.train_source, global_batch_size=c.batch_size, image_size=image_size or c.image_size,
        seed=c.seed, workers=c.data.workers, read_threads=c.data.read_threads,
        process_index=self.process_index, process_count=self.process_count,
        randaug=(c.data.randaug_num_ops, c.data.randaug_magnitude))

  def evaluate(self, state: TrainState) -> dict:
    c = self.config
    sums = None
    for local in pipeline.eval_batches(
        self.eval_source, global_batch_size=c.data.eval_batch_size or c.batch_size,
        image_size=c.image_size, workers=c.data.workers, process_index=self.process_index,
        process_count=self.process_count, crop_fraction=c.data.eval_crop_fraction,
        interpolation=c.data.eval_interpolation):
      batch = parallel.to_global(local, self.batch_sharding)
      if sums is None:
        _compile_then_sync(self.eval_step, (state, batch), "eval_step compiled")
      out = self.eval_step(state, batch)
      sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
    sums = jax.device_get(sums)
    count = max(float(sums["count"]), 1.0)
    metrics = {"eval/loss": float(sums["loss"]) / count, "eval/top1": float(sums["top1"]) / count,
               "eval/top5": float(sums["top5"]) / count, "eval/examples": int(sums["count"])}
    if not math.isfinite(metrics["eval/loss"]):
      platform = self.mesh.devices.flat[0].platform
      raise NonFiniteEvalError(
          f"eval/loss is {metrics['eval/loss']} (precision {c.precision}, backend {platform}, "
          f"{metrics['eval/examples']} examples): the evaluation is wrong and was not recorded. "
          f"{xla_flags.ynn_hint(c.precision, platform)}Weights that are inf/NaN do this too, and so "
          f"do fp16 activations beyond 65504: compare with config.precision=fp32.")
    return metrics


def _compile_then_sync(jitted, args, name: str) -> None:
  """Multi-process runs: compile `jitted` for `args` now, then wait for every process.

  The first execution of a step is the processes' first collective; jax's CPU
  (gloo) collectives fail if the processes arrive more than ~30 s apart, as a
  slower compile on one host makes them. Compiled here, the call that follows
  hits jit's cache.
  """
  if jax.process_count() > 1:
    jitted.lower(*args).compile()
    parallel.sync_processes(name)


class _StopSignals:
  """SIGTERM (preemption) and a first Ctrl-C become a flag the loop checks between steps.

  The loop then saves a checkpoint and returns. A second Ctrl-C exits at once
  without saving (the newest complete checkpoint stays intact).
  """

  def __init__(self):
    self.received = None       # "SIGTERM" or "SIGINT" once one arrived
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread (e.g. some notebook runners): no handler
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT and self.received == "SIGINT":
      print("second Ctrl-C: exiting now without saving", file=sys.stderr, flush=True)
      os._exit(130)
    self.received = signal.Signals(signum).name
    how = "press Ctrl-C again to quit without saving" if signum == signal.SIGINT else "then exiting"
    print(f"{self.received} received: saving a checkpoint after this step ({how})",
          file=sys.stderr, flush=True)

  def __exit__(self, *exc):
    for sig, previous in self._previous.items():
      signal.signal(sig, previous)

  def should_stop(self, sync: bool) -> bool:
    if jax.process_count() == 1:
      return self.received is not None
    if not sync:
      return False
    # Every process must stop at the same step, or the collective save would hang.
    from jax.experimental import multihost_utils
    return bool(np.any(multihost_utils.process_allgather(np.array(self.received is not None))))


def itstime(step: int, every: int, total: int) -> bool:
  """Whether a periodic action runs after `step`: every `every` steps (0: never), not at `total`.

  The final step is always logged, evaluated and saved, once, by the loop's end.
  """
  return bool(every) and step % every == 0 and step != total


def _raise_if_non_finite(history: list[dict], last_step: int, checkpoints, fp16: bool) -> None:
  """Stops the run at the first step of `history` whose loss or gradient norm is not finite.

  The values stay on the device until here (a log step or a save), so the check
  costs no host sync per step. fp16 runs skip steps with non-finite gradients by
  design (loss scaling), so only their loss is checked.
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
        f"from step {step} on was saved. "
        f"{checkpoints.intact_sentence()} {DIVERGED_HINT}")


def _mean_metrics(history: list[dict]) -> dict:
  stacked = jax.device_get(history)
  out = {k: float(np.mean([m[k] for m in stacked])) for k in stacked[-1]}
  # Counters are totals, not averages.
  if "data/corrupt_images" in out:
    out["data/corrupt_images"] = int(sum(m["data/corrupt_images"] for m in stacked))
  for key in ("train/skipped_steps", "train/loss_scale"):
    if key in out:
      out[key] = stacked[-1][key].item()
  return out


def _write_run_info(workdir: str, config_json: str, exp: Experiment, changes: dict, step) -> None:
  workdir_lib.record_config(workdir, config_json, changes, step)
  try:
    rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                         cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    rev = ""
  import flax, optax
  env = {"jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__,
         "python": sys.version.split()[0], "platform": jax.default_backend(),
         "devices": [str(d) for d in jax.devices()], "device_kind": jax.devices()[0].device_kind,
         "process_count": jax.process_count(), "git_revision": rev,
         "total_steps": exp.total_steps, "steps_per_epoch": exp.steps_per_epoch}
  with open(os.path.join(workdir, "environment.json"), "w") as f:
    json.dump(env, f, indent=2)
  # What predict/export need to rebuild the model without the dataset at hand.
  with open(os.path.join(workdir, "classes.json"), "w") as f:
    json.dump({"num_classes": exp.num_classes, "class_names": exp.class_names}, f, indent=2)


def _check_workdir_path(workdir: str) -> None:
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise UserError(f"--workdir {workdir} is a file, not a directory: give a directory "
                    f"(it is created if missing)")


def _lock_workdir(stack: contextlib.ExitStack, workdir: str) -> None:
  """Process 0 locks the workdir; every process stops if it could not."""
  error = None
  if jax.process_index() == 0:
    try:
      stack.enter_context(workdir_lib.WorkdirLock(workdir))
    except workdir_lib.WorkdirLockedError as e:
      error = e
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    if np.any(multihost_utils.process_allgather(np.array(error is not None))):
      raise error or workdir_lib.WorkdirLockedError(f"process 0 could not lock {workdir}")
  elif error is not None:
    raise error


def _has_checkpoints(workdir: str) -> bool:
  directory = os.path.join(workdir, "checkpoints")
  return os.path.isdir(directory) and any(d.isdigit() for d in os.listdir(directory))


def train_and_evaluate(config, workdir: str, accept_config_changes=()) -> dict:
  """Trains (resuming from WORKDIR/checkpoints if present) and returns the final eval metrics.

  `accept_config_changes`: config keys (or "all") that may differ from the
  workdir's config.json on resume, beyond those that always may (workdir.RESUMABLE).
  """
  config_io.validate(config)
  _check_workdir_path(workdir)
  os.makedirs(workdir, exist_ok=True)
  with contextlib.ExitStack() as stack:
    _lock_workdir(stack, workdir)
    signals = stack.enter_context(_StopSignals())
    return _train(config, workdir, tuple(accept_config_changes), signals)


def _train(config, workdir: str, accept: tuple, signals: _StopSignals) -> dict:
  config = pretrained.resolve_config(config, workdir)  # the preprocessing init.weights expect
  config_json = config.to_json_best_effort(indent=2)
  config_dict = json.loads(config_json)
  # Before anything is written: is this the run the checkpoints came from?
  changes = workdir_lib.check_config(workdir, config_dict, accept) if _has_checkpoints(workdir) else {}
  exp = Experiment(config, workdir)
  is_chief = exp.process_index == 0
  checkpoints = ckpt.Checkpoints(workdir, config.keep_checkpoints, config.async_checkpointing)

  image_size = exp.train_image_size(0)
  loader_iter = iter(exp.train_loader(image_size))
  state, start_step = checkpoints.restore_newest(exp.abstract_state, loader_iter)
  if state is None:
    state, start_step = exp.init_state(), 0
    logging.info("no checkpoint in %s: starting from scratch", workdir)
  else:
    print(f"resumed from checkpoint at step {start_step} in {workdir}/checkpoints", flush=True)
  iterator_state = loader_iter.get_state()
  if is_chief:
    _write_run_info(workdir, config_json, exp, changes, start_step)
    # Records past the restored step describe a model that no longer exists.
    drop_records_after(workdir, start_step)
  writer = MetricWriter(workdir, enabled=is_chief)
  writer.write_config(config_json)

  total = exp.total_steps
  print(f"training {config.model.name} on {config.data.source}: {total} steps "
        f"({exp.steps_per_epoch} per epoch), global batch {config.batch_size} on "
        f"{exp.mesh.devices.size} {jax.default_backend()} device(s), precision {config.precision}",
        flush=True)
  progress = Progress(total, config.batch_size, start_step, enabled=is_chief)
  history = []
  prefetched = collections.deque()
  fp16 = exp.policy.uses_loss_scale
  profiler = StepProfiler(config.profile_steps, os.path.join(workdir, "tensorboard"), enabled=is_chief)

  def fill():
    # Batches go to the devices ahead of the step that uses them (transfers are
    # async); each carries the iterator position *after* it, for checkpoints.
    while len(prefetched) < max(config.data.prefetch, 1):
      local = next(loader_iter)
      prefetched.append((parallel.to_global(local, exp.batch_sharding), loader_iter.get_state()))

  def save(step):
    _raise_if_non_finite(history, step, checkpoints, fp16)
    checkpoints.save(step, state, iterator_state, config_dict)

  record = {}
  try:
    step = start_step
    if step < total:
      fill()
      _compile_then_sync(exp.train_step, (state, prefetched[0][0]), "train_step compiled")
    while step < total:
      if exp.train_image_size(step) != image_size:
        # Progressive resizing: a new loader at the new size continues from the
        # position of the last consumed batch; batches prefetched at the old size
        # are dropped. The step recompiles once for the new shape.
        image_size = exp.train_image_size(step)
        loader_iter = iter(exp.train_loader(image_size))
        loader_iter.set_state(iterator_state)
        prefetched.clear()
        if is_chief:
          print(f"step {step}: training resolution is now {image_size}px", flush=True)
      fill()
      batch, iterator_state = prefetched.popleft()
      with profiler.step(step + 1) as traced, jax.transfer_guard(_TRANSFER_GUARD):
        state, metrics = exp.train_step(state, batch)
        traced.append(state)
      history.append(metrics)
      step += 1

      record = {}
      log_now = step == total or itstime(step, config.log_every_steps, total)
      if log_now:
        _raise_if_non_finite(history, step, checkpoints, fp16)
        record = _mean_metrics(history)
        record["train/window_steps"] = len(history)  # fewer than log_every_steps after a resume
        history = []
        record["train/images_per_sec"] = progress.rate(step)
        record["train/epoch"] = step / exp.steps_per_epoch
        record["time"] = progress.elapsed()  # seconds since this process started training
        progress.report(step, record, record["train/images_per_sec"], config.log_every_steps)

      if itstime(step, exp.eval_every, total):  # the final eval comes after the loop
        eval_metrics = exp.evaluate(state)
        record.update(eval_metrics, time=progress.elapsed())
        if is_chief:
          print(f"eval at step {step}: top1 {eval_metrics['eval/top1']:.4f}  "
                f"loss {eval_metrics['eval/loss']:.4f}", flush=True)
      # One line per step, appended once (readers tail the file): a step's train and eval
      # metrics together; the final step's line waits for the final eval.
      if record and step != total:
        writer.write(step, record)

      if itstime(step, exp.checkpoint_every, total):  # so does the final save
        save(step)

      if step < total and signals.should_stop(sync=log_now):  # at total the run ends anyway
        save(step)
        checkpoints.wait()
        print(f"{'interrupted' if signals.received == 'SIGINT' else 'preempted'}: checkpoint saved "
              f"at step {step}; rerun the same command to resume", flush=True)
        return {"preempted_at_step": step, "signal": signals.received}

    if step > start_step or checkpoints.newest_intact != step:
      save(step)
    eval_metrics = exp.evaluate(state)
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
    profiler.stop()
    writer.close()
    try:
      checkpoints.close()
    except UserError:
      if sys.exc_info()[0] is None:  # not already failing: this is the error to report
        raise


def evaluate_checkpoint(config, workdir: str, step: int | None = None) -> dict:
  """`--mode=eval`: evaluates the latest (or given) checkpoint of WORKDIR and records eval metrics.

  Reads the workdir only, apart from appending to metrics.jsonl (skipped with a
  warning where the workdir is read-only). A damaged checkpoint is an error.
  """
  config_io.validate(config)
  checkpoints = ckpt.Checkpoints(workdir, read_only=True)
  config = pretrained.resolve_config(config, workdir)
  try:
    step = checkpoints.resolve_step(step)
    exp = Experiment(config, workdir, need_train_data=False)
    state = checkpoints.restore(step, exp.abstract_state)
  finally:
    checkpoints.manager.close()
  metrics = exp.evaluate(state)
  if exp.process_index == 0:
    print(f"eval of checkpoint {step}: top-1 {metrics['eval/top1']:.4f}  top-5 "
          f"{metrics['eval/top5']:.4f}  loss {metrics['eval/loss']:.4f}  "
          f"({metrics['eval/examples']} examples)", flush=True)
    try:
      writer = MetricWriter(workdir)
      writer.write(step, metrics)
      writer.close()
    except OSError as e:
      print(f"warning: could not record the eval metrics in {workdir}/metrics.jsonl "
            f"({e.strerror or e})", file=sys.stderr, flush=True)
  return metrics
