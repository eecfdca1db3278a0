"""The train and eval steps: pure functions of (state, batch), jitted once by the loop.

This is where the loss is computed. Gradients are averaged over the global batch
by construction: the loss is a mean over the whole (sharded) batch, so XLA
inserts the cross-device all-reduce in the backward pass; there is no explicit
pmean anywhere. What a step reads beyond this file: the state and the precision
policy (state.py), the FSDP gathers (sharding.py), the optimizer (optim.py, through
`tx`) and the model.

Mixup and CutMix run here too, on the device (`Mix`): each example is blended with
its neighbour (`roll` by one, as big_vision does) within its group of the batch, with one
ratio per batch. A group is one device's share of the batch by default (config.mix.groups
0), so a device pairs its own images and no image crosses between devices: the roll over the
whole batch moved every micro-batch's images between GPUs (all-to-alls, 92 MiB per GPU per
step for ViT-H/14 on 8 H100s, jaxnet.cli.gpu_plan).

  mixup   image = lam * x + (1 - lam) * x_partner,  lam ~ Beta(a, a)
  cutmix  a box of area ~(1 - lam) of the image comes from the partner,
          lam ~ Beta(a, a), then lam := 1 - (box area / image area) exactly
  targets = lam * t + (1 - lam) * t_partner  (each row still sums to 1)

`prob` is the chance that a batch is mixed at all; with both alphas set,
`switch_prob` is the chance of CutMix rather than mixup. A partner masked out
of the loss (an unreadable image, padding) is never mixed in: that example
keeps its own image and target. All draws come from the step's key, so
they depend on the seed and step only and a resumed run repeats them.
"""

import dataclasses

import jax
import jax.numpy as jnp
import optax

from jaxnet.core.errors import InvalidValueError
from jaxnet.core.state import Policy, TrainState, all_finite, select_tree, step_key


def normalize(images, mean, std, dtype):
  """uint8 NHWC -> normalised compute-dtype NHWC, on the device (fuses into the first conv)."""
  x = images.astype(jnp.float32) * (1.0 / 255.0)
  return ((x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)).astype(dtype)


def soft_targets(labels, num_classes, label_smoothing=0.0):
  """fp32 one-hot targets, optionally label-smoothed."""
  targets = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  if label_smoothing:
    targets = optax.smooth_labels(targets, label_smoothing)
  return targets


def cross_entropy(logits, labels, num_classes, label_smoothing=0.0):
  """Per-example fp32 cross-entropy with optional label smoothing."""
  targets = soft_targets(labels, num_classes, label_smoothing)
  return optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)


# How the training loop summarises the train step's metrics over a log window:
# per-step counts add up, running totals and the current loss scale are read at
# the window's end, and every other metric is the window's mean.
WINDOW_REDUCTION = {"data/corrupt_images": "sum", "train/skipped_steps": "last",
                    "train/loss_scale": "last"}


