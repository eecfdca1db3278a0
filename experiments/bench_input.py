"""Images/second of the TRAIN input pipeline alone (no model).

    python experiments/bench_input.py --quick            # < 60 s on 2 cores
    python experiments/bench_input.py --dir DIR --workers 0,1,2,4,8 --large

1. Single-process decoder comparison: decode + random-resized-crop + resize to
   224 + flip with PIL, OpenCV (if installed) and simplejpeg, same crops.
2. jaxnet.core.data.pipeline.train_loader (Grain DataLoader: shuffled IndexSampler,
   TrainDecodeCrop(224), Batch) for each worker count; 0 runs in-process.
4. Prepared shards (`jaxnet prepare`, --prepared: shorter sides and raw fractions) against the
   full-size JPEGs, per core: (a) where one image's CPU time goes (read, header and crop draw,
   decode, resize, flip); (b) jaxnet's train transform at 224, 192 and 160 px (the fast
   recipe's progressive sizes), then the Grain loader in-process at 224 and 160 (or with
   --loader-workers N worker processes, the CPU of all of them), every path in the same run,
   with each path's storage per image and for ImageNet's 1.28M.
   `--only-prepared` runs this table alone; `--json FILE` writes its rates, which
   `experiments/time_to_accuracy.py --plan --input-json FILE` reads.

Files are read into memory for (1) and from disk (page cache) for (2). Without
--dir a synthetic ImageNet-sized JPEG folder is generated in a temp dir. In (2)
the sampler shuffles an ImageNet-sized index space (--epoch-size, the folder's
files repeating): Grain's IndexSampler pays a per-epoch setup, ~0.3 ms per
record on a 200-image epoch but ~0.08 ms on ImageNet's 1.28M, so a small
folder taken as the epoch would overstate the pipeline's overhead.

Columns: images/s is wall clock; img/CPU-s is images per CPU-second of all
processes involved (= images/s one fully used core sustains). The latter is
what to compare on a shared or busy machine, where wall rates swing with
other jobs; the load average is printed with each table for that reason.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

# Run from a checkout without `pip install -e .`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grain.python as grain  # noqa: E402
from absl import flags as absl_flags  # noqa: E402
import numpy as np  # noqa: E402
import PIL  # noqa: E402
import simplejpeg  # noqa: E402
from PIL import Image  # noqa: E402

import benchlib  # noqa: E402  (experiments/benchlib.py, beside this script)
from jaxnet.core.adapters import grain as grain_adapter  # noqa: E402
from jaxnet.core.data import decode, pipeline, prepared, transforms  # noqa: E402
from jaxnet.core.data.imagefolder import ImageFolderSource  # noqa: E402
from jaxnet.tools.make_imagefolder import make_imagefolder  # noqa: E402
from jaxnet.core.data.transforms import TrainDecodeCrop, random_resized_crop_box  # noqa: E402

try:
  import cv2
  cv2.setNumThreads(1)  # single-core comparison, like the other decoders
except ImportError:
  cv2 = None

IMAGE_SIZE = 224
BILINEAR = Image.Resampling.BILINEAR


def versions_line() -> str:
  parts = [f"python {platform.python_version()}", f"numpy {np.__version__}",
           f"Pillow {PIL.__version__}", f"simplejpeg {simplejpeg.__version__}",
           f"grain {getattr(grain, '__version__', None) or benchlib.dist_version('grain')}"]
  parts.append(f"opencv {cv2.__version__}" if cv2 else "opencv not installed")
  parts.append("region decoder " + ("built" if decode._jpeg_region else
                                    "NOT built (full decodes)"))
  return "versions: " + ", ".join(parts)


# --- single-process decoders: same crop geometry, different libraries ------

def pil_full(data: bytes, rng: np.random.Generator) -> np.ndarray:
  image = Image.open(io.BytesIO(data)).convert("RGB")
  top, left, h, w = random_resized_crop_box(rng, image.height, image.width)
  out = image.resize((IMAGE_SIZE, IMAGE_SIZE), BILINEAR, box=(left, top, left + w, top + h))
  return _flip(np.asarray(out), rng)


def simplejpeg_full(data: bytes, rng: np.random.Generator) -> np.ndarray:
  pixels = simplejpeg.decode_jpeg(data, colorspace="RGB")
  top, left, h, w = random_resized_crop_box(rng, *pixels.shape[:2])
  out = Image.fromarray(pixels).resize((IMAGE_SIZE, IMAGE_SIZE), BILINEAR,
                                       box=(left, top, left + w, top + h))
  return _flip(np.asarray(out), rng)


def opencv_full(data: bytes, rng: np.random.Generator, reduced: bool = False) -> np.ndarray:
  buffer = np.frombuffer(data, np.uint8)
  if not reduced:
    pixels, factor = cv2.imdecode(buffer, cv2.IMREAD_COLOR), 1
    top, left, h, w = random_resized_crop_box(rng, *pixels.shape[:2])
  else:
    # OpenCV can only shrink the whole image by 2/4/8 while decoding, so
    # draw the crop from the header size (read with simplejpeg) and pick
    # the largest factor that keeps the crop >= IMAGE_SIZE.
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    top, left, h, w = random_resized_crop_box(rng, height, width)
    factor = max([f for f in (1, 2, 4, 8) if min(h, w) / f >= IMAGE_SIZE] or [1])
    flags = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2,
             4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}
    pixels = cv2.imdecode(buffer, flags[factor])
  y0, x0 = top // factor, left // factor
  crop = pixels[y0:y0 + max(1, h // factor), x0:x0 + max(1, w // factor)]
  out = cv2.resize(crop, (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_AREA)
  return _flip(cv2.cvtColor(out, cv2.COLOR_BGR2RGB), rng)


def _flip(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  return np.ascontiguousarray(image[:, ::-1]) if rng.random() < 0.5 else image


def jaxnet_train(data: bytes, rng: np.random.Generator, _op=TrainDecodeCrop(IMAGE_SIZE)):
  return _op.random_map({"image": data, "label": 0}, rng)["image"]


def jaxnet_train_full_decode(data: bytes, rng: np.random.Generator):
  """TrainDecodeCrop as it runs when the C region decoder is not built."""
  region, decode._jpeg_region = decode._jpeg_region, None
  try:
    return jaxnet_train(data, rng)
  finally:
    decode._jpeg_region = region


class RepeatedSource:
  """`source`'s records repeated up to `length`: an epoch of that many records."""

  def __init__(self, source, length: int):
    self.source, self.length = source, max(length, len(source))
    self.encoded = source.encoded

  def __len__(self):
    return self.length

  def __getitem__(self, index):
    return self.source[index % len(self.source)]


