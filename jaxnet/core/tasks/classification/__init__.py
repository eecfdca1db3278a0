"""Classification: a label per image. Its loss is the cross-entropy against one-hot targets
(label smoothing, mixup/CutMix), its train metric the accuracy, its eval top-1/top-5 and loss
summed over the eval set (so the padded last batch counts exactly once), and a restored
model returns logits.

Mixup and CutMix run in the loss, on the device (`Mix`): each example is blended with
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
import ml_collections
import numpy as np
import optax
from PIL import Image

from jaxnet.core import steps
from jaxnet.core.data import sources
from jaxnet.core.data.transforms import EvalDecodeCrop
from jaxnet.core.errors import InvalidValueError
from jaxnet.core.tasks import Task


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


class Classification(Task):
  def add_config(self, c) -> None:
    c.label_smoothing = 0.0          # cross-entropy's target smoothing, in [0, 1)
    # Mixup / CutMix, on the device inside the train step (soft targets); off by default.
    c.mix = ml_collections.ConfigDict()
    c.mix.mixup_alpha = 0.0          # Beta(alpha, alpha) mixing ratio; 0 turns mixup off
    c.mix.cutmix_alpha = 0.0         # 0 turns CutMix off
    c.mix.prob = 1.0                 # chance that a batch is mixed
    c.mix.switch_prob = 0.5          # with both on: chance of CutMix instead of mixup
    c.mix.groups = 0                 # examples pair within this many groups of the batch; 0: one per
                                     # device (no traffic between devices; the pairs then depend on
                                     # the device count), 1: the whole batch

  def make_source(self, config, split: str):
    """The image-and-label source config.data.source names (one of `sources`: the image sources
    of jaxnet/core/data) for `split` ("train" or "eval")."""
    data, size = config.data, config.image_size
    split_name = data.train_split if split == "train" else data.eval_split
    if data.source == "digits":
      return sources.digits_source(split_name, size)
    if data.source == "synthetic":  # as many channels as the normalisation has (the GPU plan
      # stands in synthetic images for a recipe's own: the digits' are grayscale)
      count = data.synthetic_size if split == "train" else max(data.synthetic_size // 10, 1)
      return sources.SyntheticSource(count, size, data.num_classes, seed=0 if split == "train" else 1,
                                     channels=len(data.mean))
    if data.source == "imagefolder":
      from jaxnet.core.data.imagefolder import ImageFolderSource
      return ImageFolderSource(data.dir, split_name)
    if data.source == "tfds":
      from jaxnet.core.data.tfds_source import TfdsSource
      return TfdsSource(data.name, split_name, data.dir or None)
    if data.source == "prepared":
      from jaxnet.core.data.prepared import PreparedSource
      return PreparedSource(data.dir, split_name)
    self.check_data(config)  # the one line naming the sources it reads

  def batch_fields(self, config) -> dict:
    return {"label": ((), "int32")}

  def loss(self, model, config, num_classes: int, batch_devices: int = 1):
    # Mixup pairs within each device's share of the batch unless mix.groups says otherwise.
    mix = Mix(**{**config.mix, "groups": config.mix.groups or batch_devices})
    return classification_loss(num_classes, config.label_smoothing, mix)

  def eval_outputs(self, model, config, num_classes: int):
    return eval_sums(num_classes)

  def evaluate(self, outputs, eval_source) -> dict:
    sums = None
    for out in outputs:  # summed on the device, read once
      sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
    sums = jax.device_get(sums)
    count = max(float(sums["count"]), 1.0)
    return {"eval/loss": float(sums["loss"]) / count, "eval/top1": float(sums["top1"]) / count,
            "eval/top5": float(sums["top5"]) / count, "eval/examples": int(sums["count"])}

  def describe(self, metrics: dict) -> str:
    return (f"top-1 {metrics['eval/top1']:.4f}  top-5 {metrics['eval/top5']:.4f}  "
            f"loss {metrics['eval/loss']:.4f}")

  def describe_train(self, metrics: dict) -> str:
    return f"acc {metrics['train/accuracy']:.3f}"

  def predict_outputs(self, model, config):
    return lambda apply, images: apply(images)  # the logits

  def preprocess(self, data: bytes, config, channels: int) -> dict:
    # The pipeline's own eval transform; warn=False: the predictor's error names the file and why.
    size = config.image_size
    op = EvalDecodeCrop(size, config.data.eval_crop_fraction, config.data.eval_interpolation, warn=False)
    example = op.map({"image": data, "label": np.int32(0)})
    image = np.asarray(example["image"], np.uint8)
    if channels == 1 and image.shape[-1] == 3:  # a grayscale model
      image = np.asarray(Image.fromarray(image).convert("L"), np.uint8)[..., None]
    return {"image": image, "mask": example["mask"]}

  def postprocess(self, logits, examples, class_names, top_k: int = 5, **unused) -> list:
    """Top-k (class name, probability) for each image."""
    probs = np.asarray(jax.nn.softmax(np.asarray(logits, np.float32), axis=-1))
    top = np.argsort(-probs, axis=-1)[:, :min(top_k, probs.shape[-1])]
    return [[(class_names[i], float(p[i])) for i in row] for p, row in zip(probs, top)]

  def lines(self, path, result) -> list[str]:
    return [str(path)] + [f"  {prob:8.4f}  {name}" for name, prob in result]


TASK = Classification(name="classification", headline="eval/top1", headline_label="eval top-1",
                      exports=("jax", "onnx", "torch", "int8"),
                      sources=("digits", "synthetic", "imagefolder", "tfds", "prepared"),
                      loaders=("grain", "dali"),
                      rules=(("label_smoothing", lambda v: 0 <= v < 1, "in [0, 1)"),),
                      plots=(("accuracy", "accuracy", (("train/accuracy", "-", "train"),
                                                       ("eval/top1", "o--", "eval top-1"))),))


def classification_loss(num_classes: int, label_smoothing: float = 0.0, mix: "Mix | None" = None):
  """The task's loss for steps.make_train_step: cross-entropy summed over the real examples
  against (smoothed, mixed) one-hot targets; train/accuracy counts the argmax against each
  example's own label, mixed or not."""

  def loss(apply, batch, key):
    targets = soft_targets(batch["label"], num_classes, label_smoothing)
    images = batch["image"]
    if mix is not None and mix.active:
      images, targets = mix.apply(key, images.astype(jnp.float32), targets, batch["mask"])
    logits = apply(images)
    real = batch["mask"].astype(jnp.float32)
    per_example = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)
    correct = jnp.sum((jnp.argmax(logits, -1) == batch["label"]) * real)
    return jnp.sum(per_example * real), {"train/accuracy": correct}

  return loss


def make_train_step(model, tx, schedule, policy, *, num_classes: int, mean, std,
                    label_smoothing: float = 0.0, ema_decay: float = 0.0, mix: "Mix | None" = None,
                    grad_accum_steps: int = 1, fsdp=None):
  """A classifier's train step (steps.make_train_step with classification_loss), for code that
  builds a model by hand: the tests, jaxnet.tools.summary."""
  return steps.make_train_step(model, tx, schedule, policy, classification_loss(num_classes, label_smoothing, mix),
                               steps.StepOptions(tuple(mean), tuple(std), ema_decay, grad_accum_steps, fsdp))


def eval_sums(num_classes: int):
  """The eval step's outputs for a batch: metric *sums* and the example count, so that
  batches (including the padded last one) add up exactly."""

  def outputs(apply, batch):
    logits = apply(batch["image"])
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

  return outputs


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
