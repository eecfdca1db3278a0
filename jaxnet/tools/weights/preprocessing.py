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


# torchvision's ImageNet weights (and timm's `tv_in1k` copies of them).
TORCHVISION = Preprocessing((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 0.875, "bilinear")


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
