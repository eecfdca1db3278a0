"""TfdsSource over a tiny dataset built here in TFDS ArrayRecord format.

Building works without TensorFlow in tfds 4.9.10 given three choices:
* the generator yields JPEG *bytes* for `tfds.features.Image(encoding_format=
  'jpeg')`, so tfds stores them as-is (numpy arrays would need TF to encode);
* `_info` builds `tfds.core.DatasetInfo` directly, because
  `dataset_info_from_configs` looks for metadata files next to the builder's
  module (the tests folder has none);
* `skip_registration=True`, so reading goes through tfds' read-from-files path,
  exactly like a dataset prepared elsewhere (e.g. imagenet2012 on a bigger box).
"""

import pickle
import sys

import numpy as np
import pytest
import simplejpeg

tfds = pytest.importorskip("tensorflow_datasets")

from jaxnet.core.data.tfds_source import TfdsSource  # noqa: E402
from jaxnet.core.data.transforms import decode_jpeg  # noqa: E402

NAME = "tiny_jpeg_for_test"  # tfds derives it from the class name
CLASS_NAMES = ["cat", "dog", "bird"]
SPLIT_SIZES = {"train": 7, "validation": 3}


def shape_for(label: int, index: int) -> tuple[int, int]:
  """Image size encodes the label, so records can be checked after tfds shuffles them."""
  return 16 + 8 * label, 24 + index


class TinyJpegForTest(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg"),
            "label": tfds.features.ClassLabel(names=CLASS_NAMES),
        }))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(n) for split, n in SPLIT_SIZES.items()}

  def _generate_examples(self, count):
    rng = np.random.default_rng(count)
    for index in range(count):
      label = index % len(CLASS_NAMES)
      pixels = rng.integers(0, 256, (*shape_for(label, index), 3), dtype=np.uint8)
      yield index, {"image": simplejpeg.encode_jpeg(pixels, quality=90),
                    "label": label}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("tfds"))
  TinyJpegForTest(data_dir=root, file_format="array_record").download_and_prepare()
  return root


@pytest.mark.parametrize("split", list(SPLIT_SIZES))
def test_reads_back_labels_and_jpeg_bytes(data_dir, split):
  source = TfdsSource(NAME, split, data_dir)
  assert len(source) == SPLIT_SIZES[split]
  assert source.num_classes == 3 and source.class_names == CLASS_NAMES
  assert source.encoded is True
  labels = []
  for i in range(len(source)):
    record = source[i]
    assert set(record) == {"image", "label"}
    assert isinstance(record["image"], bytes) and type(record["label"]) is int
    height, width, _ = decode_jpeg(record["image"]).shape
    assert height == shape_for(record["label"], 0)[0]  # label matches its image
    labels.append(record["label"])
  expected = [i % 3 for i in range(SPLIT_SIZES[split])]
  assert sorted(labels) == sorted(expected)
  # The image widths 24 + index are all present: nothing lost or duplicated.
  widths = sorted(decode_jpeg(source[i]["image"]).shape[1] for i in range(len(source)))
  assert widths == [24 + i for i in range(SPLIT_SIZES[split])]


def test_build_and_read_with_tensorflow_blocked(tmp_path, monkeypatch):
  # A None entry makes `import tensorflow` raise even where TF is installed.
  monkeypatch.setitem(sys.modules, "tensorflow", None)
  TinyJpegForTest(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  source = TfdsSource(NAME, "validation", str(tmp_path))
  assert decode_jpeg(source[0]["image"]).ndim == 3


def test_split_slicing_and_pickling(data_dir):
  source = TfdsSource(NAME, "train[:4]", data_dir)
  assert len(source) == 4
  clone = pickle.loads(pickle.dumps(source))  # grain workers receive a copy
  assert [clone[i] for i in range(4)] == [source[i] for i in range(4)]


def test_unprepared_dataset_names_where_and_how(tmp_path):
  empty = str(tmp_path / "empty")
  with pytest.raises(FileNotFoundError) as err:
    TfdsSource(NAME, "train", empty)
  message = str(err.value)
  assert f"{empty}/{NAME}" in message
  assert f"tfds build {NAME} --data_dir={empty} --file_format=array_record" in message


def test_unprepared_imagenet_gives_manual_download_steps(tmp_path):
  empty = str(tmp_path / "empty")
  with pytest.raises(FileNotFoundError) as err:
    TfdsSource("imagenet2012", "train", empty)
  message = str(err.value)
  assert f"{empty}/imagenet2012" in message
  assert "ILSVRC2012_img_train.tar" in message and "ILSVRC2012_img_val.tar" in message
  assert (f"tfds build imagenet2012 --data_dir={empty} --manual_dir=MANUAL_DIR "
          "--file_format=array_record") in message
  assert "download_config=tfds.download.DownloadConfig(manual_dir=MANUAL_DIR)" in message


def test_an_image_folder_given_as_tfds_is_one_line_naming_the_source(tmp_path, monkeypatch):
  # An ImageNet-style folder passed to a tfds recipe: the fix, not TensorFlow's build steps,
  # and tfds is not asked (its answer starts with a warning logged above the error line).
  monkeypatch.setattr(tfds, "builder", lambda *a, **k: pytest.fail("tfds was asked"))
  with pytest.raises(FileNotFoundError, match="no dataset_info.json found"):
    TfdsSource("imagenet2012", "train", str(tmp_path / "empty"))
  (tmp_path / "train" / "cat").mkdir(parents=True)
  with pytest.raises(FileNotFoundError) as err:
    TfdsSource("imagenet2012", "train", str(tmp_path))
  assert str(err.value) == (f"data.dir={str(tmp_path)!r} holds an image folder ({tmp_path}/train/CLASS/...), "
                            "not the TFDS dataset 'imagenet2012': add --config.data.source=imagefolder")


def test_identity_names_the_prepared_dataset_and_its_split(data_dir):
  """What data_identity.json records for a tfds split (docs/reproducibility.md): read from
  dataset_info.json, kept through the pickling grain's workers do."""
  identity = TfdsSource(NAME, "validation", data_dir).identity()
  assert identity["name"] == f"{NAME}/1.0.0" and identity["version"] == "1.0.0"
  assert identity["examples"] == 3 and identity["shard_lengths"] == [3] and identity["split_num_bytes"] > 0
  train = pickle.loads(pickle.dumps(TfdsSource(NAME, "train", data_dir)))
  assert train.identity()["examples"] == 7 and train.identity() != identity
