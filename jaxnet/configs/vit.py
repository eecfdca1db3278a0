"""Vision Transformers on ImageNet (ILSVRC-2012): big_vision's "better plain ViT baselines".

  jaxnet train --config=vit:s16 --workdir=$WORKDIR \
      --config.data.dir=$TFDS_DATA_DIR
  (variants: ti16, s16, b16, l16, h14; s16 is the default)

The recipe of big_vision's configs/vit_s16_i1k.py (Beyer, Zhai, Kolesnikov 2022,
arXiv:2205.01580): the plain ViT (config.model.flavour=plain: global average
pooling, fixed 2-D sin-cos position embedding, tanh pre-logits, zero-init head),
batch 1024, 90 epochs, Adam (b1 0.9, b2 0.999, first moment in bf16) with
decoupled weight decay 1e-4, learning rate 1e-3 with 10k linear warmup steps and
cosine decay, gradient clipping at global norm 1.0, Inception crop + flip +
RandAugment(2, 10) and mixup (Beta(0.2, 0.2)), images scaled to [-1, 1].
big_vision's weight decay is "decoupled": each step subtracts wd * (lr / peak lr)
* param, which is optax's adamw (lr * wd * param) with wd = 1e-4 / 1e-3 = 0.1.

Meant for: one 8-GPU server (A100/H100 class), 128 images per GPU, bf16. The other
variants get the S/16 recipe unchanged; big_vision tuned it for S/16 only. h14 (ViT-H/14,
632 M parameters) adds FSDP (config.mesh.fsdp: its fp32 params and Adam moments split over the
GPUs instead of copied to each) and 2 micro-batches per step (grad_accum_steps): compiled for
8 H100s, 128 images per GPU need 59.4 GiB even with FSDP, past the 59.3 GiB jax uses; 2 x 64
need 44.8 GiB (docs/scaling.md).
Expect: s16 ~76.5% top-1 after 90 epochs (big_vision's published result, 6-7 h on a
TPU v3-8 there). jaxnet has not trained it on ImageNet yet.
"""

from jaxnet.core.config import base_config

VARIANTS = ("ti16", "s16", "b16", "l16", "h14")


def get_config(variant: str = "s16"):
  if variant not in VARIANTS:
    raise ValueError(f"vit variant {variant!r}: use one of {', '.join(VARIANTS)} "
                     "(e.g. --config=vit:s16)")
  c = base_config()
  c.model.name = f"vit_{variant}"
  c.model.flavour = "plain"
  c.data.source = "tfds"
  c.data.name = "imagenet2012"
  c.data.eval_split = "validation"
  c.data.workers = 14
  c.image_size = 224
  c.data.eval_crop_fraction = 0.875  # resize to 256, center-crop 224
  c.data.mean = (0.5, 0.5, 0.5)      # pixels to [-1, 1], as big_vision's value_range(-1, 1)
  c.data.std = (0.5, 0.5, 0.5)
  c.data.randaug_num_ops = 2
  c.data.randaug_magnitude = 10
  c.mix.mixup_alpha = 0.2
  c.precision = "bf16"
  c.batch_size = 1024
  c.num_epochs = 90
  c.log_every_steps = 100
  c.eval_every_steps = 0             # every 5 epochs, whatever the batch size
  c.eval_every_epochs = 5.0
  c.checkpoint_every_steps = 0       # every epoch
  c.checkpoint_every_epochs = 1.0

  c.optim.name = "adamw"
  c.optim.learning_rate = 1e-3       # at batch 1024
  c.optim.base_batch_size = 1024
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.mu_dtype = "bfloat16"
  c.optim.weight_decay = 0.1         # optax's coupled form of big_vision's decoupled 1e-4
  c.optim.warmup_steps = 10_000
  c.optim.schedule = "cosine"
  c.optim.grad_clip_norm = 1.0
  if variant == "h14":
    c.mesh.fsdp = True
    c.grad_accum_steps = 2
  return c
