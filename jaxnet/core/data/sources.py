"""Data sources: random-access collections of `{"image", "label"}` records.

A source has `len()`, `[i]`, `num_classes`, `class_names` and `encoded`:
`encoded=True` sources hold JPEG bytes that the pipeline decodes in its worker
processes; `encoded=False` sources hold uint8 HWC arrays of the final size.

  digits       scikit-learn's bundled 8x8 digits, upsampled (no download)
  synthetic    random uint8 images made on the host (throughput work)
  imagefolder  DIR/{train,val}/<class>/*.jpg         (jaxnet/core/data/imagefolder.py)
  tfds         tfds ArrayRecord, e.g. imagenet2012   (jaxnet/core/data/tfds_source.py)
  prepared     DIR made by `jaxnet prepare`: bounded images (JPEGs, raw pixels) in ArrayRecord shards
               (jaxnet/core/data/prepared.py)

These are the image-and-label sources (classification's: jaxnet/core/tasks/classification/).
A task's own sources live in its package (detection's COCO-format boxes:
jaxnet/core/tasks/detection/coco.py).
"""

import hashlib

import numpy as np

from jaxnet.core.errors import InvalidValueError

# The digits train/test split is fixed (not tied to config.seed) so that every
# run, whatever its seed, is scored on the same test images.
_DIGITS_SPLIT_SEED = 0
_DIGITS_TEST_FRACTION = 0.2


class ArraySource:
  """In-memory uint8 NHWC images with integer labels."""
  encoded = False

  def __init__(self, images: np.ndarray, labels: np.ndarray, num_classes: int, class_names=None,
               generator: dict | None = None):
    """`generator`: how the arrays were made (a name and its parameters), for `identity`."""
    assert images.dtype == np.uint8 and images.ndim == 4, images.shape
    self.images, self.labels = images, labels.astype(np.int32)
    self.num_classes, self.class_names = num_classes, class_names
    self.generator = generator or {"generator": "arrays"}

  def identity(self) -> dict:
    """What made the arrays, and a digest of them (small: they are in memory), so a changed
    generator (another scikit-learn's digits, a resize) shows too."""
    digest = hashlib.sha256(self.images.tobytes())
    digest.update(self.labels.astype("<i4").tobytes())
    return {**self.generator, "examples": len(self), "shape": list(self.images.shape[1:]),
            "num_classes": self.num_classes, "content_sha256": digest.hexdigest()}

  def __len__(self):
    return len(self.images)

  def __repr__(self):
    # Grain checks a restored iterator against repr(source): no memory addresses.
    return f"ArraySource(n={len(self.images)}, shape={self.images.shape[1:]}, classes={self.num_classes})"

  def __getitem__(self, index):
    return {"image": self.images[index], "label": self.labels[index]}


def digits_source(split: str, image_size: int = 16) -> ArraySource:
  """The 1,797 8x8 digit images of scikit-learn, split 80/20, upsampled to image_size."""
  from sklearn.datasets import load_digits  # bundled with scikit-learn: no download
  digits = load_digits()
  images = (digits.images * (255.0 / 16.0)).round().astype(np.uint8)  # 0..16 -> 0..255
  order = np.random.default_rng(_DIGITS_SPLIT_SEED).permutation(len(images))
  num_test = int(len(images) * _DIGITS_TEST_FRACTION)
  if split == "train":
    idx = order[num_test:]
  elif split in ("test", "val", "validation"):
    idx = order[:num_test]
  else:
    raise InvalidValueError(f"digits has splits 'train' and 'test', not {split!r}")
  images = _resize_batch(images[idx], image_size)[..., None]
  generator = {"generator": "sklearn.datasets.load_digits", "split": split,
               "split_seed": _DIGITS_SPLIT_SEED, "test_fraction": _DIGITS_TEST_FRACTION,
               "image_size": image_size}
  return ArraySource(images, digits.target[idx], 10, [str(d) for d in range(10)], generator)


def _resize_batch(images: np.ndarray, size: int) -> np.ndarray:
  from PIL import Image
  return np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.BILINEAR)) for im in images])


class SyntheticSource:
  """Random images, the same for the same index: no disk or decode cost."""
  encoded = False

  def __init__(self, size: int, image_size: int, num_classes: int = 1000, seed: int = 0,
               channels: int = 3):
    self.size, self.image_size, self.num_classes, self.seed = size, image_size, num_classes, seed
    self.channels, self.class_names = channels, None

  def __len__(self):
    return self.size

  def __repr__(self):
    return (f"SyntheticSource(size={self.size}, image_size={self.image_size}, seed={self.seed}"
            f"{f', channels={self.channels}' if self.channels != 3 else ''})")

  def identity(self) -> dict:
    """The generator and its parameters: they make every image."""
    return {"generator": "SyntheticSource", "examples": self.size, "image_size": self.image_size,
            "num_classes": self.num_classes, "seed": self.seed, "channels": self.channels}

  def __getitem__(self, index):
    rng = np.random.default_rng((self.seed, int(index)))
    image = rng.integers(0, 256, (self.image_size, self.image_size, self.channels), dtype=np.uint8)
    return {"image": image, "label": np.int32(rng.integers(self.num_classes))}


_NOTE_NAMES = 5  # entries named in the note; the rest are counted


def ignored_note(sources) -> str | None:
  """One line naming the entries the sources skipped (hidden, not images), or None.

  Sources that skip entries (imagefolder) list them, relative to their root, in
  `source.ignored`. The note is for the caller to show: a source never prints.
  """
  ignored, root = [], None
  for source in sources:
    for entry in getattr(source, "ignored", ()):
      if entry not in ignored:  # train and eval may be the same split
        ignored.append(entry)
    root = root or getattr(source, "root", None)
  if not ignored:
    return None
  from jaxnet.core.data.imagefolder import EXTENSIONS_TEXT
  shown = ", ".join(ignored[:_NOTE_NAMES]) + (f" and {len(ignored) - _NOTE_NAMES} more"
                                              if len(ignored) > _NOTE_NAMES else "")
  what = (("entry", "is", "a ", "image") if len(ignored) == 1 else ("entries", "are", "", "images"))
  return (f"note: ignored {len(ignored)} {what[0]} of {root} that {what[1]} hidden or not "
          f"{what[2]}{EXTENSIONS_TEXT} {what[3]}: {shown}")
