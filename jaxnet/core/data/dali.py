"""The input pipeline on NVIDIA DALI (config.data.loader="dali"): JPEG decode and augmentation
by DALI, on the GPU (nvJPEG, device="mixed") where jax computes on one, on the CPU otherwise.

The same examples and the same transforms as the Grain pipeline (pipeline.py): an image
folder's files and labels (ImageFolderSource: the same classes, the same files left out), or
prepared shards' records (PreparedSource, `jaxnet prepare`: DALI has no ArrayRecord reader, so
a per-sample callback, `ShardSamples`, reads record i of the shards in DALI's Python workers;
JPEG and raw (PPM) records both go to DALI's image decoder), for
training a random-resized crop (area 0.08-1, aspect ratio 3/4-4/3) decoded from the JPEG's
crop, resized to the training size, flipped with probability 1/2; for eval the reference
resize of the shorter side to image_size / crop_fraction and the center crop. Batches are this
process's share of the global batch, uint8 NHWC with the same `label`, `mask` and `corrupt`
fields; the train loader implements the iterator protocol DeviceBatches uses
(get_state/set_state), its state DALI's own checkpoint, so a resumed run sees the batches an
uninterrupted one would (the random draws are DALI's, a function of the seed and the position).

Limits, said where they apply: tfds's ArrayRecord is not read (a tfds record is a serialized
example, not an image; prepare it with `jaxnet prepare --source tfds`); a file
DALI cannot decode stops the run (Grain masks it and counts it), so the Grain loader remains
the one for folders that may hold broken files; RandAugment is Grain's only.
"""

import base64
import json
import math

import numpy as np

from jaxnet.core.errors import InvalidValueError, UserError

INSTALL = "pip install -e '.[dali]' (CUDA 12; '.[dali-cuda13]' for CUDA 13)"
AREA, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


def require():
  """DALI's modules, or one line naming the install."""
  try:
    import nvidia.dali as dali
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
  except ImportError:
    raise UserError(f"config.data.loader=dali needs NVIDIA DALI, which is not installed: {INSTALL}") from None
  return dali, fn, types


def check_source(source, name: str, randaug_ops: int) -> None:
  """What DALI reads: image folders and prepared shards, without RandAugment. One line naming
  the fix otherwise."""
  from jaxnet.core.data.imagefolder import ImageFolderSource
  if not isinstance(source, ImageFolderSource) and not _is_prepared(source):
    raise InvalidValueError(f"config.data.loader=dali reads image folders (data.source=imagefolder) and "
                            f"prepared shards (data.source=prepared), not data.source={name}: use "
                            f"data.loader=grain for it, or jaxnet prepare its data")
  if randaug_ops:
    raise InvalidValueError("config.data.randaug_num_ops: RandAugment runs in the Grain loader only; "
                            "set it to 0 for data.loader=dali, or use data.loader=grain")


def _is_prepared(source) -> bool:
  from jaxnet.core.data.prepared import PreparedSource
  return isinstance(source, PreparedSource)


class ShardSamples:
  """DALI's per-sample callback over records [start, end) of prepared shards:
  `sample_info.idx_in_epoch` -> (the record's image bytes, its label).

  Train (`seed` given): one endless DALI epoch; sample i is position i % n of epoch i // n,
  whose order is a permutation drawn from (seed, epoch). DALI's checkpoint holds how many
  samples were taken (and its random generators), so a restored pipeline asks for the next
  index and sees what an uninterrupted one would. Eval (`seed` None): the records in order,
  past the end the last one again (padding the caller masks). Picklable: DALI's workers get a
  copy and open the shards themselves.
  """

  def __init__(self, paths: list[str], start: int, end: int, seed: int | None = None):
    self.paths, self.start, self.end, self.seed = list(paths), start, end, seed
    self._data, self._order = None, (None, None)

  def __getstate__(self):
    return {"paths": self.paths, "start": self.start, "end": self.end, "seed": self.seed}

  def __setstate__(self, state):
    self.__init__(**state)

  def index(self, sample: int) -> int:
    """The record that sample `sample` of the stream reads."""
    n = self.end - self.start
    if self.seed is None:
      return self.start + min(sample, n - 1)
    epoch, position = divmod(sample, n)
    if self._order[0] != epoch:
      self._order = (epoch, np.random.default_rng([self.seed, epoch]).permutation(n))
    return self.start + int(self._order[1][position])

  def __call__(self, sample_info):
    from jaxnet.core.data import prepared
    if self._data is None:  # array_record's own reader: Grain's would import jax into each worker
      from array_record.python.array_record_data_source import ArrayRecordDataSource
      self._data = ArrayRecordDataSource(self.paths)
    record = prepared.decode_record(self._data[self.index(sample_info.idx_in_epoch)])
    return np.frombuffer(record["image"], np.uint8), np.array([record["label"]], np.int32)