def cpu_seconds_of_tree() -> float:
  """CPU seconds used so far by this process and its live descendants.

  Images per CPU-second is what a core can sustain; unlike wall time it does
  not drop when other jobs share the machine (this benchmark often runs on
  a busy 2-core VM). Linux /proc only; elsewhere just this process.
  """
  total = time.process_time()
  tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
  for pid in _descendants(os.getpid()):
    try:
      with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
      total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    except (OSError, IndexError, ValueError):
      pass  # process ended meanwhile
  return total


def _descendants(pid: int) -> list[int]:
  found, queue = [], [pid]
  while queue:
    parent = queue.pop()
    try:
      tasks = os.listdir(f"/proc/{parent}/task")
    except OSError:
      continue
    for task in tasks:
      try:
        with open(f"/proc/{parent}/task/{task}/children") as f:
          children = [int(c) for c in f.read().split()]
      except OSError:
        children = []
      found += children
      queue += children
  return found


def time_loop(fn, blobs: list[bytes], seconds: float) -> tuple[float, float]:
  """(images per wall second, images per CPU second) of fn over blobs."""
  rng = np.random.default_rng(0)
  fn(blobs[0], rng)  # warm up lazy init
  count, start, cpu_start = 0, time.perf_counter(), time.process_time()
  while True:
    for data in blobs:
      out = fn(data, rng)
      assert out.shape == (IMAGE_SIZE, IMAGE_SIZE, 3), out.shape
      count += 1
    elapsed = time.perf_counter() - start
    if elapsed >= seconds:
      return count / elapsed, count / (time.process_time() - cpu_start)


