"""The training loop: build -> restore -> for each step: batch -> train_step -> log -> checkpoint -> eval.

Everything numerical lives in steps.py (loss, gradients), parallel.py (mesh,
shardings) and data/ (batches); this file only orders them in time.
"""

import collections
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxnet import checkpoint as ckpt
from jaxnet import mixing, models, optim, parallel, precision, steps
from jaxnet.data import pipeline, sources
from jaxnet.metrics import MetricWriter, Progress
from jaxnet.state import TrainState, init_state


class NonFiniteLossError(RuntimeError):
  pass


def build_model(config, num_classes: int, bn_num_groups: int = 1):
  """The model of `config` (also used by jaxnet.api to rebuild a trained model).

  bn_num_groups only changes how training computes BN statistics, not the
  variables, so inference can rebuild the model with the default of 1.
  Each model gets the config.model options it has (BN settings, ViT flavour).
  """
  m = config.model
  accepts = models.options(m.name)
  if m.bn_group_size and "bn_num_groups" not in accepts:
    raise ValueError(f"config.model.bn_group_size={m.bn_group_size}, but {m.name} has no batch norm; "
                     "leave it at 0")
  if m.vit_flavour != "timm" and "flavour" not in accepts:
    raise ValueError(f"config.model.vit_flavour={m.vit_flavour!r} applies to ViTs, not {m.name}")
  given = dict(bn_momentum=m.bn_momentum, bn_epsilon=m.bn_epsilon, bn_num_groups=bn_num_groups,
               zero_init_last_bn=m.zero_init_last_bn, flavour=m.vit_flavour)
  return models.create(m.name, num_classes=num_classes,
                       dtype=precision.get_policy(config.precision).compute_dtype,
                       **{k: v for k, v in given.items() if k in accepts})


class Experiment:
  """Everything built from a config before the first step: data, model, optimizer, jitted steps."""

  def __init__(self, config, workdir: str, *, need_train_data: bool = True):
    self.config, self.workdir = config, workdir
    self.mesh = parallel.make_mesh(config.mesh.num_devices)
    parallel.check_batch_size(config.batch_size, self.mesh)
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
    self.total_steps = config.total_steps or math.ceil(config.num_epochs * self.steps_per_epoch)

    self.model = build_model(config, self.num_classes,
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
                                       **norm)
    eval_step = steps.make_eval_step(self.model, self.policy, use_ema=config.ema_decay > 0, **norm)
    # Jitted once, with explicit shardings; the old state's buffers are donated
    # so params and optimizer state are updated in place.
    self.train_step = jax.jit(train_step, in_shardings=(self.state_sharding, self.batch_sharding),
                              out_shardings=(self.state_sharding, replicated), donate_argnums=0)
    self.eval_step = jax.jit(eval_step, in_shardings=(self.state_sharding, self.batch_sharding),
                             out_shardings=replicated)

  def init_state(self) -> TrainState:
    return self._init()

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
        process_count=self.process_count, crop_fraction=c.data.eval_crop_fraction):
      batch = parallel.to_global(local, self.batch_sharding)
      if sums is None:
        _compile_then_sync(self.eval_step, (state, batch), "eval_step compiled")
      out = self.eval_step(state, batch)
      sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
    sums = jax.device_get(sums)
    count = max(float(sums["count"]), 1.0)
    return {"eval/loss": float(sums["loss"]) / count, "eval/top1": float(sums["top1"]) / count,
            "eval/top5": float(sums["top5"]) / count, "eval/examples": int(sums["count"])}


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


