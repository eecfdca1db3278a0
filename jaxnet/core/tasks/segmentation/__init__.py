"""Semantic segmentation: a class per pixel (FCN and DeepLabV3, jaxnet/core/models/segmentation.py).

  data.py        the sources: Pascal VOC's folders, or a plain image/mask folder pair, checked
  transforms.py  image and mask moved together (random scale, crop, flip; eval's whole image)
  metrics.py     the confusion matrix and torchvision's scores from it (mean IoU, ...)

The model returns {"out": logits (N, H, W, classes) at the input's size, and "aux": the same
from its auxiliary head when model.aux_loss is on}. The loss is the per-pixel cross-entropy
averaged over all the batch's pixels whose label is not the ignore label (torchvision's
reference criterion), plus segmentation.aux_weight times the same of "aux" (its recipe: 0.5). Eval sums
one confusion matrix over the whole eval set, a restored model gives each image's class map at
the image's own size, and predict draws it over the image and saves it as a palette PNG.
"""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from PIL import Image

from jaxnet.core.errors import InvalidValueError
from jaxnet.core.metrics import write_file_atomically
from jaxnet.core.tasks import Task
from jaxnet.core.tasks.segmentation import data, metrics
from jaxnet.core.tasks.segmentation.transforms import SegmentationTransform


def pixel_sums(logits, labels, valid):
  """(the cross-entropy summed over the `valid` pixels, how many of them are right): scalars."""
  logits = logits.astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(valid, labels, 0).astype(jnp.int32))
  weight = valid.astype(jnp.float32)
  return jnp.sum(ce * weight), jnp.sum((jnp.argmax(logits, -1) == labels) * weight)


def segmentation_loss(num_classes: int, ignore_label: int, aux_weight: float):
  """The task's loss for steps.make_train_step, as torchvision's reference criterion: the
  cross-entropy of "out" averaged over every valid pixel of the batch (those of its real
  images whose label is a class: not the ignore label), plus aux_weight times the same of "aux"
  when the model has it. The step divides what this returns by the batch's real image count,
  so it returns that mean times the count; train/pixel_accuracy and train/aux_loss likewise.
  The whole batch under jit (any number of devices) is one mean; with grad_accum_steps K each
  micro-batch is its own mean, and the step averages the K of them (weighted by their real
  images: equal weights unless examples are masked out)."""

  def loss(apply, batch, key):
    out = apply(batch["image"])
    labels = batch["labels"].astype(jnp.int32)
    real = batch["mask"]
    valid = (labels != ignore_label) & (labels < num_classes) & real[:, None, None]
    # n / pixels: the step's division by n then leaves the mean over the pixels.
    per_pixel = jnp.sum(real.astype(jnp.float32)) / jnp.maximum(jnp.sum(valid.astype(jnp.float32)), 1.0)
    main, right = pixel_sums(out["out"], labels, valid)
    total, metrics_ = main, {"train/pixel_accuracy": right * per_pixel}
    if "aux" in out:
      aux = pixel_sums(out["aux"], labels, valid)[0]
      total = main + aux_weight * aux
      metrics_["train/aux_loss"] = aux * per_pixel
    return total * per_pixel, metrics_

  return loss


# Pascal VOC's colour map (class k's colour from the bits of k), extended to any class count.
def palette(n: int = 256) -> np.ndarray:
  colours = np.zeros((n, 3), np.uint8)
  for k in range(n):
    c, r, g, b = k, 0, 0, 0
    for shift in range(7, -1, -1):
      r |= (c & 1) << shift
      g |= ((c >> 1) & 1) << shift
      b |= ((c >> 2) & 1) << shift
      c >>= 3
    colours[k] = (r, g, b)
  return colours


def mask_path(path: str) -> str:
  """Where predict's --draw saves an image's class map, beside the drawing at `path`."""
  return os.path.splitext(path)[0] + ".mask.png"


