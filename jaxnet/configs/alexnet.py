"""AlexNet on ImageNet (ILSVRC-2012), the 2012-style recipe.

  jaxnet train --config=alexnet --workdir=$WORKDIR \
      --config.data.dir=$TFDS_DATA_DIR

The model is torchvision's single-tower AlexNet (61.1M parameters; see
jaxnet/core/models/alexnet.py). The recipe is Krizhevsky et al.'s: SGD with plain
momentum 0.9, learning rate 0.01 at batch 256, weight decay 5e-4, dropout 0.5,
90 epochs, here with cosine decay instead of the original's step-wise cuts,
on Inception crops + flips at 224px (torchvision's reference training uses the same
augmentation).

Meant for: one GPU or one 8-GPU server (batch 256 in total: 32 per GPU on 8).
AlexNet needs little compute per image (0.71 GMACs), so the input pipeline
sets the pace: give data.workers as many cores as the host can spare.
Data: tfds `imagenet2012` as ArrayRecord in data.dir (docs/data.md), or an
ImageFolder with --config.data.source=imagefolder.
Expect: ~56.5% top-1 / ~79% top-5, torchvision's published result for this
architecture (its recipe: lr 0.01, batch 256, step decay, wd 1e-4). jaxnet has
not trained it on ImageNet yet.
"""

from jaxnet.core.config import base_config


def get_config():
  c = base_config()
  c.model.name = "alexnet"
  c.data.source = "tfds"
  c.data.name = "imagenet2012"
  c.data.eval_split = "validation"
  c.data.workers = 12
  c.image_size = 224
  c.data.eval_crop_fraction = 0.875
  c.precision = "bf16"
  c.batch_size = 256
  c.num_epochs = 90
  c.log_every_steps = 100
  c.eval_every_steps = 5004 * 5     # every 5 epochs at batch 256
  c.checkpoint_every_steps = 5004

  c.optim.name = "sgd"
  c.optim.learning_rate = 0.01     # at base_batch_size 256; scaled linearly with batch_size
  c.optim.base_batch_size = 256
  c.optim.momentum = 0.9
  c.optim.nesterov = False
  c.optim.weight_decay = 5e-4      # on conv and dense kernels
  c.optim.schedule = "cosine"
  c.optim.warmup_epochs = 0.0
  return c
