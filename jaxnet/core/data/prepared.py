"""Prepared shards: a data set's images re-encoded small, in ArrayRecord files, and the
source that reads them back (`data.source=prepared`).

Why: a train image is decoded and then mostly thrown away by the random crop. Stored with
its shorter side bounded (256 px by default) a JPEG has ~2-3x fewer pixels than ImageNet's
typical 500x375, and the decode, most of the input pipeline's cost, shrinks with it; stored
as raw pixels (--raw-fraction, 3/4 of the images by default) it needs no decode at all, and
the crop and resize are what is left (measured: experiments/bench_input.py,
experiments/RESULTS.md). FFCV's ResNet-50 results bound the longer side instead, at 500 px,
with half the images JPEG (quality 90) and half raw pixels (libffcv/ffcv-imagenet README,
"Dataset setup"); a larger side helps accuracy and costs throughput, which no run here can
measure.

Layout of OUT (made by `jaxnet prepare`, jaxnet/cli/prepare.py):

  OUT/prepared.json                       the finished splits: classes, options, identities
  OUT/SPLIT/plan.json                     which source records go to which shard, and from what
  OUT/SPLIT/SPLIT-00003-of-00128.array_record
  OUT/SPLIT/SPLIT-00003-of-00128.json     written last: that shard is finished (count, digest,
                                          the images that could not be read)

A record is the label (int32, little-endian) followed by the image: a JPEG, or, for the
fraction --raw-fraction of the images, its pixels uncompressed as a binary PPM (P6: a short
text header, then height x width x 3 bytes), which the loaders take as they are (Grain) or
decode with a memcpy (DALI reads PNM). Shards are written uncompressed (ArrayRecord's default
zstd would cost each raw record's read more than its JPEG decode saves). A shard is
written to a temporary name and renamed, then its .json; a finished shard (its .json
exists) is never rewritten, a half-written one is written again, so a killed prepare
resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import struct
import time

import numpy as np

from jaxnet.core import metrics, provenance
from jaxnet.core.data import decode
from jaxnet.core.errors import InvalidValueError, MissingFileError, UserError, os_error_cause

FORMAT = "jaxnet-prepared-1"
MANIFEST = "prepared.json"
_LABEL = struct.Struct("<i")


class PrepareError(UserError):
  """prepare cannot go on (a full disk, too many unreadable images, another data set in OUT)."""


@dataclasses.dataclass(frozen=True)
class Options:
  short_side: int = 256      # shorter side bound in pixels; 0 keeps every image's size
  quality: int = 90          # JPEG quality of re-encoded images
  shard_images: int = 1000   # records per shard
  # This fraction of the images stored as raw pixels (PPM), which need no decode: 0.75 gives
  # the train transform >= 3x (224 px) and >= 5x (160 px) the images per core of full-size JPEGs
  # for ~200 KiB an image at 256 px, ~7x an all-JPEG shard's bytes (experiments/RESULTS.md).
  raw_fraction: float = 0.75

  def check(self) -> None:
    if self.short_side < 0 or 0 < self.short_side < 32:
      raise InvalidValueError(f"--short-side must be 0 (keep sizes) or >= 32, got {self.short_side}")
    if not 1 <= self.quality <= 100:
      raise InvalidValueError(f"--quality must be in 1..100, got {self.quality}")
    if self.shard_images < 1:
      raise InvalidValueError(f"--shard-images must be >= 1, got {self.shard_images}")
    if not 0 <= self.raw_fraction <= 1:
      raise InvalidValueError(f"--raw-fraction must be in [0, 1], got {self.raw_fraction}")


# --- one image --------------------------------------------------------------------------

def bounded_jpeg(data: bytes, short_side: int, quality: int) -> bytes:
  """`data` as a JPEG whose shorter side is at most `short_side` (0: any size).

  A baseline JPEG already within the bound is kept byte for byte (no second generation of
  loss); anything else (larger, PNG, CMYK) is decoded, shrunk with area averaging and
  encoded at `quality`, 4:2:0. CorruptImageError when it cannot be decoded.
  """
  size = decode.jpeg_size(data)
  if size is not None and (not short_side or min(size) <= short_side) and _plain_jpeg(data):
    decode.decode_full(data)  # a truncated or broken file is counted here, not at train time
    return data
  import simplejpeg
  return simplejpeg.encode_jpeg(np.ascontiguousarray(bounded_pixels(data, short_side)), quality=quality,
                                colorspace="RGB", colorsubsampling="420")


def bounded_ppm(data: bytes, short_side: int) -> bytes:
  """`data`'s pixels as a binary PPM (a raw record) whose shorter side is at most `short_side`."""
  return decode.ppm_bytes(bounded_pixels(data, short_side))


