"""The train step: one pure function of (state, batch) for every task, jitted once by the loop.

What is the same for every task lives here: the model applied in the policy's compute dtype
to normalised images, the loss scaled (fp16) and its gradients, micro-batches
(`grad_accum_steps`), FSDP's gathers and reduce-scatters, the optimizer's update, the EMA,
the step's key and the metrics every step reports. What differs (which loss, which metrics,
mixup for a classifier, anchors for a detector) is the task's loss function
(jaxnet/core/tasks), passed in.

Gradients are averaged over the global batch by construction: the loss is a sum over the
whole (sharded) batch over its example count, so XLA inserts the cross-device all-reduce in
the backward pass; there is no explicit pmean anywhere.
"""

import dataclasses

import jax
import jax.numpy as jnp
import optax

from jaxnet.core.state import Policy, TrainState, all_finite, select_tree, step_key


def normalize(images, mean, std, dtype):
  """uint8 NHWC -> normalised compute-dtype NHWC, on the device (fuses into the first conv)."""
  x = images.astype(jnp.float32) * (1.0 / 255.0)
  return ((x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)).astype(dtype)


# How the training loop summarises the train step's metrics over a log window:
# per-step counts add up, running totals and the current loss scale are read at
# the window's end, and every other metric is the window's mean.
WINDOW_REDUCTION = {"data/corrupt_images": "sum", "train/skipped_steps": "last",
                    "train/loss_scale": "last"}


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """How a train step runs, whatever the task: the normalisation of its uint8 images, the
  EMA's decay (0: no EMA), the micro-batches one step is split into, and FSDP's gathers
  (a jaxnet.core.sharding.Gather, or None when the params are whole on every device)."""
  mean: tuple
  std: tuple
  ema_decay: float = 0.0
  grad_accum_steps: int = 1
  fsdp: object = None


