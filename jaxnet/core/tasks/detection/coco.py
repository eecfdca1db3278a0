"""Detection data in the COCO format: an `instances_*.json` beside a folder of images (the
layout every detection dataset ships in or converts to), read by Grain workers, and the COCO
evaluation of a model's detections (pycocotools).

  DIR/annotations/instances_{train,val}.json   COCO's "images", "annotations", "categories"
  DIR/{train,val}/FILE                          each image's "file_name"

Host-side transforms move the boxes with the pixels: the image is resized so that its longer
side is image_size (aspect kept; with scale jitter, by a random factor, then cropped or padded)
and padded to image_size x image_size at the bottom and right, flipped horizontally half the
time in training. Each example's boxes are padded to `max_boxes` with a mask. What the data
holds that a detector cannot train on is counted and said once, never trained on silently:
boxes reaching outside their image are clipped, boxes of no area dropped, crowd boxes left out
of the targets (COCO's evaluation ignores them), annotations of an unknown category refused,
images without boxes kept as background, unreadable images masked and counted as for
classification.
"""

import collections
import dataclasses
import io
import json
import os
from typing import Any

import grain.python as grain
import numpy as np
from PIL import Image

from jaxnet.core.data import decode, transforms
from jaxnet.core.errors import InvalidValueError, MissingFileError

@dataclasses.dataclass
class Counts:
  """What the source left out or changed, for the one line a run prints."""
  clipped: int = 0        # boxes reaching outside their image, clipped to it
  empty: int = 0          # boxes of no area after clipping, dropped
  crowd: int = 0          # crowd boxes, left out of the targets
  background: int = 0     # images without a box, kept as background
  missing: int = 0        # image files not found: masked and counted when read
  resized: int = 0        # images whose annotated width/height is not the file's

  def note(self, where: str) -> str | None:
    parts = [f"{n} {what}" for n, what in (
        (self.missing, "image files not found (they are skipped, masked and counted)"),
        (self.resized, "images whose annotated width/height differ from the file's (their boxes are "
                       "clipped to the file's size)"),
        (self.clipped, "boxes clipped to their image"),
        (self.empty, "boxes of no area dropped"),
        (self.crowd, "crowd boxes left out of the targets"),
        (self.background, "images without a box kept as background"))
             if n]
    return f"note: {where}: {', '.join(parts)}" if parts else None


class _BoxRecords:
  """What a detection source's records become: encoded images with their boxes, made examples
  by `transform`, `max_boxes` per example, `scale_jitter` in training."""

  encoded = True

  def __init__(self, max_boxes: int, scale_jitter):
    self.max_boxes, self.scale_jitter = max_boxes, tuple(scale_jitter)

  def transform(self, image_size: int, train: bool) -> "DetectionTransform":
    return DetectionTransform(image_size, self.max_boxes, train, self.scale_jitter if train else (1.0, 1.0))


