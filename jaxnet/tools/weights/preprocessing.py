"""What pretrained weights expect of their input: normalisation and eval resize/crop.

A model is only as good as the preprocessing it was trained with: torchvision's
ImageNet weights expect the ImageNet mean/std and, at eval, the shorter side
resized to 256 (bilinear) and a center crop of 224; timm's weights record
theirs in the repository's config.json (`pretrained_cfg`). These four values
map onto `config.data.mean`, `.std`, `.eval_crop_fraction` and
`.eval_interpolation`, and a run started from weights stores them in
WORKDIR/preprocessing.json.
"""

import dataclasses
import json

from jaxnet.core.errors import InvalidValueError

FILE = "preprocessing.json"


@dataclasses.dataclass(frozen=True)
class Preprocessing:
  mean: tuple[float, ...]          # per channel, of pixels in [0, 1]
  std: tuple[float, ...]
  crop_fraction: float             # eval: shorter side to image_size / this, then center-crop
  interpolation: str               # eval resize filter, a key of transforms.EVAL_INTERPOLATIONS

  def __post_init__(self):
    from jaxnet.core.data.transforms import EVAL_INTERPOLATIONS  # lazily: it loads OpenCV
    if self.interpolation not in EVAL_INTERPOLATIONS:
      raise InvalidValueError(f"interpolation {self.interpolation!r} is not supported; jaxnet's eval "
                              f"resizes with one of {sorted(EVAL_INTERPOLATIONS)}")
    if len(self.mean) != len(self.std):
      raise InvalidValueError(f"mean {self.mean} and std {self.std} have different lengths")

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self))

  @classmethod
  def from_dict(cls, d: dict) -> "Preprocessing":
    return cls(tuple(d["mean"]), tuple(d["std"]), float(d["crop_fraction"]), d["interpolation"])

  @classmethod
  def from_json(cls, text: str) -> "Preprocessing":
    return cls.from_dict(json.loads(text))


# torchvision's ImageNet weights (and timm's `tv_in1k` copies of them): ResNet, AlexNet, ViT-B.
TORCHVISION = Preprocessing((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 0.875, "bilinear")

# The eval transform torchvision documents for its ImageNet weights of the other models (each
# weights enum's DEFAULT: `ImageClassification(crop_size, resize_size, interpolation[, mean,
# std])`), as (crop, resize, interpolation[, mean, std]); the crop is the model's image_size,
# the crop fraction crop / resize. EfficientNet-B1's DEFAULT is its V2 weights (240 of 255,
# bilinear; the V1 weights, ...rwightman-533bc792.pth, documented 240 of 256, bicubic).
TORCHVISION_EVAL = {
    "convnext_tiny": (224, 236, "bilinear"), "convnext_small": (224, 230, "bilinear"),
    "convnext_base": (224, 232, "bilinear"), "convnext_large": (224, 232, "bilinear"),
    "efficientnet_b0": (224, 256, "bicubic"), "efficientnet_b1": (240, 255, "bilinear"),
    "efficientnet_b2": (288, 288, "bicubic"), "efficientnet_b3": (300, 320, "bicubic"),
    "efficientnet_b4": (380, 384, "bicubic"), "efficientnet_b5": (456, 456, "bicubic"),
    "efficientnet_b6": (528, 528, "bicubic"), "efficientnet_b7": (600, 600, "bicubic"),
    "efficientnet_v2_s": (384, 384, "bilinear"), "efficientnet_v2_m": (480, 480, "bilinear"),
    "efficientnet_v2_l": (480, 480, "bicubic", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "vit_l16": (224, 242, "bilinear"),
}


def torchvision_eval(model: str) -> tuple[Preprocessing, str]:
  """(what torchvision documents for its weights of `model`, said in words): TORCHVISION_EVAL,
  or TORCHVISION for the models it does not list."""
  if model not in TORCHVISION_EVAL:
    return TORCHVISION, "torchvision's ImageNet eval (224 of 256, bilinear)"
  crop, resize, interpolation, *normalisation = TORCHVISION_EVAL[model]
  mean, std = normalisation or (TORCHVISION.mean, TORCHVISION.std)
  return (Preprocessing(tuple(mean), tuple(std), crop / resize, interpolation),
          f"torchvision's documented eval for {model} ({crop} of {resize}, {interpolation})")


def from_timm(pretrained_cfg: dict) -> Preprocessing:
  """From timm's `pretrained_cfg` (mean, std, crop_pct, interpolation, crop_mode)."""
  if pretrained_cfg.get("crop_mode", "center") != "center":
    raise InvalidValueError(f"timm crop_mode {pretrained_cfg['crop_mode']!r} is not supported; jaxnet's "
                            f"eval takes a center crop")
  return Preprocessing(tuple(pretrained_cfg["mean"]), tuple(pretrained_cfg["std"]),
                       float(pretrained_cfg.get("crop_pct", 0.875)),
                       pretrained_cfg.get("interpolation", "bilinear"))


def of_config(config) -> Preprocessing:
  d = config.data
  return Preprocessing(tuple(d.mean), tuple(d.std), float(d.eval_crop_fraction), d.eval_interpolation)


def set_in_config(config, p: Preprocessing) -> None:
  config.data.mean, config.data.std = tuple(p.mean), tuple(p.std)
  config.data.eval_crop_fraction, config.data.eval_interpolation = p.crop_fraction, p.interpolation