def make_train_step(model, tx, schedule, policy: Policy, loss, options: StepOptions):
  """Returns `train_step(state, batch) -> (state, metrics)`.

  `loss(apply, batch, key) -> (loss sum, {metric: sum})` is the task's (jaxnet/core/tasks):
  `apply(images)` is the model in training mode on the batch's images (uint8, or float after
  mixup), normalised here. Both sums are over the batch's real examples (mask=True: padding
  and unreadable images contribute nothing), and the step divides them by the whole batch's
  example count, so micro-batches add up to the whole batch. Randomness (dropout, the task's
  draws) comes from `jaxnet.core.state.step_key(state)`: seed and step only.

  `options.grad_accum_steps` K > 1 splits the batch into K micro-batches inside this one step
  (a lax.scan) and sums their gradients: the update is the whole batch's, with the activations
  of one micro-batch in memory at a time. Batch norm normalises each micro-batch with its own
  statistics, and its running statistics move once per micro-batch.

  `options.fsdp`: the params are split over the devices. The step gathers them whole where the
  model uses them, and gives each device the gradient slice of the params it holds (XLA's
  reduce-scatter, where data parallelism all-reduces).
  """
  o = options
  gather = o.fsdp.params if o.fsdp else (lambda params: params)
  scatter = o.fsdp.grads if o.fsdp else (lambda grads: grads)

  def loss_fn(params, batch_stats, batch, key, count, loss_scale):
    dropout_key, task_key = jax.random.split(key)
    new_stats = []

    def apply(images):
      out, updates = model.apply(
          {"params": gather(params), "batch_stats": batch_stats},
          normalize(images, o.mean, o.std, policy.compute_dtype), train=True,
          mutable=["batch_stats"], rngs={"dropout": dropout_key})
      # Models without batch norm return no batch_stats: the state keeps its empty {}.
      new_stats.append(updates.get("batch_stats", batch_stats))
      return out

    total, sums = loss(apply, batch, task_key)
    value = total / count
    scaled = value * loss_scale if policy.uses_loss_scale else value
    return scaled, (value, {k: v / count for k, v in sums.items()}, new_stats[-1])

  grad_fn = jax.grad(loss_fn, has_aux=True)

  def gradients(state: TrainState, batch, count):
    """(grads, loss, the task's metrics, new batch_stats) of the whole batch of `count` examples."""
    key, scale = step_key(state), state.loss_scale.scale
    if o.grad_accum_steps == 1:
      grads, (value, metrics, stats) = grad_fn(state.params, state.batch_stats, batch, key, count, scale)
      return grads, value, metrics, stats

    # Micro-batch k takes every K-th example, so each device keeps its own examples
    # (the batch axis stays sharded over the mesh) instead of one device per micro-batch.
    k_steps = o.grad_accum_steps
    micro = jax.tree.map(
        lambda x: jnp.moveaxis(x.reshape(x.shape[0] // k_steps, k_steps, *x.shape[1:]), 1, 0), batch)

    def accumulate(carry, inputs):
      grads, stats, value, metrics = carry
      micro_batch, k = inputs
      g, (v, m, stats) = grad_fn(state.params, stats, micro_batch, jax.random.fold_in(key, k), count, scale)
      return (jax.tree.map(jnp.add, grads, g), stats, value + v, jax.tree.map(jnp.add, metrics, m)), None

    first = jax.tree.map(lambda x: x[0], micro)
    metric_shapes = jax.eval_shape(lambda: grad_fn(state.params, state.batch_stats, first, key, count,
                                                   scale)[1][1])
    zeros = jax.tree.map(jnp.zeros_like, state.params)
    metric_zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), metric_shapes)
    (grads, stats, value, metrics), _ = jax.lax.scan(
        accumulate, (zeros, state.batch_stats, jnp.float32(0), metric_zeros),
        (micro, jnp.arange(k_steps)))
    return grads, value, metrics, stats

  def train_step(state: TrainState, batch):
    count = jnp.maximum(jnp.sum(batch["mask"].astype(jnp.float32)), 1.0)  # real examples
    grads, value, task_metrics, new_batch_stats = gradients(state, batch, count)
    with jax.named_scope("optimizer"):  # the scopes name the step's kernels (jaxnet.tools.hlo.layer_of)
      new_state, grads, finite = apply_gradients(state, scatter(grads), new_batch_stats, tx, policy)
    loss_scale = new_state.loss_scale

    if o.ema_decay:
      with jax.named_scope("ema"):
        ema = jax.tree.map(lambda e, p: o.ema_decay * e + (1 - o.ema_decay) * p, state.ema_params,
                           new_state.params)
        if policy.uses_loss_scale:
          # A skipped step must not pull the EMA towards the (unchanged) params either.
          ema = select_tree(finite, ema, state.ema_params)
    else:
      ema = None  # no EMA: no second copy of the params
    new_state = new_state.replace(ema_params=ema)
    with jax.named_scope("metrics"):
      metrics = {
          "train/loss": value,
          **task_metrics,
          "train/learning_rate": schedule(state.step),
          "train/grad_norm": global_norm(grads, one_reduction=o.fsdp is None),
          "data/corrupt_images": jnp.sum(batch["corrupt"]),
      }
    if policy.uses_loss_scale:
      metrics["train/loss_scale"] = loss_scale.scale
      metrics["train/skipped_steps"] = loss_scale.skipped_steps
    return new_state, metrics

  return train_step


def apply_gradients(state: TrainState, grads, batch_stats, tx, policy: Policy):
  """The update a train step ends with:
  gradients unscaled under loss scaling, the optimizer's step, the step count. Returns
  (the new state, the unscaled gradients, `finite`: under loss scaling whether they were all
  finite, else None). fp16: a step with inf/nan gradients changes nothing but the scale."""
  if policy.uses_loss_scale:
    grads = jax.tree.map(lambda g: g / state.loss_scale.scale, grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  loss_scale, finite = state.loss_scale, None
  if policy.uses_loss_scale:
    finite = all_finite(grads)
    params = select_tree(finite, params, state.params)
    opt_state = select_tree(finite, opt_state, state.opt_state)
    batch_stats = select_tree(finite, batch_stats, state.batch_stats)
    loss_scale = loss_scale.update(finite)
  new_state = state.replace(step=state.step + 1, params=params, batch_stats=batch_stats,
                            opt_state=opt_state, loss_scale=loss_scale)
  return new_state, grads, finite


def global_norm(tree, one_reduction: bool = True):
  """The L2 norm of all leaves together (optax.tree.norm's value). `one_reduction`: the leaves
  flattened into one vector and reduced once, where a reduction per leaf costs a kernel each
  (about 100 of a ResNet-50 step's ~1,500 on a GPU: jaxnet.cli.gpu_plan). Not for leaves split
  over devices (FSDP): joining them would gather them."""
  leaves = [x.astype(jnp.float32) for x in jax.tree.leaves(tree)]
  if not one_reduction:
    return optax.tree.norm(leaves)
  return jnp.sqrt(jnp.sum(jnp.square(jnp.concatenate([x.ravel() for x in leaves]))))


def eval_variables(params, ema_params, batch_stats, use_ema: bool) -> dict:
  """The model variables eval uses: EMA params when the run keeps an EMA.

  Models without batch norm get no `batch_stats` entry, as their init returns none.
  """
  variables = {"params": ema_params if use_ema else params}
  if batch_stats:
    variables["batch_stats"] = batch_stats
  return variables


def make_logits_fn(model, policy: Policy, *, mean, std):
  """Returns `logits_fn(variables, images)`: the model in eval mode on uint8 NHWC images,
  normalised inside (a classifier's logits; a detector's head outputs)."""

  def logits_fn(variables, images):
    x = normalize(images, mean, std, policy.compute_dtype)
    return model.apply(variables, x, train=False)

  return logits_fn


def make_predict_fn(model, policy: Policy, outputs, *, mean, std):
  """Returns `predict_fn(variables, images)`: what a restored model computes for uint8 NHWC
  images, `outputs(apply, images)` (the task's predict_outputs) with `apply(images)` the
  model in eval mode, normalised inside. The eval step, the Python API's predictor and the
  exports (jaxnet/tools) all run the model through this one function."""
  logits_fn = make_logits_fn(model, policy, mean=mean, std=std)

  def predict_fn(variables, images):
    return outputs(lambda x: logits_fn(variables, x), images)

  return predict_fn


def make_eval_step(model, policy: Policy, outputs, options: StepOptions):
  """Returns `eval_step(state, batch) -> outputs(apply, batch)` (the task's eval_outputs),
  `apply(images)` being the model in eval mode with the params eval uses: the EMA's when the
  run keeps one (`options.ema_decay`), gathered whole under FSDP (`options.fsdp`), on images
  normalised with `options.mean` and `options.std`."""
  logits_fn = make_logits_fn(model, policy, mean=options.mean, std=options.std)
  gather = options.fsdp.params if options.fsdp else (lambda params: params)

  def eval_step(state: TrainState, batch):
    variables = eval_variables(state.params, state.ema_params, state.batch_stats, options.ema_decay > 0)
    variables = {**variables, "params": gather(variables["params"])}
    return outputs(lambda images: logits_fn(variables, images), batch)

  return eval_step
