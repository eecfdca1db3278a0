"""Random-access source over an ImageNet-style folder of encoded images.

Layout: root/<split>/<class>/<file>.jpg|.jpeg|.png|.webp. Class ids come from
the sorted class directories of root/train, so train and val agree on labels
even when val misses a class; a val class that train lacks is an error (its
images would have no label). Records are raw file bytes; decoding happens in the
Grain transforms (jaxnet.core.data.transforms), in the worker processes.

Hidden entries (names starting with '.': .ipynb_checkpoints, .DS_Store, macOS's
._x.jpg) and anything that is not an image file (Thumbs.db, notes.txt, a folder
inside a class folder) never become classes or examples; `ignored` lists them so
the caller can say so. A class folder without images is an error: it would be a
class that no example has.
"""

from __future__ import annotations

import os

from jaxnet.core import provenance
from jaxnet.core.data import decode
from jaxnet.core.errors import InvalidValueError, MissingFileError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
_CLASSES_SPLIT = "train"
EXTENSIONS_TEXT = "/".join(IMAGE_EXTENSIONS)  # ".jpg/.jpeg/.png/.webp", for messages


class ImageFolderError(InvalidValueError):
  """An image folder whose layout would train on wrong or missing labels."""


def is_hidden(name: str) -> bool:
  return name.startswith(".")


def is_image_name(name: str) -> bool:
  """A file name ImageFolder reads as an image: not hidden, with an image extension."""
  return not is_hidden(name) and name.lower().endswith(IMAGE_EXTENSIONS)


_LAYOUT_HELP = (
    "Expected an ImageNet-style layout <root>/train/<class>/*.jpg and "
    "<root>/val/<class>/*.jpg, one subdirectory per class (for real ImageNet: "
    "the 1000 synset folders n01440764, ... under both train/ and val/; the "
    "flat ILSVRC2012 val images must first be moved into synset folders). "
    "To make a small synthetic one: "
    "python -m jaxnet.cli.make_imagefolder <root> --classes 10 --per-class 50"
)


def _missing_dir_message(path: str) -> str:
  return f"Image folder not found: {path!r}. {_LAYOUT_HELP}"


def _require_dir(path: str) -> None:
  if not os.path.isdir(path):
    raise MissingFileError(_missing_dir_message(path))


# config.data.eval_split defaults to tfds's name, "validation"; image folders (ImageNet's,
# make_imagefolder's) name it val/. Either folder serves either name.
_SPLIT_ALIASES = {"validation": "val", "val": "validation"}


def find_split_dir(root: str, split: str) -> str:
  """root/split, or root/<its alias> where only that exists. A split with neither is one
  line naming the config key that picks the folder."""
  path = os.path.join(root, split)
  alias = _SPLIT_ALIASES.get(split)
  if not os.path.isdir(path) and alias and os.path.isdir(os.path.join(root, alias)):
    return os.path.join(root, alias)
  if not os.path.isdir(path) and os.path.isdir(root):
    folders = sorted(e.name for e in os.scandir(root) if e.is_dir() and not is_hidden(e.name))
    key = "train_split" if split == "train" else "eval_split"
    others = [f for f in folders if f != _CLASSES_SPLIT] if key == "eval_split" else folders
    example = f", e.g. --config.data.{key}={others[0]}" if others else ""
    raise MissingFileError(
        f"Image folder not found: {path!r}: {root} has no split folder {split!r}"
        f"{' or ' + repr(alias) if alias else ''} (its folders: {', '.join(folders) or 'none'}). "
        f"Name the folder to use with --config.data.{key}=FOLDER{example}. {_LAYOUT_HELP}")
  return path


def _class_dirs(split_dir: str, ignored: list | None = None, where: str = "") -> list[str]:
  """The sorted class folders of a split; other entries go to `ignored` (as where/name)."""
  names = []
  for entry in os.scandir(split_dir):
    if entry.is_dir() and not is_hidden(entry.name):
      names.append(entry.name)
    elif ignored is not None:
      ignored.append(_shown(where, entry))
  return sorted(names)


def _image_files(class_dir: str, ignored: list, where: str) -> list[str]:
  """The sorted image file names of a class folder; other entries go to `ignored`."""
  names = []
  for entry in os.scandir(class_dir):
    # By name only: no stat per file (ImageNet's train folders hold 1.28M files,
    # often on network storage).
    if is_image_name(entry.name):
      names.append(entry.name)
    else:
      ignored.append(_shown(where, entry))
  return sorted(names)