class CocoSource(_BoxRecords):
  """Random-access records {"image": bytes, "boxes": (n, 4) x0 y0 x1 y1 in the image's pixels,
  "classes": (n,) contiguous 0..classes-1, "image_id", "path"} of a COCO-format split."""

  def __init__(self, root: str, split: str, max_boxes: int = 100, scale_jitter=(1.0, 1.0)):
    super().__init__(max_boxes, scale_jitter)
    self.root, self.split = root, split
    annotations = os.path.join(root, "annotations", f"instances_{split}.json")
    if not os.path.exists(annotations):
      raise MissingFileError(f"{annotations} not found: a COCO-format data.dir holds annotations/"
                             f"instances_{split}.json and the images in {split}/")
    coco = _read_annotations(annotations)
    categories = sorted(coco["categories"], key=lambda c: c["id"])
    self.category_ids = [c["id"] for c in categories]
    self.class_names = [c["name"] for c in categories]
    self.num_classes = len(categories)
    label_of = {c: i for i, c in enumerate(self.category_ids)}
    unknown = sorted({a["category_id"] for a in coco["annotations"]} - set(label_of))
    if unknown:
      raise InvalidValueError(f"{annotations}: annotations of category ids {unknown[:5]} that its "
                              f"\"categories\" do not list; add them there or remove those annotations")
    self.counts = Counts()
    by_image = collections.defaultdict(list)
    for a in coco["annotations"]:
      by_image[a["image_id"]].append(a)
    images = sorted(coco["images"], key=lambda i: i["id"])
    paths = [os.path.join(root, split, image["file_name"]) for image in images]
    # The files' own sizes (headers only): boxes are clipped to the image they lie on, and
    # annotations that give another size, or images that are not there, are counted and said.
    sizes = _file_sizes(paths)
    missing = [path for path, size in zip(paths, sizes) if size is None]
    if images and len(missing) == len(images):
      raise MissingFileError(f"none of the {len(images)} images that {annotations} lists is in "
                             f"{os.path.join(root, split)} (e.g. {missing[0]} not found): put the images "
                             f"there, or point data.dir at the folder that holds them")
    self.counts.missing = len(missing)
    self._images = []
    for image, path, size in zip(images, paths, sizes):
      width, height = image["width"], image["height"]
      if size and size != (width, height):
        self.counts.resized += 1
        width, height = size
      boxes, classes = [], []
      for a in by_image[image["id"]]:
        if a.get("iscrowd", 0):
          self.counts.crowd += 1
          continue
        x, y, w, h = a["bbox"]
        box = np.array([x, y, x + w, y + h], np.float32)
        clipped = np.clip(box, 0, [width, height, width, height])
        if not np.array_equal(clipped, box):
          self.counts.clipped += 1
        if clipped[2] <= clipped[0] or clipped[3] <= clipped[1]:
          self.counts.empty += 1
          continue
        boxes.append(clipped)
        classes.append(label_of[a["category_id"]])
      if not boxes:
        self.counts.background += 1
      self._images.append({"path": path, "image_id": image["id"],
                           "boxes": np.asarray(boxes, np.float32).reshape(-1, 4),
                           "classes": np.asarray(classes, np.int32)})
    if not self._images:
      raise MissingFileError(f"{annotations} lists no images")
    self.annotations = annotations
    self.note = self.counts.note(annotations)

  def ground_truth(self) -> dict:
    """The annotation file as it is (COCO's evaluation reads the boxes unclipped)."""
    with open(self.annotations) as f:
      return json.load(f)

  def __len__(self):
    return len(self._images)

  def identity(self) -> dict:
    """The annotation file's digest and the image count (the boxes are in the file; the
    images are taken as named by it)."""
    from jaxnet.core import provenance
    return {"source": "coco", "split": self.split, "annotations_sha256": provenance.file_sha256(self.annotations),
            "images": len(self), "missing_images": self.counts.missing}

  def __repr__(self):  # Grain checks a restored iterator against it: no memory addresses
    return f"CocoSource({self.annotations!r}, n={len(self)})"

  def __getitem__(self, index: int) -> dict:
    return {**self._images[index], **decode.read_file(self._images[index]["path"])}


def _read_annotations(path: str) -> dict:
  """A COCO annotation file, its parts checked: one line naming the file and what is wrong
  rather than a KeyError deep in the source."""
  fix = "a COCO annotation file is a JSON object with \"images\", \"annotations\" and \"categories\" lists"
  try:
    with open(path, "rb") as f:
      coco = json.load(f)
  except ValueError as e:  # not JSON, not UTF-8
    raise InvalidValueError(f"{path} is not valid JSON ({e}): {fix}") from None
  if not isinstance(coco, dict):
    raise InvalidValueError(f"{path} holds a JSON {type(coco).__name__}, not an object: {fix}")
  for key in ("images", "annotations", "categories"):
    if not isinstance(coco.get(key), list):
      raise InvalidValueError(f"{path} has no \"{key}\" list: {fix}")
  needs = {"categories": ("id", "name"), "images": ("id", "file_name", "width", "height"),
           "annotations": ("image_id", "category_id", "bbox")}
  for key, fields in needs.items():
    for index, entry in enumerate(coco[key]):
      lacking = [f for f in fields if not isinstance(entry, dict) or f not in entry]
      if lacking:
        raise InvalidValueError(f"{path}: {key}[{index}] has no {', '.join(map(repr, lacking))}: each of "
                                f"the \"{key}\" holds {', '.join(map(repr, fields))}")
  for index, a in enumerate(coco["annotations"]):
    box = a["bbox"]
    if (not isinstance(box, list) or len(box) != 4
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box)):
      raise InvalidValueError(f"{path}: annotations[{index}] (id {a.get('id')}) has bbox {box!r}: a COCO "
                              f"bbox is 4 numbers, [x, y, width, height] in the image's pixels")
  return coco