def bounded_pixels(data: bytes, short_side: int) -> np.ndarray:
  """`data` decoded, its shorter side shrunk to `short_side` (0: kept) with area averaging.
  CorruptImageError when it cannot be decoded."""
  size = decode.jpeg_size(data)
  if size is not None and short_side:
    # Decode at 1/2, 1/4 or 1/8 in the DCT when that still leaves >= the bound.
    scale = short_side / min(size)
    pixels = decode.decode_jpeg(data, math.ceil(size[0] * scale), math.ceil(size[1] * scale))
  else:
    pixels = decode.decode_full(data)
  height, width = pixels.shape[:2]
  if short_side and min(height, width) > short_side:
    scale = short_side / min(height, width)
    pixels = _area_resize(pixels, (max(1, round(width * scale)), max(1, round(height * scale))))
  return pixels


def stored_raw(index: int, raw_fraction: float) -> bool:
  """Whether source record `index` is stored as raw pixels: a fixed, evenly spread choice
  (Fibonacci hashing of the index), so a resumed prepare chooses as the first did."""
  return (index * 2654435761 % 2**32) < raw_fraction * 2**32


def _plain_jpeg(data: bytes) -> bool:
  """A JPEG that libjpeg-turbo decodes straight to RGB (YCbCr or grayscale, not CMYK)."""
  import simplejpeg
  try:
    return simplejpeg.decode_jpeg_header(data)[2] in ("YCbCr", "Gray")
  except ValueError:
    return False


