"""The shapes detection dataset (jaxnet/tools/make_shapes.py): boxes inside their images."""

import json
import os

import numpy as np
import pytest

pytest.importorskip("skimage")

from jaxnet.tools.make_shapes import make_shapes, shapes_image  # noqa: E402


def test_every_box_lies_inside_its_image_and_shapes_at_the_edge_keep_their_inside_part():
  rng = np.random.default_rng(0)
  at_edge = 0
  for _ in range(60):
    image, boxes = shapes_image(rng)
    height, width = image.shape[:2]
    for _, (x, y, w, h) in boxes:
      assert 0 <= x and 0 <= y and w > 0 and h > 0 and x + w <= width and y + h <= height
      at_edge += x == 0 or y == 0 or x + w == width or y + h == height
  assert at_edge >= 5  # the generator does draw shapes cut by the edge: the case is exercised


def test_the_coco_source_clips_nothing(tmp_path):
  from jaxnet.core.data.coco import CocoSource
  root = make_shapes(str(tmp_path), train_images=40, val_images=4, seed=1, verbose=False)
  with open(os.path.join(root, "annotations", "instances_train.json")) as f:
    assert len(json.load(f)["annotations"]) >= 40
  source = CocoSource(root, "train")
  assert source.counts.clipped == 0 and source.counts.empty == 0
  assert source.note is None
