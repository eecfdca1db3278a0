"""Fine-tune an ImageNet-pretrained ResNet-50 on an ImageFolder dataset (DIR/{train,val}/CLASS/*.jpg).

  pip install -e '.[hub]'   # huggingface_hub, for hf-hub: weights
  jaxnet train --config=finetune --workdir=$WORKDIR --config.data.dir=$DATA

Starts from torchvision's ImageNet weights for resnet50 (76.13% ImageNet top-1),
fetched from timm's copy on the Hugging Face Hub, hf-hub:timm/resnet50.tv_in1k.
Without network, download that repository's model.safetensors and pass it:
--config.init.weights=/path/model.safetensors (a torchvision .pth works where
torch is installed). The classifier head is re-initialised for the dataset's
classes; mean/std and the eval resize (256, center crop 224, bilinear) follow
the weights and are recorded in WORKDIR/preprocessing.json. Other depths:
--config.model.name=resnet18 --config.init.weights=hf-hub:timm/resnet18.tv_in1k.
Small datasets or per-device batches under ~16: add --config.model.freeze_bn_stats=true.

Meant for: one GPU, bf16. Activations saved for the backward pass are ~8 GiB at
batch 64 by docs/models.md's measure (4.10 GiB at batch 32), so a 16 GB GPU
should hold it.
Expect: not measured by jaxnet on a real dataset yet (the machines it was built
on had no network to fetch the weights). What is measured is the mechanism, at
small scale: notebooks/finetune.ipynb (run by tests/test_notebooks.py) starts
resnet_tiny from weights exported by a run on one generated folder, on another
with different classes, and it beats the same run from scratch (numbers in
docs/models.md, "Fine-tuning").
"""

from jaxnet.core.config import base_config


def get_config():
  c = base_config()
  c.batch_size = 64
  c.num_epochs = 15
  c.image_size = 224
  c.precision = "bf16"
  c.label_smoothing = 0.1
  c.log_every_steps = 50
  c.eval_every_steps = 500
  c.checkpoint_every_steps = 500
  c.keep_checkpoints = 2

  c.model.name = "resnet50"
  c.init.weights = "hf-hub:timm/resnet50.tv_in1k"
  c.init.keep_head = True          # re-initialised anyway unless the dataset has 1000 classes

  c.data.source = "imagefolder"
  c.data.eval_split = "val"
  c.data.workers = 8

  c.optim.name = "sgd"
  c.optim.learning_rate = 0.04     # at batch 256, so 0.01 at this batch of 64: a tenth of ImageNet's
  c.optim.warmup_epochs = 1.0
  c.optim.weight_decay = 1e-4
  return c