def draw_mask(image, result, path: str, alpha: float = 0.5) -> None:
  """Writes `image` (PIL) with its class map coloured over it (alpha 0.5; class 0, the
  background, left clear) as PNG at `path`, and the class map as a palette PNG beside it
  (`mask_path`), each whole or not at all."""
  classes = result["mask"]
  picture = np.asarray(image.convert("RGB"), np.float32)
  colours = palette()[classes].astype(np.float32)
  shown = (classes > 0)[..., None]
  blended = np.where(shown, (1 - alpha) * picture + alpha * colours, picture)
  drawn = Image.fromarray(np.clip(np.round(blended), 0, 255).astype(np.uint8))
  write_file_atomically(path, lambda tmp: drawn.save(tmp, format="PNG"))
  saved = Image.fromarray(classes.astype(np.uint8), mode="P")
  saved.putpalette(palette().ravel().tolist())
  write_file_atomically(mask_path(path), lambda tmp: saved.save(tmp, format="PNG"))


class Segmentation(Task):
  def add_config(self, c) -> None:
    # Semantic segmentation (data.source=voc or masks, an fcn_* or deeplabv3_* model).
    c.segmentation = ml_collections.ConfigDict()
    c.segmentation.ignore_label = 255      # the mask value that counts nowhere (loss, metrics): VOC's
                                           # object borders and padding
    c.segmentation.aux_weight = 0.5        # the auxiliary head's loss weight (model.aux_loss on),
                                           # torchvision's reference recipe
    c.segmentation.scale_range = (0.5, 2.0)  # train: the random factor on the resize to image_size
                                           # (longer side), (low, high); then a random crop
    c.segmentation.image_folder = "{split}"       # data.source=masks: DIR/this holds a split's images
    c.segmentation.mask_folder = "masks/{split}"  # and DIR/this its masks (NAME.png per image NAME.*)

  def check_config(self, config) -> None:
    # data.source and data.loader: Task.check_data, from `sources` and `loaders`.
    moves_the_image_only = "it would change the image but not its mask"
    refused = {"label_smoothing": (config.label_smoothing > 0, "it smooths one label per image"),
               "mix.mixup_alpha": (config.mix.mixup_alpha > 0, moves_the_image_only),
               "mix.cutmix_alpha": (config.mix.cutmix_alpha > 0, moves_the_image_only),
               "data.randaug_num_ops": (config.data.randaug_num_ops > 0, moves_the_image_only)}
    for key, (on, why) in refused.items():
      if on:
        raise InvalidValueError(f"config.{key} is not built for segmentation ({why}): leave it at its default")

  def make_source(self, config, split: str):
    d, s = config.data, config.segmentation
    split_name = d.train_split if split == "train" else d.eval_split
    if d.source == "synthetic":  # random images and masks: throughput and the GPU plan
      size = d.synthetic_size if split == "train" else max(d.synthetic_size // 10, 1)
      return data.SyntheticMasks(size, config.image_size, d.num_classes, seed=0 if split == "train" else 1)
    if d.source == "voc":
      return data.voc_source(d.dir, split_name, s.ignore_label)
    return data.folder_source(d.dir, split_name, s.image_folder, s.mask_folder, s.ignore_label)

  def transform(self, source, image_size: int, train: bool, config):
    s = config.segmentation
    return SegmentationTransform(image_size, train, s.scale_range if train else (1.0, 1.0), s.ignore_label)

  def batch_fields(self, config) -> dict:  # transforms.example
    size = config.image_size
    return {"labels": ((size, size), "uint8"), "scale": ((), "float32"), "source_size": ((2,), "int32")}

  def loss(self, model, config, num_classes: int, batch_devices: int = 1):
    return segmentation_loss(num_classes, config.segmentation.ignore_label, config.segmentation.aux_weight)

  def eval_outputs(self, model, config, num_classes: int):
    """The batch's confusion matrix over its real images' labelled pixels, the cross-entropy
    summed over those pixels, and their count."""
    ignore = config.segmentation.ignore_label

    def outputs(apply, batch):
      logits = apply(batch["image"])["out"]
      labels = batch["labels"].astype(jnp.int32)
      valid = (labels != ignore) & (labels < num_classes) & batch["mask"][:, None, None]
      return {"confusion": metrics.confusion(labels, jnp.argmax(logits, -1), valid, num_classes),
              "loss": pixel_sums(logits, labels, valid)[0], "pixels": jnp.sum(valid.astype(jnp.int32)),
              "count": jnp.sum(batch["mask"].astype(jnp.int32))}

    return outputs

  def evaluate(self, outputs, eval_source) -> dict:
    matrix, loss, pixels, count = None, 0.0, 0, 0
    for out in outputs:
      out = jax.device_get(out)
      confusion = np.asarray(out["confusion"], np.int64)
      matrix = confusion if matrix is None else matrix + confusion
      loss, pixels, count = loss + float(out["loss"]), pixels + int(out["pixels"]), count + int(out["count"])
    s = metrics.scores(matrix)
    names = list(getattr(eval_source, "class_names", None) or [])
    names += [str(k) for k in range(len(names), len(s["iou"]))]
    per_class = {f"eval/IoU/{name}": float(v) for name, v in zip(names, s["iou"])}
    return {"eval/mIoU": s["mean_iou"], "eval/pixel_accuracy": s["pixel_accuracy"],
            "eval/loss": loss / max(pixels, 1), **per_class, "eval/examples": count}

  def describe(self, metrics_: dict) -> str:
    line = (f"mIoU {metrics_['eval/mIoU']:.4f}  pixel acc {metrics_['eval/pixel_accuracy']:.4f}  "
            f"loss {metrics_['eval/loss']:.4f}")
    absent = [k.removeprefix("eval/IoU/") for k, v in metrics_.items() if k.startswith("eval/IoU/") and v != v]
    if absent:  # torchvision's mean is no nanmean: say why it is nan
      line += f"  (no pixel of {', '.join(absent)} in the truth or the predictions: its IoU, and the mean, is nan)"
    return line

  def describe_train(self, metrics_: dict) -> str:
    return f"pixel acc {metrics_['train/pixel_accuracy']:.3f}"

  def predict_outputs(self, model, config):
    """Each image's class map, int32 (N, H, W) at the input's size."""
    return lambda apply, images: jnp.argmax(apply(images)["out"], -1).astype(jnp.int32)

  def preprocess(self, data_: bytes, config, channels: int) -> dict:
    """Eval's resize and padding, with the scale and the image's (height, width)."""
    transform = SegmentationTransform(config.image_size, False, ignore_label=config.segmentation.ignore_label,
                                      warn=False)
    return transform.map({"image": data_, "mask_png": None, "path": ""})

  def postprocess(self, outputs, examples, class_names, **unused) -> list:
    """Per image {"mask": uint8 (H, W) class ids at the image's own size, "classes": [(class
    name, fraction of the pixels)] largest first}."""
    results = []
    for classes, e in zip(np.asarray(outputs), examples):
      height, width = (int(v) for v in e.get("source_size", classes.shape))
      scale = float(e.get("scale", 1.0))
      shown = classes[:max(1, round(height * scale)), :max(1, round(width * scale))].astype(np.uint8)
      if shown.shape != (height, width):  # back to the image's pixels
        shown = np.asarray(Image.fromarray(shown).resize((width, height), Image.Resampling.NEAREST))
      counts = np.bincount(shown.ravel(), minlength=len(class_names or ()))
      names = list(class_names or []) + [str(k) for k in range(len(class_names or ()), len(counts))]
      order = [int(k) for k in np.argsort(-counts, kind="stable") if counts[k]]
      results.append({"mask": shown, "classes": [(names[k], float(counts[k] / shown.size)) for k in order]})
    return results

  def lines(self, path, result) -> list[str]:
    height, width = result["mask"].shape
    return [f"{path}: {width}x{height}, {len(result['classes'])} classes"] + [
        f"  {fraction:8.4f}  {name}" for name, fraction in result["classes"]]

  def draw(self, image, result, path: str) -> None:
    draw_mask(image, result, path)


TASK = Segmentation(
    name="segmentation", headline="eval/mIoU", headline_label="eval mIoU", exports=("jax", "onnx", "torch", "int8"),
    plots=(("mIoU", "mean IoU, pixel accuracy", (("eval/mIoU", "o--", "mIoU"),
                                                 ("eval/pixel_accuracy", "o:", "pixel accuracy"))),),
    eval_keys=("segmentation.ignore_label",), sources=("voc", "masks", "synthetic"),
    source_keys=("segmentation.ignore_label", "segmentation.image_folder", "segmentation.mask_folder"),
    rules=(("segmentation.ignore_label", lambda v: 0 <= v <= 255, "in [0, 255] (masks are 8-bit)"),
           ("segmentation.aux_weight", lambda v: v >= 0, ">= 0"),
           ("segmentation.scale_range", lambda v: len(v) == 2 and 0 < v[0] <= v[1], "(low, high), 0 < low <= high")))
