"""EfficientNet B0-B7 and EfficientNetV2-S/M/L on ImageNet (ILSVRC-2012): torchvision's SGD
recipe at each size's resolution, and a CPU recipe on the bundled digits.

  jaxnet train --config=efficientnet:b0 --workdir=$WORKDIR \
      --config.data.dir=$TFDS_DATA_DIR
  (variants: b0 ... b7, v2_s, v2_m, v2_l, mini; b0 is the default)
  jaxnet train --config=efficientnet:mini --workdir=/tmp/jaxnet-efficientnet-mini

The recipe torchvision trained its EfficientNetV2-S/M with (its references/classification
README): SGD with momentum 0.9 at learning rate 0.5 per 1024 images, weight decay 2e-5 (on
kernels only: no decay of BN, biases), 600 epochs, 5 linear warmup epochs then cosine decay,
label smoothing 0.1, mixup 0.2 and CutMix 1.0, EMA of the weights, stochastic depth 0.2 and
the model's dropout (0.2-0.5 by size). Images: trained at a smaller size than evaluated, as
torchvision does (V2-S 300 -> 384 px, M 384 -> 480 px), B0-B7 at their native resolution
(224, 240, 288, 300, 380, 456, 528, 600) with the whole-image eval crop torchvision's weights
were evaluated with (0.875), bicubic resizing. Where jaxnet has no equivalent the recipe
differs: RandAugment(2, 9) stands in for TrivialAugment-wide, and there is no random erasing
(0.1) and no repeated-augmentation sampler. The original EfficientNet recipe (Tan & Le 2019:
RMSprop, 350 epochs, AutoAugment, exponential decay) needs an RMSprop jaxnet does not have.

Meant for: one 8-GPU server (A100/H100 class), bf16, batch 1024 (128 per GPU); the large
resolutions (B5-B7, V2-M/L) will need a smaller batch or config.grad_accum_steps.
Expect: torchvision's published top-1, which its weights reach with the recipe above (and,
for B0-B7 and V2-L, the TF-trained weights it ports): B0 77.7, B1 78.6, B2 80.6, B3 82.0,
B4 83.4, B5 83.4, B6 84.0, B7 84.1, V2-S 84.2, V2-M 85.1, V2-L 85.8%. jaxnet has not trained
EfficientNet on ImageNet: unmeasured here, and the differences above may cost some of it.

mini: efficientnet_mini on scikit-learn's 8x8 digits upsampled to 16 px (convnext:mini's digits
recipe, 330 steps); tests/test_convnext_efficientnet.py trains it for a few steps.
  Meant for: any CPU.
  Expect: ~97% test top-1: 0.9694 in 54.8 s of training (the run's last line prints both), on a
  2-core x86_64 VM shared with other jobs (load 7-10), warm compile cache, Python 3.11, jax
  0.10.2, 2026-11-29.
"""

import os

from jaxnet.core.config import base_config, from_file

# variant -> (train size, eval size)
SIZES = {"b0": (224, 224), "b1": (240, 240), "b2": (288, 288), "b3": (300, 300), "b4": (380, 380),
         "b5": (456, 456), "b6": (528, 528), "b7": (600, 600),
         "v2_s": (300, 384), "v2_m": (384, 480), "v2_l": (384, 480)}
VARIANTS = tuple(SIZES) + ("mini",)


def get_config(variant: str = "b0"):
  if variant not in VARIANTS:
    raise ValueError(f"efficientnet variant {variant!r}: use one of {', '.join(VARIANTS)} "
                     "(e.g. --config=efficientnet:b0)")
  if variant == "mini":
    c = from_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "convnext.py:mini"))
    c.model.name = "efficientnet_mini"
    c.optim.weight_decay = 1e-4
    return c
  train_size, eval_size = SIZES[variant]
  c = base_config()
  c.model.name = f"efficientnet_{variant}"
  c.data.source = "tfds"
  c.data.name = "imagenet2012"
  c.data.eval_split = "validation"
  c.data.workers = 14
  c.image_size = eval_size
  if train_size != eval_size:
    c.progressive_resizing = ((0.0, train_size),)  # from the first step on
  c.data.eval_crop_fraction = 0.875 if variant.startswith("b") else 1.0
  c.data.eval_interpolation = "bicubic"
  c.data.randaug_num_ops = 2
  c.data.randaug_magnitude = 9
  c.mix.mixup_alpha = 0.2
  c.mix.cutmix_alpha = 1.0
  c.label_smoothing = 0.1
  c.ema_decay = 0.9999
  c.precision = "bf16"
  c.batch_size = 1024
  c.num_epochs = 600
  c.log_every_steps = 100
  c.eval_every_steps = 0
  c.eval_every_epochs = 10.0
  c.checkpoint_every_steps = 0
  c.checkpoint_every_epochs = 1.0

  c.optim.name = "sgd"
  c.optim.learning_rate = 0.5      # at batch 1024
  c.optim.base_batch_size = 1024
  c.optim.momentum = 0.9
  c.optim.nesterov = False
  c.optim.weight_decay = 2e-5
  c.optim.warmup_epochs = 5.0
  c.optim.schedule = "cosine"
  return c