def _file_sizes(paths: list[str]) -> list:
  """Each image file's (width, height) from its header, None where it is not found, () where
  it is there but unreadable (it keeps its annotated size; its decode masks and counts it).
  Read by 16 threads: COCO's train split is 118k headers."""
  from concurrent.futures import ThreadPoolExecutor

  def size(path):
    try:
      with Image.open(path) as image:
        return image.size
    except FileNotFoundError:
      return None
    except Exception:  # not an image, a permission error: the decode counts it when it is read
      return ()

  with ThreadPoolExecutor(16) as pool:
    return list(pool.map(size, paths))


class TfdsDetections(_BoxRecords):
  """CocoSource's records and evaluation from a TFDS detection dataset prepared as ArrayRecord
  (`coco/2017` and the datasets laid out like it: "image", "image/id", and "objects" with
  "bbox" (ymin, xmin, ymax, xmax) as fractions of the image, "label", "is_crowd"). Boxes are
  turned into pixels as they are read, from the size in each JPEG's header; crowd boxes are
  left out of the targets and boxes of no area dropped then. Unlike CocoSource it counts
  nothing up front: that would read every image of the split."""

  def __init__(self, name: str, split: str, data_dir: str | None = None, max_boxes: int = 100,
               scale_jitter=(1.0, 1.0)):
    from jaxnet.core.data.tfds_source import open_prepared, prepared_identity
    super().__init__(max_boxes, scale_jitter)
    self.name, self.split = name, split
    self._data, info = open_prepared(name, split, data_dir)
    features = info.features
    self._identity = prepared_identity(info, split, len(self._data))  # grain's workers get no info
    if "objects" not in features or "bbox" not in features["objects"].feature:
      raise InvalidValueError(f"TFDS dataset {name!r} has no objects/bbox feature: a detector's tfds "
                              f"data is laid out as coco/2017 (image, objects/bbox, objects/label)")
    labels = features["objects"]["label"]
    self.num_classes, self.class_names = labels.num_classes, list(labels.names)
    self.category_ids = list(range(self.num_classes))
    self.note, self._truth = None, None

  def _record(self, index: int) -> tuple[dict, tuple[int, int]]:
    """(the record with its boxes in pixels, every box kept (crowd too), and a crowd flag;
    the image's (width, height))."""
    record = self._data[index]
    data = record["image"]
    try:
      width, height = Image.open(io.BytesIO(data)).size  # the header only
    except Exception:  # unreadable: decoded as such by the transform, masked and counted
      width = height = 0
    objects = record["objects"]
    boxes = np.asarray(objects["bbox"], np.float32).reshape(-1, 4)  # ymin, xmin, ymax, xmax
    pixels = boxes[:, [1, 0, 3, 2]] * np.array([width, height, width, height], np.float32)
    crowd = np.asarray(objects.get("is_crowd", np.zeros(len(boxes), bool)), bool).reshape(-1)
    image_id = int(record.get("image/id", index))
    return ({"image": data, "image_id": image_id, "path": f"{self.name}/{self.split}[{index}]",
             "boxes": pixels, "classes": np.asarray(objects["label"], np.int32).reshape(-1), "crowd": crowd},
            (width, height))

  def __getitem__(self, index: int) -> dict:
    record, _ = self._record(index)
    boxes, classes, crowd = record.pop("boxes"), record.pop("classes"), record.pop("crowd")
    kept = ~crowd & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    return {**record, "boxes": boxes[kept].reshape(-1, 4), "classes": classes[kept]}

  def ground_truth(self) -> dict:
    """The split as a COCO annotation dict (pycocotools' ground truth), read once."""
    if self._truth is None:
      self._truth = self._read_ground_truth()
    return self._truth

  def _read_ground_truth(self) -> dict:
    images, annotations = [], []
    for index in range(len(self)):
      record, (width, height) = self._record(index)
      images.append({"id": record["image_id"], "width": width, "height": height})
      for (x0, y0, x1, y1), label, crowd in zip(record["boxes"], record["classes"], record["crowd"]):
        w, h = float(x1 - x0), float(y1 - y0)
        annotations.append({"id": len(annotations) + 1, "image_id": record["image_id"],
                            "category_id": int(label), "bbox": [float(x0), float(y0), w, h],
                            "area": w * h, "iscrowd": int(crowd)})
    return {"images": images, "annotations": annotations,
            "categories": [{"id": i, "name": n} for i, n in enumerate(self.class_names)]}

  def __len__(self):
    return len(self._data)

  def identity(self) -> dict:
    return dict(self._identity)

  def __repr__(self):  # Grain checks a restored iterator against it: no memory addresses
    return f"TfdsDetections({self.name!r}, {self.split!r}, n={len(self)})"


