"""ResNet-50 on ImageNet (ILSVRC-2012), two recipes.

Standard 90-epoch recipe (Goyal et al. 2017 with cosine decay and label smoothing):
  python -m jaxnet.main --config=configs/resnet50.py --workdir=$WORKDIR \
      --config.data.dir=$TFDS_DATA_DIR
Fast recipe, in the spirit of MLPerf and fast.ai (LARS, batch 2048, ~40 epochs,
progressive resizing 160 -> 192 -> 224):
  python -m jaxnet.main --config=configs/resnet50.py:fast --workdir=$WORKDIR \
      --config.data.dir=$TFDS_DATA_DIR

Meant for: one server with 8 GPUs (A100/H100 class), batch 1024 (128 per GPU) for
the standard recipe; `fast` uses batch 2048. Data: tfds `imagenet2012` prepared
as ArrayRecord in data.dir (see docs/data.md), or an ImageFolder with
--config.data.source=imagefolder --config.data.dir=/path/with/train_and_val.
Expect: standard ~76.5-77% top-1 after 90 epochs (published results for this
recipe); fast: the MLPerf target 75.9% in ~40 epochs (published MLPerf LARS runs).
jaxnet has not yet measured either on ImageNet: see experiments/RESULTS.md.
"""

from jaxnet.config_base import base_config


def get_config(variant: str = "standard"):
  c = base_config()
  c.model.name = "resnet50"
  c.data.source = "tfds"
  c.data.name = "imagenet2012"
  c.data.train_split = "train"
  c.data.eval_split = "validation"
  c.data.workers = 12              # decode+augment processes per host (~16 cores per 8 GPUs)
  c.image_size = 224
  c.data.eval_crop_fraction = 0.875  # eval: resize to 256, center-crop 224
  c.precision = "bf16"
  c.label_smoothing = 0.1
  c.log_every_steps = 100

  c.optim.weight_decay = 5e-5      # not applied to BN parameters and biases
  c.optim.momentum = 0.9
  c.optim.nesterov = True
  c.optim.base_batch_size = 256

  if variant == "standard":
    c.batch_size = 1024
    c.num_epochs = 90
    c.optim.name = "sgd"
    c.optim.learning_rate = 0.1    # x batch/256 = 0.4 at batch 1024
    c.optim.warmup_epochs = 5
    c.optim.schedule = "cosine"
    c.eval_every_steps, c.eval_every_epochs = 0, 5  # in epochs: right at any batch_size
    c.checkpoint_every_steps, c.checkpoint_every_epochs = 0, 1
  elif variant == "fast":
    c.batch_size = 2048
    c.num_epochs = 40
    c.optim.name = "lars"
    # LARS is not linear in batch size at this scale: give the peak directly.
    c.optim.base_batch_size = c.batch_size
    c.optim.learning_rate = 8.0
    c.optim.warmup_epochs = 2
    c.optim.schedule = "poly2"
    c.optim.nesterov = False
    c.model.bn_group_size = 0      # set to e.g. 2 on multi-node runs (BN over GPU pairs)
    # Train at low resolution early (cheaper steps), full resolution at the end.
    c.progressive_resizing = ((0.0, 160), (0.4, 192), (0.85, 224))
    c.eval_every_steps, c.eval_every_epochs = 0, 4
    c.checkpoint_every_steps, c.checkpoint_every_epochs = 0, 1
  else:
    raise ValueError(f"configs/resnet50.py variant {variant!r}: use 'standard' or 'fast'")
  return c
