"""Pretrained weights: PyTorch-named tensors in and out (ResNet, AlexNet, ViT), and `config.init`.

  resnet_names.py   jaxnet ResNet variable paths -> torchvision state-dict names (one direction)
  alexnet_names.py  the same for torchvision's AlexNet, and its fc1 layout
  vit_names.py      the same for timm's Vision Transformers
  convnext_names.py, efficientnet_names.py  torchvision's and timm's names of ConvNeXt and
                    EfficientNet (NAMINGS: a file is read in either, exported in the first or
                    the one asked for)
  torch_names.py    what those share: PyTorch kernel layouts, whole state dicts both ways (the
                    inverse names from the model's paths, the inverse layouts from the forward)
  tensor_files.py   read .safetensors (numpy only) or .pth (with torch); write .safetensors
  hub.py            `hf-hub:timm/NAME` -> a local model.safetensors and timm's preprocessing
  preprocessing.py  the normalisation and eval resize/crop that weights expect
  pretrained.py     `init.weights`: a source's variables into a fresh train state
  export.py         a workdir -> PyTorch-named .safetensors (`python -m jaxnet.cli.export --format=torch`)

See docs/models.md ("Pretrained weights").
"""
