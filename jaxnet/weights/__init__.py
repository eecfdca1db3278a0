"""Pretrained weights: PyTorch-named tensors in and out (ResNet, AlexNet, ViT), and `config.init`.

  resnet_names.py   jaxnet ResNet variable paths <-> torchvision state-dict names and layouts
  alexnet_names.py  the same for torchvision's AlexNet
  vit_names.py      the same for timm's Vision Transformers
  torch_names.py    what those share: PyTorch kernel layouts, a state dict -> jaxnet variables
  tensor_files.py   read .safetensors (numpy only) or .pth (with torch); write .safetensors
  hub.py            `hf-hub:timm/NAME` -> a local model.safetensors and timm's preprocessing
  preprocessing.py  the normalisation and eval resize/crop that weights expect
  pretrained.py     `init.weights`: a source's variables into a fresh train state
  export.py         a workdir -> PyTorch-named .safetensors (`python -m jaxnet.export --format=torch`)

See docs/models.md ("Pretrained weights").
"""
