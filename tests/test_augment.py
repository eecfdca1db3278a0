"""The ViT recipe's augmentations: mixup/CutMix on the device, RandAugment in the Grain
workers, and an exact resume of a run using both (with AlexNet's dropout and AdamW's bf16 moment)."""

import functools
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnet import api
from jaxnet.core import checkpoint as ckpt
from jaxnet.core.data import pipeline, randaugment
from jaxnet.core.data.sources import ArraySource, digits_source
from jaxnet.core.tasks.classification import Mix

N, H, W, CLASSES = 8, 12, 10, 5


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  images = rng.uniform(0, 255, (N, H, W, 3)).astype(np.float32)
  labels = rng.integers(0, CLASSES, N)
  return images, jax.nn.one_hot(labels, CLASSES), np.ones(N, bool)


@functools.lru_cache(maxsize=None)
def _jitted(mix):
  return jax.jit(mix.apply)  # one compile per setting, whatever the key


def _apply(mix, seed, images, targets, mask):
  return _jitted(mix)(jax.random.PRNGKey(seed), images, targets, mask)


@pytest.mark.parametrize("mix", [Mix(mixup_alpha=0.4), Mix(cutmix_alpha=1.0),
                                 Mix(mixup_alpha=0.4, cutmix_alpha=1.0)])
def test_mixing_conserves_label_mass(mix):
  images, targets, mask = _batch()
  changed = 0
  for seed in range(4):
    mixed_images, mixed = _apply(mix, seed, images, targets, mask)
    assert mixed_images.shape == images.shape and mixed_images.dtype == jnp.float32
    np.testing.assert_allclose(np.sum(mixed, axis=1), 1.0, rtol=1e-6)                      # each row
    np.testing.assert_allclose(np.sum(mixed, axis=0), np.sum(targets, axis=0), rtol=1e-5)  # each class
    changed += not np.allclose(mixed, targets)
  assert changed >= 3  # the checks above are about mixed labels, not untouched ones


def test_mixup_blends_images_with_the_target_ratio():
  images, targets, mask = _batch(1)
  targets = jnp.eye(N)  # one class per example: row i of the targets reads off lam directly
  out, mixed = _apply(Mix(mixup_alpha=0.4), 3, images, targets, mask)
  lam = float(mixed[0, 0])
  assert 0.0 < lam < 1.0 and float(mixed[0, N - 1]) == pytest.approx(1 - lam, abs=1e-6)
  np.testing.assert_allclose(out, lam * images + (1 - lam) * np.roll(images, 1, axis=0), rtol=1e-5)


def test_cutmix_pastes_a_box_whose_area_is_the_label_weight():
  images, _, mask = _batch(2)
  targets = jnp.eye(N)
  seen = set()
  for seed in range(6):
    out, mixed = _apply(Mix(cutmix_alpha=1.0), seed, images, targets, mask)
    partner = np.roll(images, 1, axis=0)
    from_partner = np.all(np.asarray(out) == partner, axis=-1) & ~np.all(images == partner, axis=-1)
    from_own = np.all(np.asarray(out) == images, axis=-1)
    assert np.all(from_partner | from_own)          # every pixel is copied, not blended
    lam = float(mixed[0, 0])
    # The same box in every image; its area is exactly 1 - lam of the image.
    np.testing.assert_array_equal(from_partner, np.broadcast_to(from_partner[0], from_partner.shape))
    assert from_partner[0].sum() == pytest.approx((1 - lam) * H * W, abs=1e-3)
    seen.add(round(lam, 3))
  assert len(seen) > 3  # the box changes with the key


def test_mixing_is_the_identity_at_zero_probability_or_zero_alpha():
  images, targets, mask = _batch(3)
  out, mixed = _apply(Mix(mixup_alpha=0.2, cutmix_alpha=1.0, prob=0.0), 0, images, targets, mask)
  np.testing.assert_array_equal(out, images)
  np.testing.assert_array_equal(mixed, targets)
  assert not Mix().active and not Mix(mixup_alpha=0.2, prob=0.0).active
  assert Mix(mixup_alpha=0.2).active and Mix(cutmix_alpha=0.5).active


def test_a_masked_out_partner_is_never_mixed_in():
  images, targets, mask = _batch(4)
  mask = mask.copy()
  mask[2] = False   # e.g. an unreadable image: example 3, whose partner it is, stays itself
  out, mixed = _apply(Mix(mixup_alpha=0.4), 1, images, targets, mask)
  np.testing.assert_array_equal(out[3], images[3])
  np.testing.assert_array_equal(mixed[3], targets[3])
  assert not np.array_equal(np.asarray(out[4]), images[4])