def decoder_table(blobs: list[bytes], seconds: float, title: str = "1)") -> float:
  """Prints the table; returns PIL's images per CPU-second."""
  methods = [("PIL: full decode + crop + resize", pil_full),
             ("simplejpeg: full decode + PIL resize", simplejpeg_full)]
  if cv2 is not None:
    methods += [("OpenCV: full imdecode + INTER_AREA", opencv_full),
                ("OpenCV: IMREAD_REDUCED_2/4/8 + INTER_AREA",
                 lambda d, r: opencv_full(d, r, reduced=True))]
  methods.append(("jaxnet, full decode: simplejpeg + OpenCV resize", jaxnet_train_full_decode))
  if decode._jpeg_region is not None:
    methods.append(("jaxnet TrainDecodeCrop: region decode + OpenCV resize", jaxnet_train))
  print(f"\n{title} single process, one core, {len(blobs)} JPEGs in memory, "
        f"decode + random-resized-crop + resize {IMAGE_SIZE} + flip "
        f"(best of 3 interleaved rounds; {benchlib.load_line()})", flush=True)
  # Interleaved rounds, best of each: a shared VM's noise hits all methods
  # alike instead of whichever happened to run during a hiccup.
  rounds = 3
  wall = {name: 0.0 for name, _ in methods}
  cpu = dict(wall)
  for _ in range(rounds):
    for name, fn in methods:
      w, c = time_loop(fn, blobs, seconds / rounds)
      wall[name], cpu[name] = max(wall[name], w), max(cpu[name], c)
  baseline = cpu[methods[0][0]]
  print(f"{'method':56s} {'images/s':>9s} {'img/CPU-s':>9s} {'vs PIL':>7s}")
  for name, _ in methods:
    print(f"{name:56s} {wall[name]:9.1f} {cpu[name]:9.1f} {cpu[name] / baseline:6.2f}x")
  return baseline


def large_copies(blobs: list[bytes]) -> list[bytes]:
  """1600x1200 q90 re-encodes: where reduced-scale decoding pays off."""
  print("\n(making 1600x1200 q90 re-encodes of 20 of them)", flush=True)
  return [simplejpeg.encode_jpeg(np.asarray(Image.open(io.BytesIO(b)).convert("RGB")
                                            .resize((1600, 1200), BILINEAR)), quality=90)
          for b in blobs]


def grain_rate(root: str, workers: int, batch_size: int, seconds: float, epoch_size: int,
               read_threads: int):
  """(images/s, images per CPU-second, seconds to first batch)."""
  source = RepeatedSource(ImageFolderSource(root, "train"), epoch_size)
  # jaxnet's own train pipeline, exactly as training builds it.
  loader = pipeline.train_loader(source, global_batch_size=batch_size, image_size=IMAGE_SIZE,
                                 seed=0, workers=workers, read_threads=read_threads)
  start = time.perf_counter()
  iterator = iter(loader)
  next(iterator)  # excludes worker start-up from the rate
  first = time.perf_counter() - start
  batches, start, cpu_start = 0, time.perf_counter(), cpu_seconds_of_tree()
  while time.perf_counter() - start < seconds:
    batch = next(iterator)
    batches += 1
  images = batches * batch_size
  rate = images / (time.perf_counter() - start)
  # Workers keep prefetching up to their buffer, so this slightly
  # overstates CPU per image for multi-worker rows (by <= buffered batches).
  cpu_rate = images / (cpu_seconds_of_tree() - cpu_start)
  assert batch["image"].shape == (batch_size, IMAGE_SIZE, IMAGE_SIZE, 3)
  del iterator  # stops worker processes
  return rate, cpu_rate, first


