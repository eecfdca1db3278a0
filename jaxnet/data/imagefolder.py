"""Random-access source over an ImageNet-style folder of encoded images.

Layout: root/<split>/<class>/<file>.jpg|.jpeg|.png. Class ids come from the
sorted class directories of root/train, so train and val agree on labels even
when val misses a class. Records are raw file bytes; decoding happens in the
Grain transforms (jaxnet.data.transforms), in the worker processes.
"""

from __future__ import annotations

import os
from jaxnet.errors import MissingFileError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
_CLASSES_SPLIT = "train"


_LAYOUT_HELP = (
    "Expected an ImageNet-style layout <root>/train/<class>/*.jpg and "
    "<root>/val/<class>/*.jpg, one subdirectory per class (for real ImageNet: "
    "the 1000 synset folders n01440764, ... under both train/ and val/; the "
    "flat ILSVRC2012 val images must first be moved into synset folders). "
    "To make a small synthetic one: "
    "python -m jaxnet.data.make_imagefolder <root> --classes 10 --per-class 50"
)


def _missing_dir_message(path: str) -> str:
  return f"Image folder not found: {path!r}. {_LAYOUT_HELP}"


def _require_dir(path: str) -> None:
  if not os.path.isdir(path):
    raise MissingFileError(_missing_dir_message(path))


class ImageFolderSource:
  """Grain random-access source: `source[i] -> {"image": bytes, "label": int}`."""

  encoded = True  # images are encoded bytes; the pipeline must decode them

  def __init__(self, root: str, split: str):
    self.root = root
    self.split = split
    _require_dir(root)
    classes_dir = os.path.join(root, _CLASSES_SPLIT)
    split_dir = os.path.join(root, split)
    _require_dir(classes_dir)
    _require_dir(split_dir)
    self.class_names: list[str] = sorted(
        e.name for e in os.scandir(classes_dir) if e.is_dir())
    self.num_classes = len(self.class_names)
    self._paths: list[str] = []
    self._labels: list[int] = []
    for label, name in enumerate(self.class_names):
      class_dir = os.path.join(split_dir, name)
      if not os.path.isdir(class_dir):
        continue  # a split may lack some classes (small val sets)
      files = sorted(f for f in os.listdir(class_dir)
                     if f.lower().endswith(IMAGE_EXTENSIONS))
      self._paths.extend(os.path.join(class_dir, f) for f in files)
      self._labels.extend([label] * len(files))
    if not self._paths:
      raise MissingFileError(
          f"No .jpg/.jpeg/.png files in the class folders of {split_dir!r} "
          f"(classes taken from {classes_dir!r}). {_LAYOUT_HELP}")

  def __len__(self) -> int:
    return len(self._paths)

  def __getitem__(self, index: int) -> dict:
    with open(self._paths[index], "rb") as f:
      data = f.read()
    return {"image": data, "label": self._labels[index]}

  def path(self, index: int) -> str:
    """File behind record `index` (for tracking down corrupt images)."""
    return self._paths[index]

  def __repr__(self) -> str:
    return (f"ImageFolderSource(root={self.root!r}, split={self.split!r}, "
            f"len={len(self)}, num_classes={self.num_classes})")
