"""Mixup and CutMix on the device, inside the jitted train step.

The host sends uint8 images and integer labels as always; the step turns the
labels into (smoothed) one-hot targets and, when mixing is on, blends each
example with its neighbour in the global batch (`roll` by one, as big_vision
does) with one ratio per batch:

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

from jaxnet.errors import InvalidValueError


@dataclasses.dataclass(frozen=True)
class Mix:
  mixup_alpha: float = 0.0    # Beta concentration; 0 turns mixup off (big_vision's "p")
  cutmix_alpha: float = 0.0   # 0 turns cutmix off
  prob: float = 1.0           # chance a batch is mixed
  switch_prob: float = 0.5    # with both on: chance of cutmix instead of mixup

  def __post_init__(self):
    for name in ("mixup_alpha", "cutmix_alpha"):
      if getattr(self, name) < 0:
        raise InvalidValueError(f"config.mix.{name}={getattr(self, name)} must be >= 0 (0 turns it off)")
    for name in ("prob", "switch_prob"):
      if not 0 <= getattr(self, name) <= 1:
        raise InvalidValueError(f"config.mix.{name}={getattr(self, name)} must lie in [0, 1]")

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
    partner_images, partner_targets = jnp.roll(images, 1, axis=0), jnp.roll(targets, 1, axis=0)
    mixes = jax.random.bernoulli(k_apply, self.prob) & jnp.roll(mask, 1, axis=0)   # (N,)
    own_pixel = jnp.where(mixes[:, None, None, None], own_pixel, 1.0)
    lam = jnp.where(mixes, lam, 1.0)[:, None]
    images = own_pixel * images + (1.0 - own_pixel) * partner_images
    targets = lam * targets + (1.0 - lam) * partner_targets
    return images, targets


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