def _area_resize(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
  try:
    import cv2
    return cv2.resize(pixels, size, interpolation=cv2.INTER_AREA)
  except ImportError:
    from PIL import Image
    return np.asarray(Image.fromarray(pixels).resize(size, Image.Resampling.BOX))


def encode_record(label: int, image: bytes) -> bytes:
  return _LABEL.pack(int(label)) + image


def decode_record(record: bytes) -> dict:
  """The record's label and image: a JPEG as bytes; raw pixels (a PPM) as a view of the record,
  not a copy (~200 KB, which the train transform only crops from)."""
  image = record[_LABEL.size:] if record[_LABEL.size:_LABEL.size + 2] != b"P6" else memoryview(record)[_LABEL.size:]
  return {"image": image, "label": _LABEL.unpack_from(record)[0]}


# --- a split ----------------------------------------------------------------------------

def shard_name(split: str, index: int, count: int) -> str:
  return f"{split}-{index:05d}-of-{count:05d}.array_record"


def plan_split(examples: int, shard_images: int) -> list[tuple[int, int]]:
  """Contiguous [start, end) ranges of the source's records, one per shard."""
  count = max(1, math.ceil(examples / shard_images))
  return [(i * examples // count, (i + 1) * examples // count) for i in range(count)]


def _record_name(source, index: int) -> str:
  path = getattr(source, "path", None)
  if path is not None:
    return os.path.relpath(path(index), getattr(source, "root", "") or ".")
  return f"record {index}"


def write_shard(source, start: int, end: int, path: str, options: Options) -> dict:
  """Records [start, end) of `source`, bounded and re-encoded, into the ArrayRecord file
  `path` (via a temporary name); returns the shard's done-record, which the caller writes.
  Images that cannot be read are left out and listed."""
  from array_record.python.array_record_module import ArrayRecordWriter
  temp = path + ".tmp"
  unreadable, count = [], 0
  writer = ArrayRecordWriter(temp, "group_size:1,uncompressed")
  try:
    for index in range(start, end):
      element = source[index]
      try:
        if element.get("read_error"):
          raise decode.CorruptImageError(element["read_error"])
        if stored_raw(index, options.raw_fraction):
          image = bounded_ppm(element["image"], options.short_side)
        else:
          image = bounded_jpeg(element["image"], options.short_side, options.quality)
      except decode.CorruptImageError as err:
        unreadable.append({"image": _record_name(source, index), "why": str(err)[:200]})
        continue
      writer.write(encode_record(element["label"], image))
      count += 1
  finally:
    writer.close()
  os.replace(temp, path)
  return {"records": count, "source_range": [start, end], "bytes": os.path.getsize(path),
          "sha256": provenance.file_sha256(path), "unreadable": unreadable}


_KEPT = {}


def _keep_source(source) -> None:
  _KEPT["source"] = source


def _write_kept_shard(start: int, end: int, path: str, options: Options) -> dict:
  return write_shard(_KEPT["source"], start, end, path, options)


def _write_json(path: str, content: dict) -> None:
  """`path` whole or untouched (a failed write raises its OSError and leaves no temporary file)."""
  def write(temp):
    with open(temp, "w") as f:
      json.dump(content, f, indent=1)
      f.write("\n")
  metrics.replace_atomically(path, write)


def _read_json(path: str):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _start_split(split_dir: str, split: str, plan_content: dict) -> None:
  """Writes the split's plan, or checks that the one already there is this data set's."""
  os.makedirs(split_dir, exist_ok=True)
  plan_path = os.path.join(split_dir, "plan.json")
  previous = _read_json(plan_path)
  if previous is None:
    _write_json(plan_path, plan_content)
  elif previous != plan_content:
    differ = sorted(k for k in set(previous) | set(plan_content) if previous.get(k) != plan_content.get(k))
    raise PrepareError(f"{split_dir} holds shards prepared from other data or options (differing: "
                       f"{', '.join(differ)}): give another --out, or delete {split_dir} to start over")


def prepare_split(source, out: str, split: str, options: Options, *, workers: int = 0,
                  max_unreadable: float = 0.001, report=None) -> dict:
  """Writes (or finishes) OUT/SPLIT's shards from `source`; returns the split's manifest entry.

  `workers` processes encode shards side by side (0: this process). `report` gets progress
  lines with the rate and ETA. PrepareError when more than `max_unreadable` (a fraction) of
  the images cannot be read, or when the disk fills (finished shards stay; rerun to resume).
  """
  options.check()
  report = report or logging.getLogger("jaxnet.report").info
  split_dir = os.path.join(out, split)
  ranges = plan_split(len(source), options.shard_images)
  identity = source.identity()
  _start_split(split_dir, split, {"format": FORMAT, "split": split, "source_identity": identity,
                                  "options": dataclasses.asdict(options), "examples": len(source),
                                  "shards": len(ranges)})
  names = [shard_name(split, i, len(ranges)) for i in range(len(ranges))]
  done = {i: _read_json(os.path.join(split_dir, n[:-len(".array_record")] + ".json"))
          for i, n in enumerate(names)}
  done = {i: d for i, d in done.items() if d is not None}
  todo = [i for i in range(len(ranges)) if i not in done]
  progress = _Progress(split, len(source), sum(ranges[i][1] - ranges[i][0] for i in done), report)
  limit = max_unreadable * len(source)

  def finished(index: int, record: dict) -> None:
    base = os.path.join(split_dir, names[index][:-len(".array_record")])
    _write_json(base + ".json", record)
    done[index] = record
    bad = sum(len(d["unreadable"]) for d in done.values())
    if bad > limit:
      shown = "; ".join(f"{u['image']}: {u['why']}" for d in done.values() for u in d["unreadable"][:3])
      raise PrepareError(f"{bad} images of {split} cannot be read, more than --max-unreadable="
                         f"{max_unreadable:g} of {len(source)} (e.g. {shown}); is --dir the right "
                         f"data? The {len(done)} finished shards stay: rerun to resume")
    progress.add(ranges[index][1] - ranges[index][0])

  try:
    if workers and len(todo) > 1:
      from concurrent import futures
      import multiprocessing
      # spawn: the parent may hold threads (tfds, array_record) that fork would copy mid-lock.
      # The source goes to each worker once (ImageNet's file list is ~100 MB), not with each shard.
      with futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                       initializer=_keep_source, initargs=(source,)) as pool:
        jobs = {pool.submit(_write_kept_shard, *ranges[i], os.path.join(split_dir, names[i]), options): i
                for i in todo}
        try:
          for job in futures.as_completed(jobs):
            finished(jobs[job], job.result())
        except BaseException:  # too many unreadable, a full disk, Ctrl-C: start no more shards
          pool.shutdown(wait=True, cancel_futures=True)
          raise
    else:
      for i in todo:
        finished(i, write_shard(source, *ranges[i], os.path.join(split_dir, names[i]), options))
  except OSError as err:
    cause = os_error_cause(err) or str(err)
    if cause == "no space left on device":
      raise PrepareError(f"the disk of {out} is full ({_free_gib(out):.1f} GiB free) after {len(done)} of "
                         f"{len(ranges)} {split} shards: free space (or give another --out) and rerun "
                         f"the same command to resume") from err
    raise PrepareError(f"cannot write the {split} shards in {split_dir}: {cause}") from err
  shards = [dict(done[i], file=names[i]) for i in range(len(ranges))]
  digest = provenance.sha256_lines(f"{s['file']}\t{s['sha256']}" for s in shards)
  unreadable = [u for s in shards for u in s["unreadable"]]
  return {"examples": sum(s["records"] for s in shards), "source_examples": len(source),
          "files": [s["file"] for s in shards], "lengths": [s["records"] for s in shards],
          "bytes": sum(s["bytes"] for s in shards), "shards_sha256": digest,
          "unreadable": unreadable, "prepared_from": identity}


def _free_gib(path: str) -> float:
  try:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize / 2**30
  except OSError:
    return 0.0


class _Progress:
  """Progress lines: images done of the total, the rate of this run, the ETA (at most one
  line every few seconds, and the last)."""

  def __init__(self, split: str, total: int, already: int, report, every_s: float = 5.0):
    self.split, self.total, self.done, self.report, self.every_s = split, total, already, report, every_s
    self.start_done, self.start, self.last = already, time.monotonic(), 0.0
    if already:
      report(f"{split}: resuming, {already:,} of {total:,} images already in finished shards")

  def add(self, images: int) -> None:
    self.done += images
    now = time.monotonic()
    if now - self.last < self.every_s and self.done < self.total:
      return
    self.last = now
    rate = (self.done - self.start_done) / max(now - self.start, 1e-9)
    eta = (self.total - self.done) / max(rate, 1e-9)
    width = 30
    bar = "#" * int(width * self.done / max(self.total, 1))
    self.report(f"{self.split}: [{bar:<{width}}] {self.done:,}/{self.total:,} images  "
                f"{rate:,.0f} img/s  ETA {_clock(eta)}")


def _clock(seconds: float) -> str:
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"


def write_manifest(out: str, splits: dict, class_names, options: Options) -> None:
  """OUT/prepared.json, merged with the splits an earlier prepare finished there."""
  path = os.path.join(out, MANIFEST)
  manifest = _read_json(path) or {"format": FORMAT, "splits": {}}
  if manifest.get("class_names") not in (None, list(class_names)):
    raise PrepareError(f"{path} lists other classes: give another --out")
  manifest.update(format=FORMAT, class_names=list(class_names), num_classes=len(class_names))
  for split, entry in splits.items():
    manifest["splits"][split] = {**entry, "options": dataclasses.asdict(options)}
  _write_json(path, manifest)


# --- reading them back --------------------------------------------------------------------

_SPLIT_ALIASES = {"validation": "val", "val": "validation"}


class PreparedSource:
  """Grain random-access source over OUT's shards: `source[i] -> {"image": bytes, "label": int}`."""

  encoded = True  # JPEG (or raw PPM) bytes: the pipeline decodes them

  def __init__(self, root: str, split: str):
    manifest = _read_json(os.path.join(root, MANIFEST))
    if manifest is None or manifest.get("format") != FORMAT:
      raise MissingFileError(f"{root} holds no prepared shards ({MANIFEST} missing or not "
                             f"{FORMAT}): make them with `jaxnet prepare --dir SOURCE --out {root}`")
    splits = manifest["splits"]
    name = split if split in splits else _SPLIT_ALIASES.get(split)
    if name not in splits:
      raise MissingFileError(f"{root} has no finished prepared split {split!r} (it has: "
                             f"{', '.join(sorted(splits)) or 'none'}); prepare it with jaxnet prepare "
                             f"--splits, or set data.train_split/data.eval_split")
    self.root, self.split, self._entry = root, name, splits[name]
    self.class_names = manifest["class_names"]
    self.num_classes = manifest["num_classes"]
    import grain.python as grain
    paths = [os.path.join(root, name, f) for f in self._entry["files"]]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
      raise MissingFileError(f"{len(missing)} shard(s) of {root}/{name} are gone (e.g. {missing[0]}): "
                             f"rerun jaxnet prepare with the same --out")
    self.paths = paths
    self._data = grain.ArrayRecordDataSource(paths)
    if len(self._data) != self._entry["examples"]:
      raise InvalidValueError(f"{root}/{name} holds {len(self._data)} records where {MANIFEST} says "
                              f"{self._entry['examples']}: prepare it again into a new --out")

  def __len__(self) -> int:
    return len(self._data)

  def __getitem__(self, index: int) -> dict:
    return decode_record(self._data[index])

  def identity(self) -> dict:
    """The shards' digest (computed when they were written) and the source's identity."""
    e = self._entry
    return {"source": "prepared", "split": self.split, "examples": e["examples"],
            "shards_sha256": e["shards_sha256"], "options": e["options"],
            "unreadable_left_out": len(e["unreadable"]), "prepared_from": e["prepared_from"]}

  def __repr__(self) -> str:
    return f"PreparedSource(root={self.root!r}, split={self.split!r}, len={len(self)})"
