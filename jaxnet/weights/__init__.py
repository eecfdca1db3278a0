"""Pretrained weights: torchvision/timm ResNet tensors in and out, and `config.init`.

  resnet_names.py   jaxnet ResNet variable paths <-> torchvision state-dict names and layouts
  tensor_files.py   read .safetensors (numpy only) or .pth (with torch); write .safetensors
  hub.py            `hf-hub:timm/NAME` -> a local model.safetensors and timm's preprocessing
  preprocessing.py  the normalisation and eval resize/crop that weights expect
  pretrained.py     `init.weights`: a source's variables into a fresh train state
  export.py         a workdir -> torchvision-named .safetensors (`python -m jaxnet.export --format=torchvision`)

See docs/models.md ("Pretrained weights").
"""
