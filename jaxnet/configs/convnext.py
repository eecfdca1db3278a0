"""ConvNeXt on ImageNet (ILSVRC-2012): the recipe of Liu et al. 2022 ("A ConvNet for the 2020s",
arXiv:2201.03545, its Table 5 / appendix A.1), and a CPU recipe on the bundled digits.

  jaxnet train --config=convnext:tiny --workdir=$WORKDIR \
      --config.data.dir=$TFDS_DATA_DIR
  (variants: tiny, small, base, large, mini; tiny is the default)
  jaxnet train --config=convnext:mini --workdir=/tmp/jaxnet-convnext-mini

ImageNet: 300 epochs of AdamW (b1 0.9, b2 0.999) at learning rate 4e-3 per 4096 images
(linear scaling: 1e-3 at this batch of 1024, 128 per GPU), weight decay 0.05 (optax's adamw
decays like torch's AdamW, lr * wd * param; on kernels only, as the paper's code leaves norms,
biases and layer scales alone), 20 warmup epochs then cosine decay, RandAugment(2, 9), mixup
0.8 and CutMix 1.0 (one of the two per batch), label smoothing 0.1, EMA of the weights
(0.9999), stochastic depth 0.1 / 0.4 / 0.5 / 0.5 for T / S / B / L (the model's default),
layer scale 1e-6, 224 px with the 0.875 center crop and bicubic resizing at eval.
Not in jaxnet, so not here: the paper's random erasing (0.25) and its gradient-free EMA
evaluation choice per size; everything else is the paper's.

Meant for: one 8-GPU server (A100/H100 class), bf16.
Expect: the paper's 82.1 / 83.1 / 83.8 / 84.3% top-1 for T / S / B / L (torchvision's
retrained weights: 82.5 / 83.6 / 84.1 / 84.4%). jaxnet has not trained ConvNeXt on ImageNet:
unmeasured here.

mini: convnext_mini on scikit-learn's 8x8 digits upsampled to 16 px, AdamW, 330 steps (nothing
downloaded); tests/test_convnext_efficientnet.py trains it for a few steps.
  Meant for: any CPU.
  Expect: ~98% test top-1: 0.9833 in 48.8 s of training (the run's last line prints both), on a
  2-core x86_64 VM shared with other jobs (load 7-10), warm compile cache, Python 3.11, jax
  0.10.2, 2026-11-29.
"""

import os

from jaxnet.core.config import base_config, from_file

VARIANTS = ("tiny", "small", "base", "large", "mini")


def digits_recipe(model: str):
  """A CPU run of a mini model on the bundled digits: jaxnet/configs/digits.py's data and schedule,
  AdamW (the family's optimizer) in place of its SGD."""
  c = from_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.py"))
  c.model = base_config().model
  c.model.name = model
  c.optim.name = "adamw"
  c.optim.learning_rate = 2e-3     # at batch 64
  c.optim.base_batch_size = 64
  c.optim.weight_decay = 0.05
  c.optim.warmup_epochs = 1.0
  return c


def get_config(variant: str = "tiny"):
  if variant not in VARIANTS:
    raise ValueError(f"convnext variant {variant!r}: use one of {', '.join(VARIANTS)} "
                     "(e.g. --config=convnext:tiny)")
  if variant == "mini":
    return digits_recipe("convnext_mini")
  c = base_config()
  c.model.name = f"convnext_{variant}"
  c.data.source = "tfds"
  c.data.name = "imagenet2012"
  c.data.eval_split = "validation"
  c.data.workers = 14
  c.image_size = 224
  c.data.eval_crop_fraction = 0.875
  c.data.eval_interpolation = "bicubic"
  c.data.randaug_num_ops = 2
  c.data.randaug_magnitude = 9
  c.mix.mixup_alpha = 0.8
  c.mix.cutmix_alpha = 1.0
  c.mix.switch_prob = 0.5
  c.label_smoothing = 0.1
  c.ema_decay = 0.9999
  c.precision = "bf16"
  c.batch_size = 1024
  c.num_epochs = 300
  c.log_every_steps = 100
  c.eval_every_steps = 0
  c.eval_every_epochs = 5.0
  c.checkpoint_every_steps = 0
  c.checkpoint_every_epochs = 1.0

  c.optim.name = "adamw"
  c.optim.learning_rate = 4e-3     # at batch 4096
  c.optim.base_batch_size = 4096
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.weight_decay = 0.05
  c.optim.warmup_epochs = 20.0
  c.optim.schedule = "cosine"
  return c