def _shard_reader(fn, types, source, start: int, end: int, seed: int | None):
  """(encoded images, labels) of records [start, end) of prepared shards, read by ShardSamples
  in DALI's Python workers (shuffled with `seed`; in order when None)."""
  return fn.external_source(ShardSamples(source.paths, start, end, seed), num_outputs=2, batch=False,
                            parallel=True, dtype=[types.UINT8, types.INT32])


def _python_workers(source, threads: int) -> dict:
  """pipeline_def's arguments for ShardSamples' worker processes (spawned: the parent holds
  jax's threads, which a fork would copy mid-lock)."""
  if not _is_prepared(source):
    return {}
  return {"py_num_workers": max(1, threads // 2), "py_start_method": "spawn"}


def _files(source) -> list[str]:
  """What `run` looks through when DALI fails to decode: an image folder's files (a prepared
  shard's images were all decoded when it was written)."""
  return [] if _is_prepared(source) else source.files_and_labels()[0]


def _device_id() -> int | None:
  """The GPU the pipeline decodes on: this process's first, where jax computes on GPUs."""
  import jax
  return 0 if jax.default_backend() == "gpu" else None


def _to_numpy(batch) -> np.ndarray:
  batch = batch.as_cpu() if hasattr(batch, "as_cpu") else batch
  return np.asarray(batch.as_tensor())


class TrainLoader:
  """An endless, shuffled, augmented stream of this process's batches (see the module)."""

  def __init__(self, source, *, global_batch_size: int, image_size: int, seed: int,
               process_index: int = 0, process_count: int = 1, threads: int = 2):
    self.source, self.files = source, _files(source)
    self.batch = global_batch_size // process_count
    self.image_size, self.seed, self.threads = image_size, seed, threads
    self.shard, self.shards = process_index, process_count

  def __iter__(self):
    return _TrainIterator(self)

  def pipeline(self, checkpoint: bytes | None = None, windows: bool = False):
    """The built DALI pipeline (from `checkpoint`, DALI's, when given). `windows`: it also
    returns each crop's (height, width) and its image's shape, for tests."""
    dali, fn, types = require()
    device_id = _device_id()

    @dali.pipeline_def(batch_size=self.batch, num_threads=self.threads, device_id=device_id,
                       seed=self.seed, enable_checkpointing=True, prefetch_queue_depth=1,
                       **_python_workers(self.source, self.threads))
    def train():
      if _is_prepared(self.source):  # this process's share, as Grain's ShardOptions(drop_remainder)
        share = len(self.source) // self.shards
        jpegs, labels = _shard_reader(fn, types, self.source, self.shard * share,
                                      (self.shard + 1) * share, self.seed)
      else:
        files, labels = self.source.files_and_labels()
        jpegs, labels = fn.readers.file(files=files, labels=labels, random_shuffle=True,
                                        shard_id=self.shard, num_shards=self.shards, name="files",
                                        seed=self.seed)
      # The crop window is drawn first and only its part of the JPEG decoded, as the Grain
      # loader's region decoding does (the same area and aspect-ratio ranges, 10 attempts).
      whole = fn.peek_image_shape(jpegs)
      anchor, shape = fn.random_crop_generator(whole, random_area=list(AREA),
                                               random_aspect_ratio=list(RATIO), num_attempts=10)
      images = fn.decoders.image_slice(jpegs, anchor, shape, axes=[0, 1], output_type=types.RGB,
                                       device="mixed" if device_id is not None else "cpu")
      images = fn.resize(images, resize_x=self.image_size, resize_y=self.image_size,
                         interp_type=types.INTERP_LINEAR, antialias=True)
      images = fn.flip(images, horizontal=fn.random.coin_flip(probability=0.5))
      return (images, labels, shape, whole) if windows else (images, labels)

    pipe = train(checkpoint=checkpoint)
    pipe.build()
    return pipe


class _TrainIterator:
  def __init__(self, loader: TrainLoader, checkpoint: bytes | None = None):
    self.loader = loader
    self.pipe = loader.pipeline(checkpoint)

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    images, labels = run(self.pipe, self.loader.files)
    images = _to_numpy(images).astype(np.uint8)
    n = len(images)
    return {"image": images, "label": _to_numpy(labels).reshape(n).astype(np.int32),
            "mask": np.ones(n, bool), "corrupt": np.zeros(n, np.int32)}

  def get_state(self) -> bytes:
    """DALI's checkpoint of the pipeline (reader position and random generators), after the
    batches returned so far, as the JSON text Grain's checkpoint handler stores."""
    return json.dumps({"dali": base64.b64encode(self.pipe.checkpoint()).decode()}).encode()

  def set_state(self, state: bytes) -> None:
    saved = json.loads(state)
    if "dali" not in saved:
      raise InvalidValueError("the saved data position is a Grain loader's, not DALI's: resume with "
                              "data.loader=grain, as the run that wrote it")
    self.pipe = self.loader.pipeline(base64.b64decode(saved["dali"]))

  def start_prefetch(self) -> None:
    """Called by Grain's checkpoint handler after set_state: DALI prefetches by itself."""

  def close(self) -> None:
    self.pipe = None


def run(pipe, files: list[str]):
  """`pipe.run()`; a file DALI cannot decode is one line naming it, instead of DALI's traceback
  with nvImageCodec's message, which names no file. DALI does not say which file failed, so
  `files` are looked through for the first that is not an image (only after a failure)."""
  try:
    return pipe.run()
  except RuntimeError:  # DALI raises its decode errors as RuntimeError
    culprit = unreadable_file(files)
    if culprit is None:
      raise  # not a file's fault: DALI's own error, as it is
    path, why = culprit
    raise UserError(f"data.loader=dali cannot decode {path} ({why}); DALI stops at a file it cannot "
                    f"decode: remove or replace it, or use data.loader=grain, which skips, masks and "
                    f"counts unreadable images") from None


def unreadable_file(files: list[str]) -> tuple[str, str] | None:
  """(the first of `files` that is not a readable image, why), or None."""
  from PIL import Image
  from jaxnet.core.data import decode
  for path in files:
    try:
      with open(path, "rb") as f:
        head = f.read(64 * 1024)
    except OSError as e:
      return path, "not found" if isinstance(e, FileNotFoundError) else f"cannot be read: {e.strerror}"
    try:
      if decode.jpeg_size(head) is None:  # not a JPEG: let PIL tell whether it is an image
        with Image.open(path) as image:
          image.verify()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
      return path, f"not an image: {e}" if str(e) else "not an image"
  return None


def _half_even(x):
  """Python's round() of a DALI value that is a whole or a half number."""
  dali, _, _ = require()
  floor = dali.math.floor(x)
  half = x - floor                               # 0 or 0.5
  odd = floor - 2 * dali.math.floor(floor / 2)   # 1 where floor is odd
  return floor + 2 * half * odd


def eval_batches(source, *, global_batch_size: int, image_size: int, process_index: int = 0,
                 process_count: int = 1, crop_fraction: float = 0.875, interpolation: str = "bilinear",
                 threads: int = 2):
  """Every example of `source` exactly once, in fixed-size batches of this process's share,
  the padding masked out (as pipeline.eval_batches)."""
  from jaxnet.core.data.pipeline import shard_bounds
  from jaxnet.core.data.transforms import check_crop_fraction, check_interpolation
  check_crop_fraction(crop_fraction)
  check_interpolation(interpolation)
  dali, fn, types = require()
  start, end = shard_bounds(len(source), process_index, process_count)
  files = _files(source)[start:end]
  count = end - start
  batch = global_batch_size // process_count
  num_batches = math.ceil(shard_bounds(len(source), 0, process_count)[1] / batch)
  device_id = _device_id()
  short = float(math.floor(image_size / crop_fraction))
  interp = {"bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC}[interpolation]
  pipe = None
  if count:
    @dali.pipeline_def(batch_size=batch, num_threads=threads, device_id=device_id, prefetch_queue_depth=1,
                       **_python_workers(source, threads))
    def evaluation():
      if _is_prepared(source):
        jpegs, lab = _shard_reader(fn, types, source, start, end, None)
      else:
        files_, labels = source.files_and_labels()
        jpegs, lab = fn.readers.file(files=files_[start:end], labels=labels[start:end], random_shuffle=False,
                                     pad_last_batch=True, name="files")
      images = fn.decoders.image(jpegs, device="mixed" if device_id is not None else "cpu",
                                 output_type=types.RGB)
      # The reference geometry (transforms.eval_crop_geometry), per image: the shorter side to
      # `short`, the longer truncated; the crop offset rounded half to even.
      hw = fn.cast(fn.peek_image_shape(jpegs), dtype=types.FLOAT)
      h, w = hw[0], hw[1]
      shorter = dali.math.min(h, w)
      new_h, new_w = dali.math.floor(short * h / shorter), dali.math.floor(short * w / shorter)
      images = fn.resize(images, resize_x=new_w, resize_y=new_h, interp_type=interp, antialias=True)
      offset = fn.cast(fn.stack(_half_even((new_h - image_size) / 2), _half_even((new_w - image_size) / 2)),
                       dtype=types.INT32)
      images = fn.slice(images, start=offset,
                        shape=[image_size, image_size], axes=[0, 1])
      return images, lab
    pipe = evaluation()
    pipe.build()
  for i in range(num_batches):
    valid = max(0, min(batch, count - i * batch))
    if valid:
      images, lab = run(pipe, files)
      images, lab = _to_numpy(images).astype(np.uint8), _to_numpy(lab).reshape(-1).astype(np.int32)
    else:
      images, lab = np.zeros((batch, image_size, image_size, 3), np.uint8), np.zeros(batch, np.int32)
    mask = np.arange(batch) < valid
    yield {"image": images, "label": np.where(mask, lab, 0), "mask": mask,
           "corrupt": np.zeros(batch, np.int32)}