def make_train_step(model, tx, schedule, policy: Policy, *, num_classes: int,
                    mean, std, label_smoothing: float = 0.0, ema_decay: float = 0.0,
                    mix: "Mix | None" = None, grad_accum_steps: int = 1, fsdp=None):
  """Returns `train_step(state, batch) -> (state, metrics)`.

  `batch` holds `image` (uint8 NHWC), `label`, `mask` and `corrupt`; examples
  with mask=False (unreadable images) contribute nothing to loss or gradients.
  `mix` (mixup/cutmix) blends images and targets on the device; train/accuracy
  still counts the argmax against each example's own label.
  Randomness (dropout, mix) comes from `jaxnet.core.state.step_key(state)`: seed and step only.

  `grad_accum_steps` K > 1 splits the batch into K micro-batches inside this one
  step (a lax.scan) and sums their gradients: the update is that of the whole
  batch, with the activations of one micro-batch in memory at a time. Batch norm
  normalises each micro-batch with its own statistics, and its running statistics
  move once per micro-batch.

  `fsdp` (a jaxnet.core.sharding.Gather, or None): the params are split over the devices. The
  step then gathers them whole where the model uses them, and gives each device the
  gradient slice of the params it holds (XLA's reduce-scatter, where data
  parallelism all-reduces).
  """
  gather = fsdp.params if fsdp else (lambda params: params)
  scatter = fsdp.grads if fsdp else (lambda grads: grads)

  def loss_fn(params, batch_stats, batch, key, count, loss_scale):
    # The loss is the masked *sum* over this (micro-)batch over the example count of
    # the whole batch, so micro-batch gradients add up to the whole batch's.
    dropout_key, mix_key = jax.random.split(key)
    targets = soft_targets(batch["label"], num_classes, label_smoothing)
    images = batch["image"]
    if mix is not None and mix.active:
      images, targets = mix.apply(mix_key, images.astype(jnp.float32), targets, batch["mask"])
    images = normalize(images, mean, std, policy.compute_dtype)
    logits, updates = model.apply(
        {"params": gather(params), "batch_stats": batch_stats}, images, train=True,
        mutable=["batch_stats"], rngs={"dropout": dropout_key})
    per_example = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)
    loss = jnp.sum(per_example * batch["mask"].astype(jnp.float32)) / count
    scaled = loss * loss_scale if policy.uses_loss_scale else loss
    # Models without batch norm return no batch_stats: the state keeps its empty {}.
    return scaled, (loss, logits, updates.get("batch_stats", batch_stats))

  grad_fn = jax.grad(loss_fn, has_aux=True)

  def correct_count(logits, batch):
    correct = jnp.argmax(logits, -1) == batch["label"]
    return jnp.sum(correct * batch["mask"].astype(jnp.float32))

  def gradients(state: TrainState, batch, count):
    """(grads, loss, correct predictions, new batch_stats) of the whole batch of `count` examples."""
    key, scale = step_key(state), state.loss_scale.scale
    if grad_accum_steps == 1:
      grads, (loss, logits, stats) = grad_fn(state.params, state.batch_stats, batch, key, count, scale)
      return grads, loss, correct_count(logits, batch), stats

    # Micro-batch k takes every K-th example, so each device keeps its own examples
    # (the batch axis stays sharded over the mesh) instead of one device per micro-batch.
    micro = jax.tree.map(
        lambda x: jnp.moveaxis(x.reshape(x.shape[0] // grad_accum_steps, grad_accum_steps,
                                         *x.shape[1:]), 1, 0), batch)

    def accumulate(carry, inputs):
      grads, stats, loss, correct = carry
      micro_batch, k = inputs
      g, (l, logits, stats) = grad_fn(state.params, stats, micro_batch,
                                      jax.random.fold_in(key, k), count, scale)
      return (jax.tree.map(jnp.add, grads, g), stats, loss + l,
              correct + correct_count(logits, micro_batch)), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    (grads, stats, loss, correct), _ = jax.lax.scan(
        accumulate, (zeros, state.batch_stats, jnp.float32(0), jnp.float32(0)),
        (micro, jnp.arange(grad_accum_steps)))
    return grads, loss, correct, stats

  def train_step(state: TrainState, batch):
    count = jnp.maximum(jnp.sum(batch["mask"].astype(jnp.float32)), 1.0)  # real examples
    grads, loss, correct, new_batch_stats = gradients(state, batch, count)
    new_state, grads, finite = apply_gradients(state, scatter(grads), new_batch_stats, tx, policy)
    loss_scale = new_state.loss_scale

    if ema_decay:
      ema = jax.tree.map(lambda e, p: ema_decay * e + (1 - ema_decay) * p, state.ema_params, new_state.params)
      if policy.uses_loss_scale:
        # A skipped step must not pull the EMA towards the (unchanged) params either.
        ema = select_tree(finite, ema, state.ema_params)
    else:
      ema = None  # no EMA: no second copy of the params
    new_state = new_state.replace(ema_params=ema)
    metrics = {
        "train/loss": loss,
        "train/accuracy": correct / count,
        "train/learning_rate": schedule(state.step),
        "train/grad_norm": global_norm(grads, one_reduction=fsdp is None),
        "data/corrupt_images": jnp.sum(batch["corrupt"]),
    }
    if policy.uses_loss_scale:
      metrics["train/loss_scale"] = loss_scale.scale
      metrics["train/skipped_steps"] = loss_scale.skipped_steps
    return new_state, metrics

  return train_step


def apply_gradients(state: TrainState, grads, batch_stats, tx, policy: Policy):
  """The update every train step ends with (classification here, detection.py's too):
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


def make_eval_step(model, policy: Policy, *, num_classes: int, mean, std,
                   use_ema: bool = False, fsdp=None):
  """Returns `eval_step(state, batch) -> sums`: metric *sums* and the example count,
  so that batches (including the padded last one) add up exactly.
  `fsdp`: as make_train_step's."""

  logits_fn = make_logits_fn(model, policy, mean=mean, std=std)
  gather = fsdp.params if fsdp else (lambda params: params)

  def eval_step(state: TrainState, batch):
    variables = eval_variables(state.params, state.ema_params, state.batch_stats, use_ema)
    logits = logits_fn({**variables, "params": gather(variables["params"])}, batch["image"])
    mask = batch["mask"].astype(jnp.float32)
    loss = cross_entropy(logits, batch["label"], num_classes)
    top5 = jax.lax.top_k(logits, min(5, num_classes))[1]
    in_top5 = jnp.any(top5 == batch["label"][:, None], axis=-1)
    return {
        "loss": jnp.sum(loss * mask),
        "top1": jnp.sum((jnp.argmax(logits, -1) == batch["label"]) * mask),
        "top5": jnp.sum(in_top5 * mask),
        "count": jnp.sum(mask),
    }

  return eval_step


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
  """Returns `logits_fn(variables, images) -> float32 logits`, the model in eval mode.

  `images` are uint8 NHWC, as the pipeline delivers them; normalization is inside.
  The eval step, the Python API's Predictor and the exports (jaxnet/tools) all call this
  one function, so their logits agree by construction.
  """

  def logits_fn(variables, images):
    x = normalize(images, mean, std, policy.compute_dtype)
    return model.apply(variables, x, train=False)

  return logits_fn


