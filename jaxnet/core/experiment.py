"""Everything built from a config before the first step: mesh, data sources, model,
optimizer, and the jitted train and eval steps with their shardings.

Training and evaluation (jaxnet/core/train.py) both start here, and so does the GPU plan
(jaxnet/tools/gpu_plan.py), which builds it over the devices of a GPU it compiles for.
"""

import jax
import jax.numpy as jnp

from jaxnet.core import models, optim, sharding, steps, tasks
from jaxnet.core.config import duration_in_steps
from jaxnet.core.data import pipeline, sources
from jaxnet.core.errors import InvalidValueError
from jaxnet.core.state import TrainState, get_policy, init_state, start_state


class Experiment:
  """Everything built from a config before the first step: data, model, optimizer, jitted steps."""

  # The Grain train loader's elements: "batches" (whole batches, pipeline.TrainBatches), or
  # "records" for a run resuming a data position a record-level loader saved (jaxnet before
  # 2026-11-29), which only that loader replays: set before the train batches are made.
  data_elements = "batches"

  def __init__(self, config, *, need_train_data: bool = True, devices=None,
               classes_without_data: int | None = None):
    """`devices`: the devices to build the mesh over (default: jax.devices()).
    `classes_without_data`: build no data sources (a weights import with --no-data): the head
    is config.model.num_classes wide, or this many classes where that is 0; the images have
    as many channels as data.mean; there are no class names, no epoch and no run length
    (steps_per_epoch and total_steps None: a training of it reads its data and knows them)."""
    self.config = config  # whole (config.load): the model's options among its keys
    self.process_index, self.process_count = jax.process_index(), jax.process_count()
    self.policy = get_policy(config.precision)
    # The task (jaxnet/core/tasks) decides which data the model reads and what it learns.
    self.task = tasks.for_model(config.model.name)
    self.task.check_data(config)
    self.task.check_config(config)
    self._build_mesh(devices)
    if classes_without_data is None:
      self._build_data(need_train_data)
    else:
      self._build_without_data(classes_without_data)
    self._build_model_and_optimizer()
    self._build_state()
    self._build_steps()

  def _build_mesh(self, devices) -> None:
    c = self.config
    self.mesh = sharding.make_mesh(c.mesh.num_devices, devices, fsdp=c.mesh.fsdp,
                                   fsdp_devices=c.mesh.fsdp_devices)
    # The eval batch is checked now, not after training when the first eval runs.
    sharding.check_batch_sizes(self.mesh, c.batch_size, c.grad_accum_steps, c.data.eval_batch_size)
    self.batch_sharding = sharding.batch_sharding(self.mesh)

  def _build_data(self, need_train_data: bool) -> None:
    """The task's sources, what they hold (classes, channels), the run's length in steps."""
    c = self.config
    # data.workers=-1: a worker per core (pipeline.worker_count)
    self.data_workers = pipeline.worker_count(c.data.workers)
    self.train_source = self.task.make_source(c, "train") if need_train_data else None
    self.eval_source = self.task.make_source(c, "eval")
    ref = self.train_source or self.eval_source
    # What the data sources skipped (hidden folders, Thumbs.db, ...) or changed (a detection
    # source's clipped boxes, ...), for the caller to show.
    notes = [sources.ignored_note([self.train_source, self.eval_source])]
    notes += [getattr(s, "note", None) for s in (self.train_source, self.eval_source)]
    self.data_note = "\n".join(n for n in notes if n) or None
    self.num_classes = _head_size(c.model.num_classes, ref.num_classes, c.data.source)
    self.class_names = getattr(ref, "class_names", None)
    channels = ref[0]["image"].shape[-1] if not ref.encoded else 3
    self.image_shape = (c.image_size, c.image_size, channels)
    _check_loader(c, [s for s in (self.train_source, self.eval_source) if s is not None], channels,
                  ref.encoded)
    # A train set with nothing readable stops when its loader is made; an eval set would only
    # show at the first eval, after the training it was meant to judge, with top-1 0/0.
    pipeline.check_some_example_reads(self.eval_source, "eval")
    train_len = len(self.train_source) if self.train_source is not None else c.batch_size
    self.steps_per_epoch = max(train_len // c.batch_size, 1)
    self.total_steps = duration_in_steps(c, "total", self.steps_per_epoch)
    self.eval_every = duration_in_steps(c, "eval_every", self.steps_per_epoch)
    self.checkpoint_every = duration_in_steps(c, "checkpoint_every", self.steps_per_epoch)

  def _build_without_data(self, classes: int) -> None:
    """What _build_data knows, for a model built without data (a weights import)."""
    c = self.config
    self.data_workers = pipeline.worker_count(c.data.workers)
    self.train_source = self.eval_source = None
    self.data_note, self.class_names = None, None
    self.num_classes = c.model.num_classes or classes
    self.image_shape = (c.image_size, c.image_size, len(c.data.mean))
    self.steps_per_epoch = self.total_steps = self.eval_every = self.checkpoint_every = None

  def _build_model_and_optimizer(self) -> None:
    c = self.config
    self.model = models.from_config(c.model, self.num_classes, self.policy.compute_dtype,
                                    sharding.bn_num_groups(c.bn_group_size, self.mesh)
                                    if c.bn_group_size else None)
    # Without data there is no run length: any schedule gives the optimizer the same state.
    total, per_epoch = self.total_steps or 1, self.steps_per_epoch or 1
    self.schedule = optim.learning_rate_schedule(
        c.optim, c.batch_size, total, warmup_steps=duration_in_steps(c, "warmup", per_epoch))
    self.tx = optim.make_optimizer(c.optim, self.schedule)

  def _build_state(self) -> None:
    """The state's shapes (nothing allocated), its shardings, and the jitted init."""
    c, m = self.config, self.config.mesh
    init = lambda: init_state(self.model, self.tx, self.image_shape, c.seed, c.loss_scale,
                              keep_ema=c.ema_decay > 0)
    abstract_state = jax.eval_shape(init)
    self.state_sharding = sharding.state_shardings(abstract_state, self.mesh, m.fsdp, m.fsdp_min_size)
    self.fsdp_summary = (sharding.summarize(abstract_state, self.state_sharding, m.fsdp_min_size)
                         if m.fsdp else None)
    self.abstract_state = sharding.abstract(abstract_state, self.state_sharding)
    self._init_fn = init
    self._init = jax.jit(init, out_shardings=self.state_sharding)
    # A state from given variables (init_state's init_params): no model in it, so it compiles at
    # once. Its EMA is added after (init_state): one buffer cannot hold two fields of the state.
    self._start = jax.jit(lambda variables: start_state(variables, self.tx, c.seed, c.loss_scale),
                          out_shardings=self.state_sharding.replace(ema_params=None))
    norm = dict(mean=tuple(c.data.mean), std=tuple(c.data.std))
    # FSDP: how the steps gather the params (None: they are whole on every device already).
    self.fsdp_gather = self._fsdp_gather(abstract_state, norm) if m.fsdp else None

  def _build_steps(self) -> None:
    """The train step with the task's loss and the task's eval step, each jitted once with
    explicit shardings; the train step donates the old state, updated in place."""
    c = self.config
    mean, std = tuple(c.data.mean), tuple(c.data.std)
    loss = self.task.loss(self.model, c, self.num_classes, sharding.batch_devices(self.mesh))
    options = steps.StepOptions(mean, std, c.ema_decay, c.grad_accum_steps, self.fsdp_gather)
    train_step = steps.make_train_step(self.model, self.tx, self.schedule, self.policy, loss, options)
    eval_step = steps.make_eval_step(self.model, self.policy,
                                     self.task.eval_outputs(self.model, c, self.num_classes), options)
    replicated = sharding.replicated(self.mesh)
    self.train_step = jax.jit(train_step, in_shardings=(self.state_sharding, self.batch_sharding),
                              out_shardings=(self.state_sharding, replicated), donate_argnums=0)
    self.eval_step = jax.jit(eval_step, in_shardings=(self.state_sharding, self.batch_sharding),
                             out_shardings=replicated)

  def _fsdp_gather(self, abstract_state, norm: dict) -> sharding.Gather:
    """The steps' gather, with the params the model only uses in the compute dtype cast first."""
    logits_fn = steps.make_logits_fn(self.model, self.policy, mean=norm["mean"], std=norm["std"])
    image = jnp.zeros((1,) + self.image_shape, jnp.uint8)
    apply = lambda params, stats: logits_fn(steps.eval_variables(params, None, stats, False), image)
    cast = sharding.cast_on_use(apply, abstract_state.params, self.policy.compute_dtype,
                            abstract_state.batch_stats)
    return sharding.Gather(self.state_sharding.params, cast)

  def init_state(self, init_params=None) -> TrainState:
    """A fresh state. `init_params(variables) -> variables` gives the initial params and BN
    statistics instead, e.g. pretrained weights (jaxnet/tools/weights): it is handed the
    abstract variables ({"params", "batch_stats"} of jax.ShapeDtypeStructs with their dtypes
    and shardings) and returns, for each, an array of that shape, dtype and sharding, or the
    abstract leaf itself where the model's own init is wanted (a new class layer). Only those
    leaves are computed by the init; the rest of the model's init is never compiled."""
    if init_params is None:
      return self._init()
    abstract = self.abstract_state
    variables = self._with_init_where_abstract(
        init_params({"params": abstract.params, "batch_stats": abstract.batch_stats}))
    state = self._start(variables)
    # The EMA starts at the initial params, in buffers of its own: the train step donates
    # the state, and one buffer cannot be donated twice.
    ema = jax.tree.map(jnp.copy, state.params) if abstract.ema_params is not None else None
    return state.replace(ema_params=ema)

  def _with_init_where_abstract(self, variables: dict) -> dict:
    """`variables` with each abstract leaf replaced by the model's init of it, bit for bit the
    value a fresh state has: one jit of the init with only those outputs, the rest of which
    XLA removes as dead code before it compiles."""
    leaves, treedef = jax.tree.flatten(variables)
    wanted = [i for i, x in enumerate(leaves) if isinstance(x, jax.ShapeDtypeStruct)]
    if not wanted:
      return variables
    pick = lambda tree: [jax.tree.leaves(tree)[i] for i in wanted]
    fresh = lambda s: {"params": s.params, "batch_stats": s.batch_stats}
    shardings = pick(fresh(self.state_sharding))
    computed = jax.jit(lambda: pick(fresh(self._init_fn())), out_shardings=shardings)()
    for i, value in zip(wanted, computed):
      leaves[i] = value
    return jax.tree.unflatten(treedef, leaves)

  def train_image_size(self, step: int) -> int:
    """The training resolution at `step` under config.progressive_resizing."""
    size = self.config.image_size
    for fraction, stage_size in self.config.progressive_resizing:
      if step >= fraction * self.total_steps:
        size = stage_size
    return size

  def train_loader(self, image_size: int | None = None):
    c = self.config
    if c.data.loader == "dali":
      from jaxnet.core.data import dali
      return dali.TrainLoader(self.train_source, global_batch_size=c.batch_size,
                              image_size=image_size or c.image_size, seed=c.seed,
                              process_index=self.process_index, process_count=self.process_count,
                              threads=max(self.data_workers, 1))
    size = image_size or c.image_size
    return pipeline.train_loader(
        self.train_source, global_batch_size=c.batch_size, image_size=size,
        transform=self.task.transform(self.train_source, size, True, c),
        seed=c.seed, workers=self.data_workers, read_threads=c.data.read_threads,
        process_index=self.process_index, process_count=self.process_count,
        randaug=(c.data.randaug_num_ops, c.data.randaug_magnitude),
        whole_batches=self.data_elements == "batches")

  def device_batches(self) -> pipeline.DeviceBatches:
    """The train batches on the devices, `data.prefetch` ahead of the step (a context manager)."""
    c = self.config
    return pipeline.DeviceBatches(self.train_loader, self.batch_sharding, self.train_image_size(0),
                                  c.data.prefetch, self.data_workers)

  def eval_batches(self):
    """The eval set once, in order, as global batches on the mesh (the last one padded, masked)."""
    c = self.config
    options = dict(global_batch_size=c.data.eval_batch_size or c.batch_size, image_size=c.image_size,
                   process_index=self.process_index, process_count=self.process_count,
                   crop_fraction=c.data.eval_crop_fraction, interpolation=c.data.eval_interpolation)
    if c.data.loader == "dali":
      from jaxnet.core.data import dali
      batches = dali.eval_batches(self.eval_source, threads=max(self.data_workers, 1), **options)
    else:
      batches = pipeline.eval_batches(self.eval_source, workers=self.data_workers,
                                      transform=self.task.transform(self.eval_source, c.image_size, False, c),
                                      **options)
    for local in batches:
      yield sharding.to_global(local, self.batch_sharding)


def _check_loader(config, sources_: list, channels: int, encoded: bool) -> None:
  """The normalisation fits the images, the loader exists and reads these sources, and
  progressive resizing has JPEGs to decode at other sizes."""
  if len(config.data.mean) != channels or len(config.data.std) != channels:
    raise InvalidValueError(f"config.data.mean/std have {len(config.data.mean)} values but images have "
                            f"{channels} channels")
  if config.data.loader == "dali":
    from jaxnet.core.data import dali
    dali.require()
    for source in sources_:
      dali.check_source(source, config.data.source, config.data.randaug_num_ops)
  if config.progressive_resizing and not encoded:
    raise InvalidValueError("config.progressive_resizing needs a JPEG source (imagefolder, tfds or prepared): "
                            f"{config.data.source} images have one fixed size")


def _head_size(model_num_classes: int, data_num_classes: int, source: str) -> int:
  """The classifier's width: config.model.num_classes, or the dataset's class count when 0.

  A head narrower than the dataset would silently train on wrong targets (a label
  past the last logit has an all-zero one-hot target), so that is an error.
  """
  if not model_num_classes:
    return data_num_classes
  if model_num_classes < data_num_classes:
    raise InvalidValueError(f"config.model.num_classes={model_num_classes}, but the {source} data has "
                            f"{data_num_classes} classes: labels past the head would train on all-zero "
                            f"targets. Set it to 0 (the dataset's count) or at least {data_num_classes}")
  return model_num_classes
