"""RetinaNet (a ResNet-FPN detector): COCO 2017, and a shapes dataset for a CPU.

  jaxnet train --config=retinanet --workdir=$WORKDIR --config.data.dir=$COCO
  jaxnet make_shapes /tmp/shapes
  jaxnet train --config=retinanet:shapes --workdir=/tmp/jaxnet-shapes \
      --config.data.dir=/tmp/shapes

ARGS (comma-separated, all optional): recipe=coco|shapes (default coco; a bare `shapes` is the
recipe), depth=18|34|50|101 (coco; default 50).

coco: torchvision's `retinanet_resnet50_fpn` (v1) setup on COCO 2017 ($COCO/annotations/
instances_{train2017,val2017}.json, $COCO/{train2017,val2017}/): ResNet-50-FPN, its BN frozen,
images resized to 1024 on the longer side and padded square, bf16, SGD (momentum 0.9,
weight decay 1e-4) at 0.01 per 16 images with 1,000 warmup steps, a 1x schedule (12 epochs,
cosine decay where torchvision steps the rate down at epochs 8 and 11). Start the backbone
from ImageNet weights (--config.init.weights=...).
  Meant for: one server with 8 GPUs (batch 64, 8 per GPU; 25.9 GiB per H100 by
  jaxnet gpu_plan --config=retinanet).
  Expect: torchvision's published result for this model, 36.4 box AP (mAP@[.5:.95]) on
  val2017; not measured by jaxnet (no COCO and no GPU here).

shapes: retinanet_tiny on jaxnet make_shapes's dataset (1,000 train and 200
val images of 1-4 shapes, 4 classes) at 128 pixels, from scratch.
  Meant for: a CPU (made on 2 cores).
  Expect: mAP@0.5 0.78 (mAP@[.5:.95] 0.61) after 179 s of training on an idle 2-core x86_64
  VM, 2026-11-26 (experiments/RESULTS.md); on such a VM shared with other jobs (reported
  2026-11-29) the run's ETA said 15-28 minutes. tests/test_detection.py's slow test holds it to >= 0.5 within 10
  minutes.
"""

from jaxnet.core.config import base_config
from jaxnet.core.config import parse_arg


def get_config(arg: str = ""):
  args = parse_arg(arg, positional="recipe", recipe="coco", depth=50)
  c = base_config()
  c.data.source = "coco"
  c.optim.name = "sgd"
  c.optim.momentum = 0.9
  c.optim.nesterov = False
  c.optim.weight_decay = 1e-4
  c.optim.schedule = "cosine"
  if args.recipe == "coco":
    c.model.name = f"retinanet_resnet{args.depth}"
    c.data.train_split, c.data.eval_split = "train2017", "val2017"
    c.data.workers = 12
    c.image_size = 1024
    c.batch_size = 64
    c.num_epochs = 12
    c.precision = "bf16"
    c.optim.learning_rate = 0.01   # per base_batch_size images: 0.04 at batch 64
    c.optim.base_batch_size = 16
    c.optim.warmup_steps = 1000
    c.log_every_steps = 100
    c.eval_every_steps, c.eval_every_epochs = 0, 4
    c.checkpoint_every_steps, c.checkpoint_every_epochs = 0, 1
  elif args.recipe == "shapes":
    c.model.name = "retinanet_tiny"
    c.model.freeze_bn_stats = False  # trained from scratch: its BN learns its statistics
    c.data.train_split, c.data.eval_split = "train", "val"
    c.data.mean, c.data.std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    c.image_size = 128
    c.batch_size = 32
    c.num_epochs = 30
    # From scratch, AdamW learns this in minutes where SGD at the COCO rate barely starts
    # (10 epochs: AP50 0.48 against 0.002, 2 CPU cores, 2026-11-26).
    c.optim.name = "adamw"
    c.optim.learning_rate = 0.002
    c.optim.base_batch_size = 32
    c.optim.grad_clip_norm = 10.0
    c.optim.warmup_epochs = 1
    c.detection.max_boxes = 8
    c.detection.candidates_per_level = 300
    c.detection.max_detections = 100  # COCO's AP counts 100 per image
    c.log_every_steps = 50
    c.eval_every_steps, c.eval_every_epochs = 0, 10
    c.checkpoint_every_steps, c.checkpoint_every_epochs = 0, 10
  else:
    raise ValueError(f"retinanet recipe={args.recipe!r}: use 'coco' or 'shapes'")
  return c