def grain_table(root: str, workers_list: list[int], batch_size: int, seconds: float,
                pil_cpu_rate: float, epoch_size: int, read_threads: int) -> None:
  print(f"\n2) jaxnet.core.data.pipeline.train_loader: Grain DataLoader, shuffled IndexSampler over "
        f"{epoch_size:,} records per epoch, TrainDecodeCrop({IMAGE_SIZE}), Batch({batch_size}), "
        f"{read_threads} read threads per worker; files read from disk; {os.cpu_count()} cores; "
        f"{benchlib.load_line()}")
  print(f"{'workers':>14s} {'images/s':>9s} {'per worker':>10s} {'img/CPU-s':>9s} "
        f"{'vs PIL loop':>11s} {'1st batch s':>11s}")
  for workers in workers_list:
    rate, cpu_rate, first = grain_rate(root, workers, batch_size, seconds, epoch_size,
                                       read_threads)
    label = f"{workers}" + (" (in-process)" if workers == 0 else "")
    print(f"{label:>14s} {rate:9.1f} {rate / max(workers, 1):10.1f} {cpu_rate:9.1f} "
          f"{rate / pil_cpu_rate:10.2f}x {first:11.2f}", flush=True)
  print("images/s: wall clock, all processes; vs PIL loop: images/s over the "
        "single-core PIL loop's images per CPU-second")


def dali_table(root: str, threads_list: list[int], batch_size: int, seconds: float,
               pil_cpu_rate: float) -> None:
  """jaxnet's DALI train loader (config.data.loader=dali) on DALI's CPU operators, beside the
  Grain rows: images/s and images per CPU-second for each number of DALI threads."""
  try:
    import nvidia.dali  # noqa: F401
  except ImportError:
    print("\n3) DALI: not installed (pip install -e '.[dali]'): no rows")
    return
  import jax
  from jaxnet.core.data import dali
  device = "mixed (GPU decode)" if jax.default_backend() == "gpu" else "cpu"
  print(f"\n3) jaxnet.core.data.dali.TrainLoader: DALI {nvidia.dali.__version__}, decoders.image_slice "
        f"device={device}, random-resized crop + resize {IMAGE_SIZE} + flip, batch {batch_size}; "
        f"{os.cpu_count()} cores; {benchlib.load_line()}")
  print(f"{'DALI threads':>14s} {'images/s':>9s} {'per thread':>10s} {'img/CPU-s':>9s} {'vs PIL loop':>11s}")
  source = ImageFolderSource(root, "train")
  for threads in threads_list:
    loader = dali.TrainLoader(source, global_batch_size=batch_size, image_size=IMAGE_SIZE, seed=0,
                              threads=threads)
    iterator = iter(loader)
    next(iterator)  # excludes the pipeline's build
    batches, start, cpu_start = 0, time.perf_counter(), cpu_seconds_of_tree()
    while time.perf_counter() - start < seconds:
      batch = next(iterator)
      batches += 1
    rate = batches * batch_size / (time.perf_counter() - start)
    cpu_rate = batches * batch_size / (cpu_seconds_of_tree() - cpu_start)
    assert batch["image"].shape == (batch_size, IMAGE_SIZE, IMAGE_SIZE, 3)
    iterator.close()
    print(f"{threads:>14d} {rate:9.1f} {rate / threads:10.1f} {cpu_rate:9.1f} {rate / pil_cpu_rate:10.2f}x",
          flush=True)


def transform_rate(blobs: list[bytes], size: int, seconds: float) -> float:
  """Images per CPU-second of TrainDecodeCrop(size) over in-memory records' images."""
  op, rng = TrainDecodeCrop(size), np.random.default_rng(0)
  op.random_map({"image": blobs[0], "label": 0}, rng)
  count, start = 0, time.process_time()
  while time.process_time() - start < seconds:
    for data in blobs:
      out = op.random_map({"image": data, "label": 0}, rng)["image"]
      count += 1
  assert out.shape == (size, size, 3)
  return count / (time.process_time() - start)


def loader_rate(source, size: int, batch_size: int, seconds: float, epoch_size: int,
                workers: int = 0) -> float:
  """Images per CPU-second of jaxnet's Grain train loader: in-process (workers=0), or with
  `workers` worker processes, the CPU of all of them and this process together (each batch
  dropped when the next is taken, as the training loop drops it)."""
  loader = pipeline.train_loader(RepeatedSource(source, epoch_size), global_batch_size=batch_size,
                                 image_size=size, seed=0, workers=workers)
  iterator = iter(loader)
  batch = next(iterator)  # excludes worker start-up from the rate
  # With workers, this process mostly waits: `seconds` of wall time, and the CPU of the tree.
  clock = cpu_seconds_of_tree if workers else time.process_time
  timer = time.perf_counter if workers else time.process_time
  batches, start, cpu_start = 0, timer(), clock()
  while timer() - start < seconds:
    batch = next(iterator)
    batches += 1
  rate = batches * batch_size / (clock() - cpu_start)
  del batch
  if workers:
    grain_adapter.close_iterator(iterator, workers)
  return rate


