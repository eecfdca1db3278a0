"""Segmentation's metrics, as torchvision's segmentation reference computes them
(references/segmentation/utils.py, ConfusionMatrix): one confusion matrix over the whole eval
set, rows the true class and columns the predicted one, over the pixels whose true label is a
class (the ignore label, 255, and anything else >= num_classes count nowhere), and from it

  pixel accuracy   diag.sum() / total                      (torchvision's acc_global)
  class accuracy   diag / row sums                         (its acc, "average row correct")
  IoU per class    diag / (row sums + column sums - diag)  (its iu)
  mean IoU         the plain mean of the per-class IoUs    (its iu.mean(): not a nanmean, so a
                   class absent from both the truth and the predictions of the whole set makes
                   its IoU 0/0 = nan and the mean nan, as there)

The matrix is summed on the device per batch (`confusion`) and added up on the host
(`scores`), so padded pixels and padded examples, which carry no class, count nowhere.
"""

import jax.numpy as jnp
import numpy as np


def confusion(labels, predictions, valid, num_classes: int):
  """(num_classes, num_classes) int32 counts of (true, predicted) over the pixels where
  `valid` is True and the true label is a class."""
  labels = labels.astype(jnp.int32)
  counted = valid & (labels >= 0) & (labels < num_classes)
  index = jnp.where(counted, labels * num_classes + predictions.astype(jnp.int32), 0)
  counts = jnp.zeros((num_classes * num_classes,), jnp.int32).at[index.ravel()].add(
      counted.ravel().astype(jnp.int32))
  return counts.reshape(num_classes, num_classes)


def scores(matrix) -> dict:
  """{"pixel_accuracy", "class_accuracy" (per class), "iou" (per class), "mean_iou"} of a
  confusion matrix, by torchvision's definitions (nan where a class has no pixel, as there)."""
  h = np.asarray(matrix, np.float64)
  diag = np.diag(h)
  with np.errstate(divide="ignore", invalid="ignore"):
    iou = diag / (h.sum(1) + h.sum(0) - diag)
    return {"pixel_accuracy": float(diag.sum() / h.sum()), "class_accuracy": diag / h.sum(1),
            "iou": iou, "mean_iou": float(iou.mean())}