def test_bad_mix_settings_are_clear_errors():
  with pytest.raises(ValueError, match=r"config.mix.mixup_alpha=-1"):
    Mix(mixup_alpha=-1)
  with pytest.raises(ValueError, match=r"config.mix.prob=1.5 must lie in \[0, 1\]"):
    Mix(prob=1.5)


# --- RandAugment ------------------------------------------------------------------------------


def _images(seed=0):
  # Skewed values inside 40..200: AutoContrast has a range to stretch, Equalize a histogram to flatten.
  rng = np.random.default_rng(seed)
  draw = lambda shape: (40 + 160 * rng.beta(2, 5, shape)).astype(np.uint8)
  return [draw((24, 20, 3)), draw((16, 16, 1))]


@pytest.mark.parametrize("op", randaugment.OPS, ids=lambda op: op.__name__)
def test_every_operation_keeps_shape_and_dtype_and_acts(op):
  for image in _images():
    out = op(image, 1.0, np.random.default_rng(0))
    assert out.shape == image.shape and out.dtype == np.uint8, op.__name__
    # At full magnitude every op changes the image, except Solarize (its threshold is 256
    # there, as in TF) and Color on a grey image.
    if op.__name__ != "solarize" and not (op.__name__ == "color" and image.shape[-1] == 1):
      assert not np.array_equal(out, image), op.__name__


def test_operation_values():
  image = np.array([[[0, 100, 200], [127, 128, 255]]], np.uint8)
  rng = np.random.default_rng(0)
  np.testing.assert_array_equal(randaugment.invert(image, 1.0, rng), 255 - image)
  np.testing.assert_array_equal(randaugment.posterize(image, 1.0, rng), image & 0xF0)   # 4 bits kept
  np.testing.assert_array_equal(randaugment.solarize(image, 0.5, rng),                 # threshold 128
                                np.array([[[0, 100, 55], [127, 127, 0]]], np.uint8))
  np.testing.assert_array_equal(randaugment.solarize_add(image, 1.0, rng),             # +110 below 128
                                np.array([[[110, 210, 200], [237, 128, 255]]], np.uint8))
  grey = np.zeros((224, 224, 3), np.uint8)
  box = randaugment.cutout(grey, 1.0, np.random.default_rng(1)) == randaugment.GREY
  rows, cols = np.nonzero(box[..., 0])
  assert rows.max() - rows.min() + 1 <= 80 and cols.max() - cols.min() + 1 <= 80   # TF's 2 x 40 px at 224
  assert box.all(axis=-1).sum() == box[..., 0].sum() > 0


@pytest.mark.parametrize("name", ["color", "contrast", "brightness", "sharpness"])
def test_blends_agree_with_pil_imageenhance(name):
  from PIL import Image, ImageEnhance
  op = {o.__name__: o for o in randaugment.OPS}[name]
  pil = getattr(ImageEnhance, name.capitalize())
  for image in _images(2):
    for level in (0.2, 1.0):
      ref = np.asarray(pil(Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image))
                       .enhance(0.1 + 1.8 * level)).reshape(image.shape)
      assert np.abs(op(image, level, None).astype(int) - ref).max() <= 2, (name, level, image.shape)


def test_rand_augment_is_a_function_of_the_generator_seed():
  image = _images(1)[0]
  run = lambda seed: randaugment.rand_augment(image, 2, 10, np.random.Generator(np.random.Philox(key=seed)))
  np.testing.assert_array_equal(run(7), run(7))
  outputs = [run(seed) for seed in range(12)]
  assert len({o.tobytes() for o in outputs}) > 6   # different seeds pick different ops
  with pytest.raises(ValueError, match="randaug_magnitude within 0..10"):
    randaugment.RandAugment(2, 11)


def _loader(source, seed, randaug):
  return iter(pipeline.train_loader(source, global_batch_size=16, image_size=16, seed=seed, workers=0,
                                    randaug=randaug))


def test_randaugment_in_the_loader_replays_after_a_restore():
  source = digits_source("train", 16)
  plain = next(_loader(source, 0, (0, 10)))
  it = _loader(source, 0, (2, 10))
  first = [next(it) for _ in range(3)]
  assert not np.array_equal(first[0]["image"], plain["image"])        # RandAugment changed the images
  np.testing.assert_array_equal(first[0]["label"], plain["label"])    # ...not the order
  np.testing.assert_array_equal(next(_loader(source, 0, (2, 10)))["image"], first[0]["image"])
  assert not np.array_equal(next(_loader(source, 1, (2, 10)))["image"], first[0]["image"])
  state = it.get_state()
  expected = [next(it) for _ in range(2)]
  restored = _loader(source, 0, (2, 10))
  restored.set_state(state)
  for want in expected:
    got = next(restored)
    np.testing.assert_array_equal(got["image"], want["image"])
    np.testing.assert_array_equal(got["label"], want["label"])