def _shown(where: str, entry: os.DirEntry) -> str:
  return os.path.join(where, entry.name) + ("/" if entry.is_dir() else "")


class ImageFolderSource:
  """Grain random-access source: `source[i] -> {"image": bytes, "label": int}`."""

  encoded = True  # images are encoded bytes; the pipeline must decode them

  def __init__(self, root: str, split: str):
    self.root = root
    self.split = split
    _require_dir(root)
    classes_dir = os.path.join(root, _CLASSES_SPLIT)
    _require_dir(classes_dir)
    split_dir = find_split_dir(root, split)
    self.class_names: list[str] = _class_dirs(classes_dir)
    self.num_classes = len(self.class_names)
    # Entries of this split that are neither a class nor an image, relative to root
    # (folders end in '/'): the caller reports them (see sources.ignored_note).
    self.ignored: list[str] = []
    split_classes = set(_class_dirs(split_dir, self.ignored, os.path.relpath(split_dir, root)))
    unknown = sorted(split_classes - set(self.class_names))
    if unknown:
      raise ImageFolderError(
          f"{split_dir} has class folder(s) that {classes_dir} lacks: {', '.join(unknown)}. "
          f"Classes come from the train folders, so their images would have no label: add them "
          f"to {classes_dir} or move them out of {split_dir}")
    self._paths: list[str] = []
    self._labels: list[int] = []
    for label, name in enumerate(self.class_names):
      if name not in split_classes:
        continue  # a split may lack some classes (small val sets)
      class_dir = os.path.join(split_dir, name)
      files = _image_files(class_dir, self.ignored, os.path.relpath(class_dir, root))
      if not files:
        raise ImageFolderError(
            f"class folder {class_dir} holds no {EXTENSIONS_TEXT} images: it would be a class "
            f"that no example has. Put its images in, or remove the folder")
      self._paths.extend(os.path.join(class_dir, f) for f in files)
      self._labels.extend([label] * len(files))
    self.ignored.sort()
    if not self._paths:
      raise MissingFileError(
          f"No {EXTENSIONS_TEXT} files in the class folders of {split_dir!r} "
          f"(classes taken from {classes_dir!r}). {_LAYOUT_HELP}")

  def __len__(self) -> int:
    return len(self._paths)

  def files_and_labels(self) -> tuple[list[str], list[int]]:
    """Every example's file and label, in the source's order (for loaders that read files
    themselves: jaxnet/core/data/dali.py)."""
    return list(self._paths), list(self._labels)

  IDENTITY_KINDS = provenance.IDENTITY_KINDS

  def identity(self, kind: str = "listing") -> dict:
    """The class list, the file count and the sha256 of the sorted "relative path<TAB>size"
    lines of this split's images: one stat per file, no image read (the cost for ImageNet's
    1.28M files: docs/reproducibility.md). Paths are relative to the root, so a moved copy
    of the same folder is the same data. `kind` "sampled" or "content" adds a digest of
    blocks of each file, or of all its bytes (provenance.files_sha256)."""
    prefix = len(os.path.join(self.root, ""))  # every path is os.path.join(root, split, class, file)
    # Sliced, not os.path.relpath: that alone took 15 s of 28 for 1.28M files.
    names = [path[prefix:] for path in self._paths]
    lines = sorted(f"{name}\t{os.stat(path).st_size}" for name, path in zip(names, self._paths))
    identity = {"source": "imagefolder", "split": self.split, "classes": list(self.class_names),
                "files": len(self._paths), "listing_sha256": provenance.sha256_lines(lines)}
    if kind != "listing":
      identity[f"{kind}_sha256"] = provenance.files_sha256(self._paths, names, kind)
    return identity

  def __getitem__(self, index: int) -> dict:
    # A file gone since the listing is masked and counted as unreadable, named "not found".
    return {**decode.read_file(self._paths[index]), "label": self._labels[index], "path": self._paths[index]}

  def path(self, index: int) -> str:
    """File behind record `index` (for tracking down corrupt images)."""
    return self._paths[index]

  def __repr__(self) -> str:
    return (f"ImageFolderSource(root={self.root!r}, split={self.split!r}, "
            f"len={len(self)}, num_classes={self.num_classes})")
