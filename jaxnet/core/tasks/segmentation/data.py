"""Segmentation data: images with a mask each, a class id per pixel, in one of two layouts.

  voc     Pascal VOC's:  DIR/ImageSets/Segmentation/SPLIT.txt   the split's ids, one a line
                         DIR/JPEGImages/ID.jpg                   the image
                         DIR/SegmentationClass/ID.png            its mask (a palette PNG)
  masks   a plain folder pair:  DIR/classes.txt    the class names, line k naming class k
                                DIR/IMAGES/NAME.jpg|jpeg|png     (IMAGES: segmentation.image_folder)
                                DIR/MASKS/NAME.png               (MASKS: segmentation.mask_folder)

A mask is a palette or single-channel PNG of the image's size whose pixel values are class ids;
the ignore label (segmentation.ignore_label, 255 as VOC's borders) counts nowhere. Every mask
is read when the source is made, before step 1, and what would train on wrong targets is
refused in one line naming the file and the fix: an image without its mask, a mask of another
size, a value that is neither a class nor the ignore label, a mask that ignores every pixel.
"""

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

from jaxnet.core import provenance
from jaxnet.core.data import decode
from jaxnet.core.errors import InvalidValueError, MissingFileError

VOC_CLASSES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair",
               "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
               "train", "tvmonitor")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def read_mask(data_or_path) -> np.ndarray:
  """A mask PNG (bytes or a path) -> uint8 (H, W) class ids; a colour image is refused."""
  import io
  with Image.open(io.BytesIO(data_or_path) if isinstance(data_or_path, bytes) else data_or_path) as image:
    if image.mode not in ("P", "L"):
      where = data_or_path if isinstance(data_or_path, str) else "a mask"
      raise InvalidValueError(f"{where} is a {image.mode} image: a mask is a palette or single-channel PNG "
                              f"whose values are class ids (VOC's SegmentationClass/, not a colour rendering)")
    return np.asarray(image, np.uint8)


class MaskSource:
  """Random-access records {"image": bytes, "mask_png": bytes, "path"} of (image, mask) file
  pairs, checked when made (module docstring)."""

  encoded = True
  IDENTITY_KINDS = provenance.IDENTITY_KINDS

  def __init__(self, kind: str, root: str, split: str, pairs: list, class_names, ignore_label: int,
               fix_missing: str, fix_classes: str):
    self.kind, self.root, self.split = kind, root, split
    self.class_names, self.num_classes = list(class_names), len(class_names)
    self.ignore_label, self.fix_classes = ignore_label, fix_classes
    if not pairs:
      raise MissingFileError(f"{kind} data in {root} has no {split} images: check data.dir and the split")
    missing = next((pair for pair in pairs if not os.path.isfile(pair[1])), None)
    if missing:
      raise MissingFileError(f"{missing[0]} has no mask {missing[1]}: {fix_missing}")
    with ThreadPoolExecutor(8) as pool:
      list(pool.map(self._check, pairs))
    self._pairs = pairs
    self.note = None

  def _check(self, pair) -> None:
    image_path, mask_path = pair
    labels = read_mask(mask_path)
    try:
      with Image.open(image_path) as image:
        size = image.size
    except FileNotFoundError:
      raise MissingFileError(f"{image_path} not found (its mask is {mask_path}): put the image there or "
                             f"remove the pair") from None
    except Exception:  # unreadable: masked and counted as any unreadable image when read
      size = None
    if size and size != (labels.shape[1], labels.shape[0]):
      raise InvalidValueError(
          f"{mask_path} is {labels.shape[1]}x{labels.shape[0]} but its image {image_path} is {size[0]}x{size[1]}: "
          f"a mask gives each pixel of its image a class; replace the mask (or resize it, nearest-neighbour)")
    values = np.unique(labels)
    bad = [int(v) for v in values if v >= self.num_classes and v != self.ignore_label]
    if bad:
      raise InvalidValueError(
          f"{mask_path} holds values {bad[:5]}: neither one of the {self.num_classes} classes (0-"
          f"{self.num_classes - 1}) nor the ignore label {self.ignore_label} (config.segmentation.ignore_label); "
          f"{self.fix_classes}")
    if len(values) == 1 and values[0] == self.ignore_label:
      raise InvalidValueError(f"{mask_path} is the ignore label {self.ignore_label} in every pixel: the "
                              f"image would teach and score nothing; remove it from the {self.split} data or "
                              f"label it")

  def __len__(self):
    return len(self._pairs)

  def __getitem__(self, index: int) -> dict:
    image_path, mask_path = self._pairs[index]
    with open(mask_path, "rb") as f:
      mask = f.read()
    return {**decode.read_file(image_path), "mask_png": mask, "path": image_path}

  def identity(self, kind: str = "listing") -> dict:
    """The classes, the pair count and the digest of every image's and mask's path (relative
    to the root) and size; `kind` "sampled" or "content" adds a digest of their bytes."""
    paths = [p for pair in self._pairs for p in pair]
    names = [os.path.relpath(p, self.root) for p in paths]
    lines = sorted(f"{name}\t{os.stat(path).st_size}" for name, path in zip(names, paths))
    identity = {"source": self.kind, "split": self.split, "classes": self.class_names, "images": len(self),
                "listing_sha256": provenance.sha256_lines(lines)}
    if kind != "listing":
      identity[f"{kind}_sha256"] = provenance.files_sha256(paths, names, kind)
    return identity

  def __repr__(self):  # Grain checks a restored iterator against it: no memory addresses
    return f"MaskSource({self.kind!r}, {self.root!r}, {self.split!r}, n={len(self)})"


