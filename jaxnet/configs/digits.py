"""Quick start: a tiny ResNet on scikit-learn's bundled 8x8 digits, upsampled to 16x16.

  jaxnet train --config=digits --workdir=/tmp/jaxnet-digits

Meant for: any CPU (made on 2 cores, no GPU). Nothing is downloaded.
Expect: >= 97% test top-1 (1,438 train / 359 test images; 15 epochs of batch 64 = 330 steps):
0.9972 with Python 3.11 / jax 0.10.2, 0.9916 with Python 3.12 / jax 0.12.0.1 (the same on
every rerun), in 16-37 s of training (the run's last line prints both) on a 2-core x86_64 VM
shared with other jobs (load 6-14), 2026-11-29. README.md has the whole command's times.
"""

from jaxnet.core.config import base_config


def get_config():
  c = base_config()
  c.batch_size = 64
  c.num_epochs = 15
  c.image_size = 16
  c.precision = "fp32"
  c.log_every_steps = 50
  c.eval_every_steps = 110
  c.checkpoint_every_steps = 110
  c.keep_checkpoints = 2

  c.model.name = "resnet_tiny"
  c.model.zero_init_last_bn = False

  c.data.source = "digits"
  c.data.eval_split = "test"
  c.data.mean = (0.2,)
  c.data.std = (0.35,)
  # The stored digits are whole images (8x8 upsampled): predict and the exports take a file's
  # shorter side to image_size and crop nothing off, as the record says.
  c.data.eval_crop_fraction = 1.0

  c.optim.name = "sgd"
  c.optim.learning_rate = 0.4      # at batch 256; 0.1 at this batch of 64
  c.optim.warmup_epochs = 1.0
  c.optim.weight_decay = 5e-4
  return c