class DetectionTransform(grain.RandomMapTransform):
  """Decode, resize (longer side to image_size, aspect kept, a random scale with
  `scale_jitter` = (low, high)), crop or pad to image_size square, flip (training); boxes
  moved with the pixels, clipped, those left without area dropped, padded to `max_boxes`."""

  def __init__(self, image_size: int, max_boxes: int, train: bool, scale_jitter=(1.0, 1.0),
               warn: bool = True):
    self.image_size, self.max_boxes, self.train = image_size, max_boxes, train
    self.scale_jitter = tuple(scale_jitter)
    self.warn = warn  # False: the caller names the unreadable images itself (predict)

  def map(self, element: dict[str, Any]):
    """Eval's transform draws nothing: the same output for any generator."""
    assert not self.train
    return self.random_map(element, np.random.default_rng(0))

  def random_map(self, element: dict[str, Any], rng: np.random.Generator):
    size = self.image_size
    pixels = transforms.decoded(element, self.warn)
    if pixels is None:
      return example(np.zeros((size, size, 3), np.uint8), np.zeros((0, 4), np.float32),
                     np.zeros((0,), np.int32), element["image_id"], 1.0, (0, 0), self.max_boxes, ok=False)
    height, width = pixels.shape[:2]
    scale = size / max(height, width)
    if self.train and self.scale_jitter != (1.0, 1.0):
      scale *= rng.uniform(*self.scale_jitter)
    new_h, new_w = max(1, round(height * scale)), max(1, round(width * scale))
    resized = np.asarray(Image.fromarray(pixels).resize((new_w, new_h), Image.Resampling.BILINEAR))
    top = int(rng.integers(0, new_h - size + 1)) if new_h > size else 0
    left = int(rng.integers(0, new_w - size + 1)) if new_w > size else 0
    crop = resized[top:top + size, left:left + size]
    image = np.zeros((size, size, 3), np.uint8)
    image[:crop.shape[0], :crop.shape[1]] = crop
    boxes = element["boxes"] * np.float32(scale) - np.array([left, top, left, top], np.float32)
    boxes = np.clip(boxes, 0, [crop.shape[1], crop.shape[0], crop.shape[1], crop.shape[0]])
    keep = (boxes[:, 2] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 1] >= 1)
    boxes, classes = boxes[keep], element["classes"][keep]
    if self.train and rng.random() < 0.5:
      image = np.ascontiguousarray(image[:, ::-1])
      boxes = np.stack([size - boxes[:, 2], boxes[:, 1], size - boxes[:, 0], boxes[:, 3]], axis=1)
    return example(image, boxes, classes, element["image_id"], scale, (height, width), self.max_boxes, ok=True)


def example(image, boxes, classes, image_id, scale, source_size, max_boxes: int, ok: bool) -> dict:
  """A detection example as the steps take it: the boxes padded to `max_boxes` with a mask
  (more than that: the first ones; raise detection.max_boxes to keep all)."""
  padded = np.zeros((max_boxes, 4), np.float32)
  labels = np.zeros((max_boxes,), np.int32)
  n = min(len(boxes), max_boxes)
  padded[:n], labels[:n] = boxes[:n], classes[:n]
  return {"image": image, "boxes": padded, "classes": labels, "box_mask": np.arange(max_boxes) < n,
          "image_id": np.int32(image_id), "scale": np.float32(scale),
          "source_size": np.array(source_size, np.int32), "mask": np.bool_(ok), "corrupt": np.int32(not ok)}


def to_source_pixels(boxes, scale, source_size) -> np.ndarray:
  """Boxes in an example's pixels (resized, padded: its `scale`) -> in its source image's
  (height, width) = `source_size`, clipped to that image (not to the padding)."""
  height, width = source_size
  return np.clip(np.asarray(boxes) / scale, 0, [width, height, width, height])


