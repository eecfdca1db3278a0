"""ResNets on ImageNet (ILSVRC-2012): one file, two recipes, any depth.

  jaxnet train --config=resnet:ARGS --workdir=$WORKDIR \
      --config.data.dir=$TFDS_DATA_DIR
ARGS (comma-separated, all optional): depth=18|34|50|101|152 (default 50),
recipe=standard|fast (default standard), runlocal (shrinks the run for a CPU
smoke test: resnet_tiny at 32px, batch 16, no worker processes, fp32).
jaxnet/configs/resnet50.py is this file at depth 50: `--config=resnet50` and
`--config=resnet50:fast` run the two ResNet-50 recipes.

Standard 90-epoch recipe (Goyal et al. 2017 with cosine decay and label smoothing):
  jaxnet train --config=resnet --workdir=$WORKDIR \
      --config.data.dir=$TFDS_DATA_DIR
Fast recipe, for time to 75.9% on one server of 8 GPUs (LARS, batch 2048, ~40 epochs,
progressive resizing 160 -> 192 -> 224, batch norm per GPU), reading shards that `jaxnet
prepare` made once (images bounded at 256 px, 3/4 of them raw pixels that need no decode:
~4.7x the images per core of full-size JPEGs at 224 px and ~5.4x at 160, ~270 GB for
ImageNet's train split at its defaults; docs/data.md):
  jaxnet prepare --source tfds --dir $TFDS_DATA_DIR --out $PREPARED
  jaxnet train --config=resnet:recipe=fast --workdir=$WORKDIR \
      --config.data.dir=$PREPARED
(or --config.data.source=tfds --config.data.dir=$TFDS_DATA_DIR to read tfds's files as they are).
Where its choices come from:
  LARS (You, Gitman & Ginsburg 2017, arXiv:1708.03888) with a warm-up and polynomial (power 2)
    decay: the optimizer and schedule MLPerf's ResNet-50 benchmark allows and its submissions
    use (mlcommons/training_policies, training_rules.adoc; mlperf-logging's ResNet rules name
    lars_opt_base_learning_rate, lars_opt_learning_rate_warmup_epochs, ..._decay_poly_power).
  Warm-up: Goyal et al. 2017 (arXiv:1706.02677), which made large batches train as well.
  Label smoothing 0.1: Szegedy et al. 2016 (Inception-v3, arXiv:1512.00567); MLPerf allows it.
  Progressive sizes: FFCV's ResNet-50 configs train at 160 -> 192 px and test at 224
    (libffcv/ffcv-imagenet README); fast.ai's DAWNBench entry grew its images through training
    too. The final 224 px phase is jaxnet's choice, not a published configuration.
  Batch norm per GPU (bn_group_size=1): PyTorch DDP's BatchNorm and MLPerf's GPU submissions
    at ~256 images per GPU; synchronised BN over 8 GPUs added 98 small all-reduces in sequence
    to the 8-H100 plan (`jaxnet gpu_plan`).

Meant for: one server with 8 GPUs (A100/H100 class), batch 1024 (128 per GPU) for
the standard recipe; `fast` uses batch 2048. Data: tfds `imagenet2012` prepared
as ArrayRecord in data.dir (see docs/data.md), or an ImageFolder with
--config.data.source=imagefolder --config.data.dir=/path/with/train_and_val.
Expect: ResNet-50 standard ~76.5-77% top-1 after 90 epochs (published results for
this recipe); fast: the MLPerf target 75.9% in ~40 epochs (published MLPerf LARS
runs). Other depths, standard recipe (published 90-epoch results): ResNet-18 ~71%,
ResNet-101 ~78.5%, ResNet-152 ~79%. jaxnet has not yet measured any of these on
ImageNet: see experiments/RESULTS.md.
"""

from jaxnet.core.config import base_config
from jaxnet.core.config import parse_arg


def get_config(arg: str = ""):
  # A bare "fast" or "standard" is the recipe, as in resnet50:fast.
  args = parse_arg(arg, positional="recipe", depth=50, recipe="standard", runlocal=False)
  variant = args.recipe
  c = base_config()
  c.model.name = f"resnet{args.depth}"
  c.model.scatter_free_pool = True  # exact; fewer HBM bytes on a GPU (jaxnet/configs/resnet50.py says how many)
  c.data.source = "tfds"
  c.data.name = "imagenet2012"
  c.data.train_split = "train"
  c.data.eval_split = "validation"
  c.data.workers = -1              # decode+augment processes: one per core, less one (8 GPUs need
                                   # ~53-64k img/s; `python experiments/time_to_accuracy.py --plan`)
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
    c.target_accuracy = 0.759      # MLPerf's ResNet-50 quality target (WORKDIR/mlperf.log)
    c.bn_group_size = 1            # batch norm per GPU (256 images each at batch 2048 on 8 GPUs)
    c.data.source = "prepared"     # `jaxnet prepare`'s shards in data.dir
    # Train at low resolution early (cheaper steps), full resolution at the end.
    c.progressive_resizing = ((0.0, 160), (0.4, 192), (0.85, 224))
    c.eval_every_steps, c.eval_every_epochs = 0, 4
    c.checkpoint_every_steps, c.checkpoint_every_epochs = 0, 1
  else:
    raise ValueError(f"resnet recipe={variant!r}: use 'standard' or 'fast'")

  if args.runlocal:  # the same recipe, small enough for a CPU (tests/test_imagenet_recipe.py)
    c.model.name, c.image_size, c.batch_size, c.precision = "resnet_tiny", 32, 16, "fp32"
    c.data.workers, c.log_every_steps = 0, 4
    c.eval_every_steps, c.eval_every_epochs = 0, 0.0
    c.checkpoint_every_steps, c.checkpoint_every_epochs = 8, 0.0
    if c.progressive_resizing:
      c.progressive_resizing = ((0.0, 24), (0.5, 32))
  return c
