"""FCN and DeepLabV3 (semantic segmentation): Pascal VOC, and a shapes dataset for a CPU.

  jaxnet train --config=fcn --workdir=$WORKDIR --config.data.dir=$VOC   # VOCdevkit/VOC2012
  jaxnet make_shapes /tmp/shapes
  jaxnet train --config=fcn:shapes --workdir=/tmp/jaxnet-seg --config.data.dir=/tmp/shapes

ARGS (comma-separated, all optional): recipe=voc|shapes (default voc; a bare `shapes` is the
recipe), head=fcn|deeplabv3 (default fcn), depth=50|101 (voc; default 50).

voc: torchvision's segmentation reference recipe (`fcn_resnet50`, `deeplabv3_resnet50`) on
Pascal VOC 2012's folders (data.source=voc: ImageSets/Segmentation/{train,val}.txt,
JPEGImages/, SegmentationClass/; docs/segmentation.md): ResNet-50 with dilated last stages
(output stride 8), the auxiliary head on layer3 weighted 0.5, 480-pixel random crops of images
scaled 0.5-2x, flips, SGD (momentum 0.9, weight decay 1e-4) at 0.02 per 16 images, 30 epochs,
bf16; cosine decay where torchvision decays polynomially (power 0.9). Start the backbone from
ImageNet weights (--config.init.weights=...).
  Meant for: one server with 8 GPUs (batch 32, 4 per GPU).
  Expect: not measured by jaxnet (no VOC and no GPU here). torchvision's published figures
  (63.7 mIoU for fcn_resnet50, 66.4 for deeplabv3_resnet50) are on COCO's val2017 subset of the
  VOC classes, not on VOC's val.

shapes: fcn_tiny on jaxnet make_shapes's dataset (1,000 train and 200 val images of 1-4 shapes;
5 classes with the background) at 128 pixels, from scratch, eval'd on the whole val images.
  Meant for: a CPU (made on 2 cores).
  Expect: mean IoU 0.668 (pixel accuracy 0.961) on the 200 val images after 97 s of
  training (93 s in a second run, the same result) with --config.mesh.num_devices=1 on a
  2-core x86_64 VM shared with other jobs, 2026-11-29 (docs/segmentation.md). tests/test_segmentation.py's
  bar test holds it to >= 0.6 within 5 minutes.
"""

from jaxnet.core.config import base_config
from jaxnet.core.config import parse_arg


def get_config(arg: str = ""):
  args = parse_arg(arg, positional="recipe", recipe="voc", head="fcn", depth=50)
  if args.head not in ("fcn", "deeplabv3"):
    raise ValueError(f"fcn head={args.head!r}: use 'fcn' or 'deeplabv3'")
  c = base_config()
  c.optim.name = "sgd"
  c.optim.momentum = 0.9
  c.optim.nesterov = False
  c.optim.weight_decay = 1e-4
  c.optim.schedule = "cosine"
  if args.recipe == "voc":
    c.model.name = f"{args.head}_resnet{args.depth}"
    c.model.aux_loss = True
    c.data.source = "voc"
    c.data.num_classes = 21        # VOC's, where data.source=synthetic stands in (the GPU plan)
    c.data.train_split, c.data.eval_split = "train", "val"
    c.data.workers = 12
    c.image_size = 480
    c.batch_size = 32
    c.num_epochs = 30
    c.precision = "bf16"
    c.optim.learning_rate = 0.02   # per base_batch_size images: 0.04 at batch 32
    c.optim.base_batch_size = 16
    c.optim.warmup_epochs = 1
    c.data.eval_batch_size = 16
    c.log_every_steps = 50
    c.eval_every_steps, c.eval_every_epochs = 0, 5
    c.checkpoint_every_steps, c.checkpoint_every_epochs = 0, 1
  elif args.recipe == "shapes":
    c.model.name = f"{args.head}_tiny"
    c.data.source = "masks"
    c.data.train_split, c.data.eval_split = "train", "val"
    c.data.mean, c.data.std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    c.image_size = 128
    c.batch_size = 32
    c.num_epochs = 10
    c.segmentation.scale_range = (0.75, 1.25)
    # From scratch, AdamW learns this in minutes (as the detection shapes recipe).
    c.optim.name = "adamw"
    c.optim.learning_rate = 0.006
    c.optim.base_batch_size = 32
    c.optim.weight_decay = 1e-4
    c.optim.warmup_epochs = 1
    c.log_every_steps = 25
    c.eval_every_steps, c.eval_every_epochs = 0, 5
    c.checkpoint_every_steps, c.checkpoint_every_epochs = 0, 5
  else:
    raise ValueError(f"fcn recipe={args.recipe!r}: use 'voc' or 'shapes'")
  return c
