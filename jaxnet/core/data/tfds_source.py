"""Random-access source over a TFDS dataset prepared as ArrayRecord.

Reads raw JPEG bytes (SkipDecoding) through `tfds.data_source`, which needs no
TensorFlow; decoding happens in the Grain transforms. Preparing a dataset
(e.g. imagenet2012 from its manually downloaded tars) is a one-off step that
does need TensorFlow, so it is not done here: a missing dataset raises
FileNotFoundError with the commands to prepare it.
"""

from __future__ import annotations

from jaxnet.core.errors import MissingFileError

_RANDOM_ACCESS_FORMATS = ("array_record", "parquet")


def _prepare_help(name: str, data_dir: str) -> str:
  manual = ""
  if name.split(":")[0].split("/")[0] == "imagenet2012":
    manual = (
        "  1. Download ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar "
        "(register at https://image-net.org/download-images) into MANUAL_DIR "
        "(do not extract them).\n  2. ")
  return (
      "Prepare it once, in an environment that has TensorFlow (the tfds "
      "build step imports it; reading afterwards does not), e.g. "
      "`pip install tensorflow tensorflow-datasets`:\n"
      f"{manual or '  '}tfds build {name} --data_dir={data_dir} "
      + ("--manual_dir=MANUAL_DIR " if manual else "")
      + "--file_format=array_record\n"
      "  or in Python:\n"
      f"    tfds.builder({name!r}, data_dir={data_dir!r}, "
      "file_format='array_record').download_and_prepare("
      + ("download_config=tfds.download.DownloadConfig(manual_dir=MANUAL_DIR)"
         if manual else "") + ")"
  )


def _not_prepared(name: str, data_dir: str, looked_in: str, why: str) -> FileNotFoundError:
  return MissingFileError(
      f"TFDS dataset {name!r} is not prepared as ArrayRecord: {why} "
      f"(looked in {looked_in!r}).\n{_prepare_help(name, data_dir)}")


def _check_looks_prepared(name: str, split: str, data_dir: str | None) -> None:
  """A local data_dir without the dataset's dataset_info.json is refused before tfds is asked
  (whose answer is a logged warning and TensorFlow's build steps), naming the likely mistake
  where there is one: an image folder given as a TFDS dataset."""
  import glob
  import os
  if not data_dir or "://" in data_dir:  # gs://... and the like: tfds' own file system
    return
  base = os.path.join(data_dir, name.split(":")[0])
  if glob.glob(os.path.join(glob.escape(base), "**", "dataset_info.json"), recursive=True):
    return
  split_dir = os.path.join(data_dir, split.split("[")[0])
  if os.path.isdir(split_dir) and any(e.is_dir() for e in os.scandir(split_dir)):
    raise MissingFileError(
        f"data.dir={data_dir!r} holds an image folder ({split_dir}/CLASS/...), not the TFDS "
        f"dataset {name!r}: add --config.data.source=imagefolder")
  raise _not_prepared(name, data_dir, base, "no dataset_info.json found")


def open_prepared(name: str, split: str, data_dir: str | None, image_key: str = "image"):
  """(tfds.data_source of a dataset prepared as ArrayRecord with its images as raw bytes,
  the dataset's features); MissingFileError with the commands to prepare it otherwise.
  Preparation is checked here: tfds.data_source would otherwise start downloading and
  preparing, or fail with a format error on TFRecord data."""
  _check_looks_prepared(name, split, data_dir)
  import tensorflow_datasets as tfds  # slow import: only when used
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as err:
    root = data_dir or tfds.core.constants.get_default_data_dir()
    raise _not_prepared(name, root, f"{root}/{name}",
                        "no such registered dataset and no prepared "
                        "copy in data_dir") from err
  root = data_dir or str(builder.data_dir_root)
  if not builder.is_prepared():
    raise _not_prepared(name, root, str(builder.data_dir),
                        "no dataset_info.json found")
  formats = [builder.info.file_format.value] + [
      f.value for f in builder.info.alternative_file_formats]
  if not set(formats) & set(_RANDOM_ACCESS_FORMATS):
    raise _not_prepared(name, root, str(builder.data_dir),
                        f"it is prepared only as {formats}")
  data = tfds.data_source(name, split=split, data_dir=data_dir, download=False,
                          decoders={image_key: tfds.decode.SkipDecoding()})
  return data, builder.info


def prepared_identity(info, split: str, examples: int) -> dict:
  """A prepared split's identity from its dataset_info.json (nothing else is read): the
  dataset's full name and version, the split's record count, shard lengths and bytes, and
  a digest of the download checksums tfds verified when it prepared the dataset."""
  import json
  from jaxnet.core import provenance
  identity = {"source": "tfds", "name": info.full_name, "version": str(info.version),
              "split": split, "examples": examples}
  try:
    split_info = info.splits[split]
    identity["split_num_bytes"] = int(getattr(split_info, "num_bytes", 0) or 0)
    identity["shard_lengths"] = [int(n) for n in getattr(split_info, "shard_lengths", [])]
  except (KeyError, ValueError, TypeError):  # a split tfds cannot describe on its own
    pass
  checksums = getattr(info, "download_checksums", None) or {}
  if checksums:
    identity["download_checksums_sha256"] = provenance.text_sha256(
        json.dumps({str(k): str(v) for k, v in checksums.items()}, sort_keys=True))
  return identity


class TfdsSource:
  """Grain random-access source: `source[i] -> {"image": bytes, "label": int}`."""

  encoded = True  # images are JPEG bytes; the pipeline must decode them

  def __init__(self, name: str, split: str, data_dir: str | None = None,
               image_key: str = "image", label_key: str = "label"):
    self.name, self.split = name, split
    self._image_key, self._label_key = image_key, label_key
    self._data, info = open_prepared(name, split, data_dir, image_key)
    # Read now: grain's workers get a pickled copy of the source, without the DatasetInfo.
    self._identity = prepared_identity(info, split, len(self._data))
    labels = info.features[label_key]
    self.num_classes: int = labels.num_classes
    self.class_names: list[str] | None = list(labels.names) or None

  def __len__(self) -> int:
    return len(self._data)

  def identity(self) -> dict:
    return dict(self._identity)

  def __getitem__(self, index: int) -> dict:
    record = self._data[index]
    return {"image": record[self._image_key],
            "label": int(record[self._label_key])}

  def __repr__(self) -> str:
    return (f"TfdsSource(name={self.name!r}, split={self.split!r}, "
            f"len={len(self)}, num_classes={self.num_classes})")
