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
  from jaxnet.core.tasks.detection.coco import CocoSource
  root = make_shapes(str(tmp_path), train_images=40, val_images=4, seed=1, verbose=False)
  with open(os.path.join(root, "annotations", "instances_train.json")) as f:
    assert len(json.load(f)["annotations"]) >= 40
  source = CocoSource(root, "train")
  assert source.counts.clipped == 0 and source.counts.empty == 0
  assert source.note is None


def test_detections_are_drawn_magnified_with_labels_above_their_boxes(tmp_path):
  from PIL import Image
  from jaxnet.core.tasks import detection as predictor
  pixels = Image.fromarray(np.full((136, 149, 3), 200, np.uint8))  # the size of a shapes image the issue drew
  detections = [("circle", 0.91, [20.0, 30.0, 60.0, 70.0]), ("triangle", 0.55, [64.0, 0.0, 100.0, 40.0])]
  predictor.draw_detections(pixels, detections, str(tmp_path / "a.png"))
  drawn = np.asarray(Image.open(tmp_path / "a.png"))
  scale = predictor.draw_scale(149, 136)
  assert scale == 4 and drawn.shape == (136 * 4, 149 * 4, 3)  # the shorter side >= 512
  red = tuple(int(255 * c) for c in predictor._PALETTE[0])
  assert tuple(drawn[30 * 4 + 20, 20 * 4]) == red       # the first box's left edge, magnified
  assert (drawn[30 * 4 - 1, 20 * 4:20 * 4 + 60] == red).all()  # its label's band, just above the box
  band = drawn[30 * 4 - 20:30 * 4, 20 * 4:20 * 4 + 60]
  assert (band == 255).all(axis=-1).sum() > 30  # with white text on it
  green = tuple(int(255 * c) for c in predictor._PALETTE[1])
  assert tuple(drawn[5, 64 * 4 + 2]) == green  # no room above the second box: its label inside
  predictor.draw_detections(Image.fromarray(np.zeros((600, 800, 3), np.uint8)), detections, str(tmp_path / "b.png"))
  assert Image.open(tmp_path / "b.png").size == (800, 600)  # large images keep their size