def _per_call_us(fn, items: list, seconds: float = 0.5) -> float:
  """CPU microseconds per fn(item), cycling through items."""
  fn(items[0])
  count, start = 0, time.process_time()
  while time.process_time() - start < seconds:
    for item in items:
      fn(item)
    count += len(items)
  return (time.process_time() - start) / count * 1e6


def stages(source, blobs: list[bytes], size: int, seconds: float = 0.5) -> dict:
  """Where one train image's CPU time goes (microseconds): the record's read from the
  source, the header and crop draw, the decode (of only the crop, at reduced scale where it
  allows; the whole image at that scale without the region decoder), the resize, the flip. The crop boxes are drawn once, so every stage sees the same."""
  rng = np.random.default_rng(0)
  draws = []
  for data in blobs:
    raw = decode.ppm_pixels(data)
    height, width = raw.shape[:2] if raw is not None else decode.jpeg_size(data)
    draws.append((data, raw, height, width, random_resized_crop_box(rng, height, width)))

  def crop(item):
    data, raw, height, width, box = item
    if raw is not None:
      top, left, h, w = box
      return raw[top:top + h, left:left + w]
    min_h = min(height, -(-height * size // box[2]))
    min_w = min(width, -(-width * size // box[3]))
    if decode._jpeg_region is not None:
      factor = decode.dct_factor(height, width, min_h, min_w)
      region = decode.decode_region(data, height, width, box, factor, True, transforms._scale_box)
      if region is not None:
        return region
    # Without the C region decoder (a checkout that did not build it, the GPU machine): the
    # transform's other path, the whole image at reduced scale, then the crop.
    pixels = decode.decode_jpeg(data, min_h, min_w, True)
    top, left, h, w = transforms._scale_box(box, height, width, pixels.shape[:2])
    return pixels[top:top + h, left:left + w]

  crops = [crop(item) for item in draws]
  indices = list(range(min(len(source), len(blobs))))
  image = transforms._resize(crops[0], size)
  return {"read": _per_call_us(lambda i: source[i], indices, seconds),
          "header + box": _per_call_us(lambda item: (decode.ppm_pixels(item[0]) is not None
                                                     or decode.jpeg_size(item[0]),
                                                     random_resized_crop_box(rng, item[2], item[3])),
                                       draws, seconds),
          "decode": _per_call_us(crop, draws, seconds),
          "resize": _per_call_us(lambda c: transforms._resize(c, size), crops, seconds),
          "flip": _per_call_us(transforms.flip_left_right, [image], seconds),
          "transform": 1e6 / transform_rate(blobs, size, 2 * seconds)}


def parse_prepared(spec: str) -> list[tuple[int, float]]:
  """"256,256:0.5,192" -> [(256, 0.0), (256, 0.5), (192, 0.0)]: shorter side[:raw fraction]."""
  out = []
  for item in spec.split(","):
    side, _, raw = item.partition(":")
    out.append((int(side), float(raw or 0)))
  return out


def path_name(side: int, raw: float) -> str:
  return f"prepared, shorter side {side}" + (f", {raw:.0%} raw" if raw else "")


IMAGENET_TRAIN = 1_281_167
# prepare's default first (time_to_accuracy --plan reads its row), then all JPEG, FFCV's
# share, all raw, and a smaller side.
DEFAULT_PREPARED = "256:0.75,256,256:0.5,256:1,192,192:0.5"


def prepared_table(root: str, tmp: str, kinds: list[tuple[int, float]], seconds: float, batch_size: int,
                   epoch_size: int, count: int, loader_workers: int = 0) -> dict:
  """Prints where the time goes and the prepared-against-full table; returns its rates
  (images per CPU-second) and storage."""
  source = ImageFolderSource(root, "train")
  picks = np.random.default_rng(0).choice(len(source), min(count, len(source)), replace=False)
  sizes = (224, 192, 160)
  paths = {"full-size JPEGs": (source, [source[int(i)]["image"] for i in picks])}
  storage = {"full-size JPEGs": sum(os.path.getsize(source.path(i)) for i in range(len(source))) / len(source)}
  for side, raw in kinds:
    out = os.path.join(tmp, f"prepared-{side}-{raw}")
    start = time.perf_counter()
    options = prepared.Options(short_side=side, raw_fraction=raw)
    entry = prepared.prepare_split(source, out, "train", options, report=lambda _: None)
    prepared.write_manifest(out, {"train": entry}, source.class_names, options)
    shards = prepared.PreparedSource(out, "train")
    name = path_name(side, raw)
    storage[name] = entry["bytes"] / len(shards)
    print(f"({name}: {len(source)} images prepared in {time.perf_counter() - start:.1f} s, "
          f"{storage[name] / 1024:.0f} KiB per image)", flush=True)
    paths[name] = (shards, [shards[int(i)]["image"] for i in picks])

  print(f"\n4a) where a train image's CPU time goes, microseconds (one core, {len(picks)} images; "
        f"decode = only the crop, at 1/2-1/8 scale where the crop allows; raw records: a view; "
        f"{benchlib.load_line()})")
  names = ["read", "header + box", "decode", "resize", "flip", "transform"]
  print(f"{'path':36s} {'size':>4s} " + " ".join(f"{n:>12s}" for n in names))
  profile = {}
  for name, (src, blobs) in paths.items():
    for size in (224, 160):
      profile.setdefault(name, {})[size] = row = stages(src, blobs, size, seconds / 16)
      print(f"{name:36s} {size:4d} " + " ".join(f"{row[n]:12.0f}" for n in names), flush=True)
  print("transform: the whole TrainDecodeCrop (the stages above plus its Python glue); read: the "
        "record from the files/shards (page cache)")

  print(f"\n4b) train transform per core (TrainDecodeCrop: decode at reduced scale where the crop "
        f"allows, random-resized crop, resize, flip), {len(picks)} images in memory, best of 3 "
        f"interleaved rounds; then the Grain loader "
        f"{f'with {loader_workers} workers (CPU of all processes)' if loader_workers else 'in-process'}, "
        f"batch {batch_size}, read from the "
        f"files/shards, best of 3 interleaved rounds; {benchlib.load_line()}")
  rates = {name: {} for name in paths}
  for _ in range(3):  # interleaved: a shared VM's noise hits every path alike
    for name, (_, blobs) in paths.items():
      for size in sizes:
        rates[name][size] = max(rates[name].get(size, 0.0), transform_rate(blobs, size, seconds / 3))
  loader = {name: {} for name in paths}
  for _ in range(3):  # the loader too: a single timing swung by 40% with the VM's load
    for name, (src, _) in paths.items():
      for size in (224, 160):
        rate = loader_rate(src, size, batch_size, seconds / 2, epoch_size, loader_workers)
        loader[name][size] = max(loader[name].get(size, 0.0), rate)
  full = rates["full-size JPEGs"]
  print(f"{'path':36s} {'KiB/img':>7s} {'GB/1.28M':>8s} " + " ".join(f"{f'{s}px':>6s} {'x':>5s}" for s in sizes)
        + f" | {'loader 224':>10s} {'x':>5s} {'loader 160':>10s} {'x':>5s}")
  for name in paths:
    cells = " ".join(f"{rates[name][s]:6.0f} {rates[name][s] / full[s]:4.2f}x" for s in sizes)
    lo, lo_full = loader[name], loader["full-size JPEGs"]
    print(f"{name:36s} {storage[name] / 1024:7.0f} {storage[name] * IMAGENET_TRAIN / 1e9:8.0f} {cells} | "
          f"{lo[224]:10.0f} {lo[224] / lo_full[224]:4.2f}x {lo[160]:10.0f} {lo[160] / lo_full[160]:4.2f}x",
          flush=True)
  print("images per CPU-second (= images/s of one fully used core); x: against the full-size JPEGs at "
        "the same size; KiB/img: bytes per image stored (shards: records and index), GB/1.28M: that "
        "for ImageNet's train split at these images' sizes")
  default = prepared.Options()
  return {"transform": rates, "loader": loader, "loader_workers": loader_workers, "storage_bytes_per_image": storage, "stages_us": profile,
          "prepared": [list(k) for k in kinds],
          "default_prepared": path_name(default.short_side, default.raw_fraction)}


def prepared_rows(args, root, tmp, seconds, batch_size, count, argv) -> None:
  spec = args.prepared or ("256:0.75,256" if args.quick else DEFAULT_PREPARED)
  rates = prepared_table(root, tmp, parse_prepared(spec), 2 * seconds, batch_size,
                         args.epoch_size, count, args.loader_workers)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"command": "python experiments/bench_input.py " + " ".join(sys.argv[1:] if argv is None else argv),
                 "hardware": benchlib.cpu_line(), "date": benchlib.date_line(), **rates}, f, indent=1)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--dir", help="image folder root (has train/); generated if omitted")
  parser.add_argument("--quick", action="store_true", help="short run (< 60 s on 2 cores)")
  parser.add_argument("--workers", default=None, help="comma list, default 0,1,2,4 (quick: 0,1,2)")
  parser.add_argument("--batch-size", type=int, default=None)
  parser.add_argument("--seconds", type=float, default=None, help="measuring time per row")
  parser.add_argument("--epoch-size", type=int, default=1_281_167,
                      help="records per epoch for the sampler (default: ImageNet's train split)")
  parser.add_argument("--read-threads", type=int, default=0,
                      help="config.data.read_threads: threads per worker reading files")
  parser.add_argument("--large", action="store_true",
                      help="also run the decoder table on 1600x1200 re-encodes")
  parser.add_argument("--prepared", default=None,
                      help="table 4's prepared shards: comma list of SHORTER_SIDE[:RAW_FRACTION] "
                           f"(jaxnet prepare's --short-side and --raw-fraction; default "
                           f"{DEFAULT_PREPARED}; --quick: 256:0.75,256)")
  parser.add_argument("--only-prepared", action="store_true", help="table 4 only")
  parser.add_argument("--loader-workers", type=int, default=0,
                      help="table 4's Grain loader with this many worker processes (default: in-process)")
  parser.add_argument("--json", help="write table 4's rates and the hardware to this file")
  args = parser.parse_args(argv)
  # Grain's worker processes read absl flags; we parse our own args instead.
  absl_flags.FLAGS.mark_as_parsed()
  quick = args.quick
  seconds = args.seconds or (1.5 if quick else 6.0)
  batch_size = args.batch_size or (32 if quick else 128)
  workers = [int(w) for w in (args.workers or ("0,1,2" if quick else "0,1,2,4")).split(",")]

  print(f"hardware: {benchlib.cpu_line()}, {platform.system()} {platform.machine()}")
  print(versions_line())
  with tempfile.TemporaryDirectory() as tmp:
    root = args.dir
    if root is None:
      root = tmp
      per_class = 16 if quick else 100
      print(f"generating 10 classes x {per_class} JPEGs (~500x375, q90, 4:2:0) in {tmp}")
      make_imagefolder(tmp, classes=10, per_class=per_class, val_per_class=1,
                       verbose=False)
    source = ImageFolderSource(root, "train")
    count = min(len(source), 160 if quick else 500)
    picks = np.random.default_rng(0).choice(len(source), count, replace=False)
    blobs = [source[int(i)]["image"] for i in picks]
    print(f"data: {root} ({len(source)} train images, "
          f"mean {np.mean([len(b) for b in blobs]) / 1024:.0f} KiB/JPEG)")
    if args.only_prepared:
      return prepared_rows(args, root, tmp, seconds, batch_size, count, argv)
    pil_rate = decoder_table(blobs, seconds)
    if args.large:
      decoder_table(large_copies(blobs[:20]), seconds, "1b) 1600x1200:")
    grain_table(root, workers, batch_size, 2 * seconds, pil_rate, args.epoch_size,
                args.read_threads)
    dali_table(root, sorted({max(w, 1) for w in workers}), batch_size, 2 * seconds, pil_rate)
    prepared_rows(args, root, tmp, seconds, batch_size, count, argv)


if __name__ == "__main__":
  main()