class SyntheticDetections:
  """Random images with 1 to `max_boxes` random boxes each, the same for the same index: a
  detector's throughput, and its GPU plan, without a dataset (config.data.source=synthetic
  with a retinanet_* model)."""
  encoded = False

  def __init__(self, size: int, image_size: int, num_classes: int, max_boxes: int, seed: int = 0):
    self.size, self.image_size, self.num_classes = size, image_size, num_classes
    self.max_boxes, self.seed, self.class_names = max_boxes, seed, None
    self.category_ids = list(range(1, num_classes + 1))

  def __len__(self):
    return self.size

  def identity(self) -> dict:
    """The generator and its parameters: they make every image and box."""
    return {"generator": "SyntheticDetections", "examples": self.size, "image_size": self.image_size,
            "num_classes": self.num_classes, "max_boxes": self.max_boxes, "seed": self.seed}

  def __repr__(self):
    return f"SyntheticDetections(size={self.size}, image_size={self.image_size}, seed={self.seed})"

  def __getitem__(self, index: int) -> dict:
    rng = np.random.default_rng((self.seed, int(index)))
    s = self.image_size
    corner = rng.uniform(0, 0.75 * s, (int(rng.integers(1, self.max_boxes + 1)), 2))
    boxes = np.concatenate([corner, corner + rng.uniform(0.1 * s, 0.25 * s, corner.shape)], 1)
    return {"image": rng.integers(0, 256, (s, s, 3), dtype=np.uint8), "boxes": boxes.astype(np.float32),
            "classes": rng.integers(0, self.num_classes, len(boxes)).astype(np.int32), "image_id": index + 1}

  def transform(self, image_size: int, train: bool):
    return _SyntheticExample(self.max_boxes)

  def ground_truth(self) -> dict:
    """The whole split in COCO's format, for `evaluate`."""
    annotations = []
    for i in range(len(self)):
      record = self[i]
      for box, label in zip(record["boxes"], record["classes"]):
        x0, y0, x1, y1 = (float(v) for v in box)
        annotations.append({"id": len(annotations) + 1, "image_id": record["image_id"], "iscrowd": 0,
                            "category_id": int(label) + 1, "bbox": [x0, y0, x1 - x0, y1 - y0],
                            "area": (x1 - x0) * (y1 - y0)})
    return {"images": [{"id": i + 1, "width": self.image_size, "height": self.image_size} for i in range(len(self))],
            "annotations": annotations, "categories": [{"id": c} for c in self.category_ids]}


class _SyntheticExample(grain.MapTransform):
  def __init__(self, max_boxes: int):
    self.max_boxes = max_boxes

  def map(self, element):
    size = element["image"].shape[0]
    return example(element["image"], element["boxes"], element["classes"], element["image_id"], 1.0,
                   (size, size), self.max_boxes, ok=True)


def evaluate(source, detections: list[dict]) -> dict:
  """COCO's box AP of `detections` ({"image_id", "boxes" in the source image's pixels,
  "scores", "classes"}) on the whole split of `source` (its `ground_truth()`): eval/mAP
  (AP@[.5:.95]), eval/AP50, eval/AP75, eval/AP_small/medium/large (pycocotools, its printout
  silenced)."""
  import contextlib
  from pycocotools.coco import COCO
  from pycocotools.cocoeval import COCOeval
  results = []
  for d in detections:
    for box, score, label in zip(d["boxes"], d["scores"], d["classes"]):
      if np.isfinite(score):
        x0, y0, x1, y1 = (float(v) for v in box)
        results.append({"image_id": int(d["image_id"]), "category_id": source.category_ids[int(label)],
                        "bbox": [x0, y0, x1 - x0, y1 - y0], "score": float(score)})
  names = ("eval/mAP", "eval/AP50", "eval/AP75", "eval/AP_small", "eval/AP_medium", "eval/AP_large")
  if not results:
    return {name: 0.0 for name in names}
  with contextlib.redirect_stdout(io.StringIO()):
    truth = COCO()
    truth.dataset = source.ground_truth()
    truth.createIndex()
    found = truth.loadRes(results)
    evaluation = COCOeval(truth, found, "bbox")
    evaluation.params.imgIds = sorted({int(d["image_id"]) for d in detections})
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
  # COCOeval reports -1 for a size class without ground truth: 0 here, as "nothing found".
  return {name: max(float(v), 0.0) for name, v in zip(names, evaluation.stats[:6])}