def voc_source(root: str, split: str, ignore_label: int = 255) -> MaskSource:
  """Pascal VOC's segmentation split `split` (train, val, trainval) under `root` (VOC2012/)."""
  listing = os.path.join(root, "ImageSets", "Segmentation", f"{split}.txt")
  if not os.path.isfile(listing):
    raise MissingFileError(f"{listing} not found: data.source=voc reads Pascal VOC's layout, data.dir holding "
                           f"ImageSets/Segmentation/{split}.txt, JPEGImages/ and SegmentationClass/ "
                           f"(VOCdevkit/VOC2012)")
  with open(listing) as f:
    ids = [line.split()[0] for line in f if line.strip()]
  pairs = [(os.path.join(root, "JPEGImages", f"{i}.jpg"), os.path.join(root, "SegmentationClass", f"{i}.png"))
           for i in ids]
  return MaskSource("voc", root, split, pairs, VOC_CLASSES, ignore_label,
                    f"give it one, or remove its id from {listing}",
                    "fix the mask (VOC's hold its 21 classes and 255)")


def folder_source(root: str, split: str, image_folder: str = "{split}", mask_folder: str = "masks/{split}",
                  ignore_label: int = 255) -> MaskSource:
  """The images of root/IMAGES with the masks of the same names in root/MASKS (the folders
  formatted with the split), the class names from root/classes.txt."""
  classes = os.path.join(root, "classes.txt")
  if not os.path.isfile(classes):
    raise MissingFileError(f"{classes} not found: data.source=masks reads the class names from it, one a "
                           f"line, line k naming class k (the value k in a mask)")
  with open(classes) as f:
    class_names = [line.strip() for line in f if line.strip()]
  images = os.path.join(root, image_folder.format(split=split))
  masks = os.path.join(root, mask_folder.format(split=split))
  if not os.path.isdir(images):
    raise MissingFileError(f"{images} not found: data.source=masks reads the {split} images from "
                           f"DIR/{image_folder} (config.segmentation.image_folder) and their masks from "
                           f"DIR/{mask_folder}")
  names = sorted(n for n in os.listdir(images)
                 if n.lower().endswith(IMAGE_EXTENSIONS) and not n.startswith("."))
  pairs = [(os.path.join(images, n), os.path.join(masks, os.path.splitext(n)[0] + ".png")) for n in names]
  return MaskSource("masks", root, split, pairs, class_names, ignore_label,
                    f"give every image in {images} its mask NAME.png in {masks}, or remove the image",
                    f"fix the mask, or name the class in {classes}")


class SyntheticMasks:
  """Random images, each with one to three random rectangles of random classes as its mask, the
  same for the same index, as PNG records like MaskSource's: a segmenter's throughput, and its
  GPU plan, without a dataset (config.data.source=synthetic, data.num_classes classes)."""

  encoded = True

  def __init__(self, size: int, image_size: int, num_classes: int, seed: int = 0):
    self.size, self.image_size, self.num_classes, self.seed = size, image_size, num_classes, seed
    self.class_names = None

  def __len__(self):
    return self.size

  def identity(self) -> dict:
    """The generator and its parameters: they make every image and mask."""
    return {"generator": "SyntheticMasks", "examples": self.size, "image_size": self.image_size,
            "num_classes": self.num_classes, "seed": self.seed}

  def __repr__(self):
    return f"SyntheticMasks(size={self.size}, image_size={self.image_size}, seed={self.seed})"

  def __getitem__(self, index: int) -> dict:
    import io
    rng = np.random.default_rng((self.seed, int(index)))
    s = self.image_size
    labels = np.zeros((s, s), np.uint8)
    for _ in range(int(rng.integers(1, 4))):
      top, left = rng.integers(0, s, 2)
      labels[top:top + max(s // 4, 1), left:left + max(s // 4, 1)] = rng.integers(0, self.num_classes)
    encoded = []
    for pixels in (rng.integers(0, 256, (s, s, 3), dtype=np.uint8), labels):
      out = io.BytesIO()
      Image.fromarray(pixels).save(out, format="PNG")
      encoded.append(out.getvalue())
    return {"image": encoded[0], "mask_png": encoded[1], "path": f"synthetic/{index}"}
