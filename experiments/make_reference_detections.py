"""Reference outputs of torchvision's `retinanet_resnet50_fpn` (v1) under seeded weights.

  /work/venvtorch/bin/python experiments/make_reference_detections.py   # any env with torch + torchvision

Draws every tensor of the model's state dict (8 classes), and a 2 x 3 x 128 x 128 input, with
numpy (tests/reference_weights.py: draw_retinanet), loads them into torchvision's model
(strict), and writes to tests/data/torchvision_retinanet.npz (~0.5 MB):
  anchors              the anchor generator's (A, 4) for that input
  cls_logits, box_deltas   the heads' (2, A, 8) and (2, A, 4), fp32, eval mode
  boxes, scores, labels, counts   postprocess_detections' output (at most 300 per image), padded to 300
  target_boxes, target_labels, loss_classification, loss_box_reg   compute_loss on fixed targets
The network runs without torchvision's GeneralizedRCNNTransform (its resize to 800 and its
normalisation): tests/test_detection.py gives jaxnet the same input tensor.
"""

import os
import sys

import numpy as np
import torch
import torchvision
from torchvision.models.detection.image_list import ImageList

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests import reference_weights  # noqa: E402

OUT = os.path.join(REPO, "tests", "data", "torchvision_retinanet.npz")
NUM_CLASSES = 8
# Two images' ground truth for the loss: boxes (x0, y0, x1, y1) and labels.
TARGETS = [(np.array([[10, 12, 50, 60], [70, 20, 120, 44], [30, 80, 46, 96]], np.float32), np.array([1, 4, 7])),
           (np.array([[0, 0, 127, 127], [64, 64, 100, 120]], np.float32), np.array([0, 3]))]


def main() -> None:
  torch.manual_seed(0)
  model = torchvision.models.detection.retinanet_resnet50_fpn(weights=None, weights_backbone=None,
                                                              num_classes=NUM_CLASSES)
  shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
  images, tensors = reference_weights.draw_retinanet(shapes)
  model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=True)
  model.eval()
  x = torch.from_numpy(images)
  sizes = [tuple(x.shape[-2:])] * len(x)
  with torch.no_grad():
    features = list(model.backbone(x).values())
    head = model.head(features)
    anchors = model.anchor_generator(ImageList(x, sizes), features)
    per_level = [f.shape[2] * f.shape[3] * 9 for f in features]
    split = {k: list(v.split(per_level, dim=1)) for k, v in head.items()}
    detections = model.postprocess_detections(split, [list(a.split(per_level)) for a in anchors], sizes)
    targets = [{"boxes": torch.from_numpy(b), "labels": torch.from_numpy(l)} for b, l in TARGETS]
    losses = model.compute_loss(targets, head, anchors)
  out = {"anchors": anchors[0].numpy(), "cls_logits": head["cls_logits"].numpy(),
         "box_deltas": head["bbox_regression"].numpy(),
         "loss_classification": losses["classification"].numpy(), "loss_box_reg": losses["bbox_regression"].numpy()}
  pad = lambda a, n, shape: np.concatenate([a, np.zeros((n - len(a),) + shape, a.dtype)])
  out["counts"] = np.array([len(d["scores"]) for d in detections])
  out["boxes"] = np.stack([pad(d["boxes"].numpy(), 300, (4,)) for d in detections])
  out["scores"] = np.stack([pad(d["scores"].numpy(), 300, ()) for d in detections])
  out["labels"] = np.stack([pad(d["labels"].numpy(), 300, ()) for d in detections])
  out["target_boxes"] = np.stack([pad(b, 3, (4,)) for b, _ in TARGETS])
  out["target_labels"] = np.stack([pad(l.astype(np.int32), 3, ()) for _, l in TARGETS])
  out["target_counts"] = np.array([len(l) for _, l in TARGETS])
  np.savez_compressed(OUT, **out)
  print(f"torch {torch.__version__}, torchvision {torchvision.__version__}: wrote {OUT} "
        f"({os.path.getsize(OUT) / 1024:.0f} KiB); detections per image {out['counts'].tolist()}, "
        f"losses {float(out['loss_classification']):.6f} / {float(out['loss_box_reg']):.6f}")


if __name__ == "__main__":
  main()