@dataclasses.dataclass(frozen=True)
class Mix:
  mixup_alpha: float = 0.0    # Beta concentration; 0 turns mixup off (big_vision's "p")
  cutmix_alpha: float = 0.0   # 0 turns cutmix off
  prob: float = 1.0           # chance a batch is mixed
  switch_prob: float = 0.5    # with both on: chance of cutmix instead of mixup
  groups: int = 1             # pairs form within this many contiguous groups of the batch

  def __post_init__(self):
    for name in ("mixup_alpha", "cutmix_alpha"):
      if getattr(self, name) < 0:
        raise InvalidValueError(f"config.mix.{name}={getattr(self, name)} must be >= 0 (0 turns it off)")
    for name in ("prob", "switch_prob"):
      if not 0 <= getattr(self, name) <= 1:
        raise InvalidValueError(f"config.mix.{name}={getattr(self, name)} must lie in [0, 1]")

  def partner(self, x):
    return _partner_in_groups(x, self.groups)

  @property
  def active(self) -> bool:
    return (self.mixup_alpha > 0 or self.cutmix_alpha > 0) and self.prob > 0

  def apply(self, key, images, targets, mask):
    """(images float NHWC, targets (N, classes), mask (N,)) -> mixed (images, targets)."""
    k_apply, k_switch, k_mixup, k_cutmix, k_box = jax.random.split(key, 5)
    n, h, w = images.shape[:3]
    one = jnp.float32(1.0)
    lam_mixup = jax.random.beta(k_mixup, self.mixup_alpha, self.mixup_alpha) if self.mixup_alpha else one
    if self.cutmix_alpha:
      lam_box = jax.random.beta(k_cutmix, self.cutmix_alpha, self.cutmix_alpha)
      inside, lam_cutmix = _box(k_box, h, w, lam_box)
    else:
      inside, lam_cutmix = jnp.zeros((h, w), bool), one
    if self.mixup_alpha and self.cutmix_alpha:
      use_cutmix = jax.random.bernoulli(k_switch, self.switch_prob)
    else:
      use_cutmix = jnp.bool_(self.cutmix_alpha > 0)

    # Per pixel, the weight of the example's own image; per example, of its own target.
    own_pixel = jnp.where(use_cutmix, jnp.where(inside, 0.0, 1.0), lam_mixup)[None, :, :, None]
    lam = jnp.where(use_cutmix, lam_cutmix, lam_mixup)
    if n % self.groups:
      raise InvalidValueError(f"config.mix.groups={self.groups} does not divide a (micro-)batch of {n}")
    partner_images, partner_targets = self.partner(images), self.partner(targets)
    mixes = jax.random.bernoulli(k_apply, self.prob) & self.partner(mask)   # (N,)
    own_pixel = jnp.where(mixes[:, None, None, None], own_pixel, 1.0)
    lam = jnp.where(mixes, lam, 1.0)[:, None]
    images = own_pixel * images + (1.0 - own_pixel) * partner_images
    targets = lam * targets + (1.0 - lam) * partner_targets
    return images, targets


def _partner_in_groups(x, groups: int):
  """Each example's partner: the previous one (cyclically) within its group of the batch."""
  grouped = x.reshape(groups, x.shape[0] // groups, *x.shape[1:])
  return jnp.roll(grouped, 1, axis=1).reshape(x.shape)


def _box(key, h: int, w: int, lam):
  """A box of about (1 - lam) of the image, centred uniformly, clipped at the edges.

  Returns (inside: bool (h, w), the exact lam of the clipped box).
  """
  k_y, k_x = jax.random.split(key)
  side = jnp.sqrt(1.0 - lam)
  cut_h, cut_w = jnp.floor(h * side), jnp.floor(w * side)
  cy = jax.random.randint(k_y, (), 0, h).astype(jnp.float32)
  cx = jax.random.randint(k_x, (), 0, w).astype(jnp.float32)
  y0, y1 = jnp.clip(cy - cut_h // 2, 0, h), jnp.clip(cy + cut_h - cut_h // 2, 0, h)
  x0, x1 = jnp.clip(cx - cut_w // 2, 0, w), jnp.clip(cx + cut_w - cut_w // 2, 0, w)
  ys, xs = jnp.arange(h, dtype=jnp.float32)[:, None], jnp.arange(w, dtype=jnp.float32)[None, :]
  inside = (ys >= y0) & (ys < y1) & (xs >= x0) & (xs < x1)
  return inside, 1.0 - (y1 - y0) * (x1 - x0) / (h * w)