def test_masked_examples_pass_randaugment_untouched():
  blank = {"image": np.zeros((8, 8, 3), np.uint8), "label": np.int32(-1), "mask": np.bool_(False),
           "corrupt": np.int32(1)}
  out = randaugment.RandAugment(2, 10).random_map(blank, np.random.default_rng(0))
  np.testing.assert_array_equal(out["image"], blank["image"])


# --- a run with all of it resumes exactly ------------------------------------------------------


@pytest.mark.slow  # a minute; test_train.py's test_resume_is_exact stays in the default run
def test_resume_with_dropout_mixing_randaugment_and_bf16_moments_is_exact(tmp_path):
  """6 steps straight through == 3 steps, checkpoint, resume to 6: AlexNet's dropout, mixup/CutMix
  and RandAugment draw the same numbers after the restore."""
  overrides = {"model.name": "alexnet_mini", "image_size": 64, "batch_size": 16, "total_steps": 6,
               "log_every_steps": 1, "checkpoint_every_steps": 3, "eval_every_steps": 0,
               "data.eval_batch_size": 360, "data.workers": 0, "data.randaug_num_ops": 2,
               "mix.mixup_alpha": 0.4, "mix.cutmix_alpha": 1.0, "optim.name": "adamw",
               "optim.learning_rate": 0.004, "optim.mu_dtype": "bfloat16", "optim.warmup_epochs": 0.0,
               "optim.grad_clip_norm": 1.0, "mesh.num_devices": 1}
  config = api.load_config("configs/digits.py", **overrides)
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  api.train(config, straight)
  shutil.copytree(straight, resumed)
  shutil.rmtree(resumed / "checkpoints" / "6")
  lines = [l for l in open(resumed / "metrics.jsonl") if json.loads(l)["step"] <= 3]
  open(resumed / "metrics.jsonl", "w").writelines(lines)
  api.train(config, resumed)

  a, _ = ckpt.load_arrays(straight)
  b, _ = ckpt.load_arrays(resumed)
  assert a["batch_stats"] == {} and b["batch_stats"] == {}
  mu = jax.tree.leaves(a["opt_state"])
  assert any(x.dtype == jnp.bfloat16 for x in mu)   # the first moment is kept in bf16
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  loss = lambda w: [r["train/loss"] for r in api.read_metrics(w) if "train/loss" in r]
  assert loss(straight) == loss(resumed)
  assert len(set(loss(straight))) == 6


def test_pairs_form_within_groups_of_the_batch():
  mix = Mix(mixup_alpha=1.0, groups=4)
  x = jnp.arange(8)
  np.testing.assert_array_equal(mix.partner(x), [1, 0, 3, 2, 5, 4, 7, 6])  # (2 per group, cyclic)
  np.testing.assert_array_equal(Mix(mixup_alpha=1.0).partner(x), jnp.roll(x, 1))
  with pytest.raises(ValueError, match=r"config.mix.groups=3 does not divide a \(micro-\)batch of 8"):
    Mix(mixup_alpha=1.0, groups=3).apply(jax.random.PRNGKey(0), jnp.zeros((8, 4, 4, 1)),
                                          jnp.zeros((8, 2)), jnp.ones((8,), bool))


def test_mixup_on_eight_devices_moves_no_image_between_them():
  """Compiled for 8 devices, with 2 micro-batches: each device pairs its own images (no
  all-to-all, collective permute or all-gather of images); pairing over the whole batch
  (mix.groups=1) does move them, so the check is not vacuous."""
  from jaxnet.configs import digits
  from jaxnet.core import config as config_lib
  from jaxnet.core import experiment

  def compiled(groups):
    c = config_lib.switch_model(digits.get_config(), "vit_mini")
    c.mix.mixup_alpha, c.mix.groups, c.grad_accum_steps, c.batch_size = 0.2, groups, 2, 32
    exp = experiment.Experiment(c)
    batch = {"image": jax.ShapeDtypeStruct((32, 16, 16, 1), jnp.uint8, sharding=exp.batch_sharding),
             "label": jax.ShapeDtypeStruct((32,), jnp.int32, sharding=exp.batch_sharding),
             "mask": jax.ShapeDtypeStruct((32,), jnp.bool_, sharding=exp.batch_sharding),
             "corrupt": jax.ShapeDtypeStruct((32,), jnp.int32, sharding=exp.batch_sharding)}
    return exp.train_step.lower(exp.abstract_state, batch).compile().as_text()

  moving = ("all-to-all", "collective-permute", "all-gather")
  per_device = compiled(0)
  assert not [op for op in moving if f" {op}(" in per_device or f" {op}-start(" in per_device]
  whole_batch = compiled(1)
  assert [op for op in moving if f" {op}(" in whole_batch or f" {op}-start(" in whole_batch]