class _Preemption:
  """Turns SIGTERM into a flag the loop checks between steps."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread (e.g. some notebook runners): no handler
      self._previous = None
    return self

  def _handle(self, signum, frame):
    del signum, frame
    logging.warning("SIGTERM received: saving a checkpoint and exiting after this step")
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)

  def should_stop(self, step: int, sync: bool) -> bool:
    if jax.process_count() == 1:
      return self.requested
    if not sync:
      return False
    # Every process must stop at the same step, or the collective save would hang.
    from jax.experimental import multihost_utils
    return bool(np.any(multihost_utils.process_allgather(np.array(self.requested))))


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


def _write_run_info(workdir: str, config, exp: Experiment) -> None:
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
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


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains (resuming from WORKDIR/checkpoints if present) and returns the final eval metrics."""
  os.makedirs(workdir, exist_ok=True)
  exp = Experiment(config, workdir)
  is_chief = exp.process_index == 0
  writer = MetricWriter(workdir, enabled=is_chief)
  if is_chief:
    _write_run_info(workdir, config, exp)
  manager = ckpt.make_manager(workdir, config.keep_checkpoints, config.async_checkpointing)
  config_dict = json.loads(config.to_json_best_effort())

  image_size = exp.train_image_size(0)
  loader_iter = iter(exp.train_loader(image_size))
  state, start_step = ckpt.restore(manager, exp.abstract_state, loader_iter)
  if state is None:
    state, start_step = exp.init_state(), 0
    logging.info("no checkpoint in %s: starting from scratch", workdir)
  else:
    print(f"resumed from checkpoint at step {start_step} in {workdir}/checkpoints", flush=True)
  iterator_state = loader_iter.get_state()

  total = exp.total_steps
  print(f"training {config.model.name} on {config.data.source}: {total} steps "
        f"({exp.steps_per_epoch} per epoch), global batch {config.batch_size} on "
        f"{exp.mesh.devices.size} {jax.default_backend()} device(s), precision {config.precision}",
        flush=True)
  progress = Progress(total, config.batch_size, start_step, enabled=is_chief)
  history = []
  prefetched = collections.deque()

  def fill():
    # Batches go to the devices ahead of the step that uses them (transfers are
    # async); each carries the iterator position *after* it, for checkpoints.
    while len(prefetched) < max(config.data.prefetch, 1):
      local = next(loader_iter)
      prefetched.append((parallel.to_global(local, exp.batch_sharding), loader_iter.get_state()))

  def save(step):
    return ckpt.save(manager, step, state, iterator_state, config_dict)

  step = start_step
  if step < total:
    fill()
    _compile_then_sync(exp.train_step, (state, prefetched[0][0]), "train_step compiled")
  with _Preemption() as preemption:
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
      state, metrics = exp.train_step(state, batch)
      history.append(metrics)
      step += 1

      log_now = step == total or bool(config.log_every_steps and step % config.log_every_steps == 0)
      if log_now:
        logged = _mean_metrics(history)
        history = []
        if not math.isfinite(logged["train/loss"]):
          raise NonFiniteLossError(
              f"train/loss is {logged['train/loss']} at step {step}. The last checkpoint "
              f"(step {manager.latest_step()}) is intact. Lower optim.learning_rate, add "
              f"optim.warmup_epochs or optim.grad_clip_norm, or use precision=bf16/fp32 instead of fp16.")
        logged["train/images_per_sec"] = progress.rate(step)
        logged["train/epoch"] = step / exp.steps_per_epoch
        logged["time"] = progress.elapsed()  # seconds since this process started training
        progress.report(step, logged, logged["train/images_per_sec"])
        writer.write(step, logged)

      if config.eval_every_steps and step % config.eval_every_steps == 0 and step != total:
        eval_metrics = exp.evaluate(state)
        writer.write(step, {**eval_metrics, "time": progress.elapsed()})
        if is_chief:
          print(f"eval at step {step}: top1 {eval_metrics['eval/top1']:.4f}  "
                f"loss {eval_metrics['eval/loss']:.4f}", flush=True)

      if config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0 and step != total:
        save(step)

      if preemption.should_stop(step, sync=log_now):
        save(step)
        manager.wait_until_finished()
        print(f"preempted: checkpoint saved at step {step}; rerun the same command to resume",
              flush=True)
        writer.close()
        manager.close()
        return {"preempted_at_step": step}

  if step > start_step or manager.latest_step() != step:
    save(step)
  eval_metrics = exp.evaluate(state)
  elapsed = progress.elapsed()
  writer.write(step, {**eval_metrics, "train/elapsed_sec": elapsed, "time": elapsed})
  manager.wait_until_finished()
  manager.close()
  writer.close()
  if is_chief:
    print(f"final: step {step}  test top-1 {eval_metrics['eval/top1']:.4f}  "
          f"top-5 {eval_metrics['eval/top5']:.4f}  loss {eval_metrics['eval/loss']:.4f}  "
          f"({elapsed:.1f}s)", flush=True)
  return eval_metrics


def evaluate_checkpoint(config, workdir: str, step: int | None = None) -> dict:
  """`--mode=eval`: evaluates the latest (or given) checkpoint of WORKDIR and records eval metrics."""
  exp = Experiment(config, workdir, need_train_data=False)
  manager = ckpt.make_manager(workdir, config.keep_checkpoints, async_save=False)
  if manager.latest_step() is None:
    raise FileNotFoundError(f"no checkpoint in {os.path.join(workdir, 'checkpoints')}: train first "
                            f"(python -m jaxnet.main --config=... --workdir={workdir})")
  state, step = ckpt.restore(manager, exp.abstract_state, None, step)
  metrics = exp.evaluate(state)
  if exp.process_index == 0:
    writer = MetricWriter(workdir)
    writer.write(step, metrics)
    writer.close()
    print(f"eval of checkpoint {step}: top-1 {metrics['eval/top1']:.4f}  top-5 "
          f"{metrics['eval/top5']:.4f}  loss {metrics['eval/loss']:.4f}  "
          f"({metrics['eval/examples']} examples)", flush=True)
  manager.close()
  return metrics
