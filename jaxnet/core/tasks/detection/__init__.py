"""Object detection (RetinaNet's, Lin et al. 2017, as torchvision's `retinanet_resnet50_fpn`):
matching against the model's anchors (its `anchor_boxes`), the box encoding, the focal loss,
decoding and non-maximum suppression, and the task built from them (the loss for
steps.make_train_step, the eval outputs, COCO's mAP, a restored detector's boxes and their
drawing). Every shape is static: an image's ground-truth
boxes are padded to a fixed count with a mask, and the detections of an image are a fixed
number with scores (-inf where there is none), so the steps jit once and shard over the batch.

The batch (jaxnet/core/tasks/detection/coco.py) holds `image` uint8 NHWC, padded to one size, `boxes`
float32 (N, M, 4) as (x0, y0, x1, y1) in that image's pixels, `classes` int32 (N, M),
`box_mask` bool (N, M), and `mask` / `corrupt` per image as for classification.
"""

import importlib.util
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxnet.core.tasks.detection import coco
from jaxnet.core.errors import InvalidValueError
from jaxnet.core.metrics import write_file_atomically
from jaxnet.core.tasks import Task

# torchvision's RetinaNet defaults.
FOREGROUND_IOU, BACKGROUND_IOU = 0.5, 0.4
FOCAL_ALPHA, FOCAL_GAMMA = 0.25, 2.0
BOX_CLAMP = math.log(1000.0 / 16)  # the largest exp() argument decoding takes
SCORE_THRESHOLD, NMS_IOU = 0.05, 0.5


def box_iou(a, b):
  """(..., P, 4) x (..., Q, 4) -> (..., P, Q) intersection over union."""
  area = lambda x: (x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1])
  lt = jnp.maximum(a[..., :, None, :2], b[..., None, :, :2])
  rb = jnp.minimum(a[..., :, None, 2:], b[..., None, :, 2:])
  wh = jnp.clip(rb - lt, 0)
  inter = wh[..., 0] * wh[..., 1]
  return inter / jnp.maximum(area(a)[..., :, None] + area(b)[..., None, :] - inter, 1e-9)


def encode(boxes, anchors):
  """Boxes relative to their anchors: (dx, dy, dw, dh), torchvision's BoxCoder, weights 1."""
  aw, ah = anchors[..., 2] - anchors[..., 0], anchors[..., 3] - anchors[..., 1]
  ax, ay = anchors[..., 0] + 0.5 * aw, anchors[..., 1] + 0.5 * ah
  bw, bh = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
  bx, by = boxes[..., 0] + 0.5 * bw, boxes[..., 1] + 0.5 * bh
  return jnp.stack([(bx - ax) / aw, (by - ay) / ah, jnp.log(jnp.maximum(bw, 1e-6) / aw),
                    jnp.log(jnp.maximum(bh, 1e-6) / ah)], axis=-1)


def decode(deltas, anchors):
  """The inverse of `encode`, with dw and dh clamped at log(1000/16)."""
  aw, ah = anchors[..., 2] - anchors[..., 0], anchors[..., 3] - anchors[..., 1]
  ax, ay = anchors[..., 0] + 0.5 * aw, anchors[..., 1] + 0.5 * ah
  dx, dy = deltas[..., 0], deltas[..., 1]
  dw, dh = jnp.minimum(deltas[..., 2], BOX_CLAMP), jnp.minimum(deltas[..., 3], BOX_CLAMP)
  x, y, w, h = dx * aw + ax, dy * ah + ay, jnp.exp(dw) * aw, jnp.exp(dh) * ah
  return jnp.stack([x - 0.5 * w, y - 0.5 * h, x + 0.5 * w, y + 0.5 * h], axis=-1)


def match(anchors, boxes, box_mask):
  """Per anchor of one image: the index of its ground-truth box, -1 background, -2 ignored.

  IoU >= 0.5 is foreground, < 0.4 background, in between ignored; each box also keeps the
  anchors it overlaps best (torchvision's Matcher with allow_low_quality_matches: such an
  anchor takes its own best box, as there)."""
  iou = jnp.where(box_mask[:, None], box_iou(boxes, anchors), -1.0)  # (M, A)
  best_iou, best_box = jnp.max(iou, axis=0), jnp.argmax(iou, axis=0)
  matches = jnp.where(best_iou >= FOREGROUND_IOU, best_box,
                      jnp.where(best_iou < BACKGROUND_IOU, -1, -2))
  best_for_box = jnp.max(iou, axis=1, keepdims=True)  # (M, 1)
  low_quality = jnp.any((iou == best_for_box) & box_mask[:, None] & (best_for_box > 0), axis=0)
  return jnp.where(low_quality, best_box, matches)


def losses(cls_logits, box_deltas, anchors, boxes, classes, box_mask):
  """(focal classification loss, L1 box loss) of one image, each over its foreground count."""
  matches = match(anchors, boxes, box_mask)
  foreground = matches >= 0
  valid = matches != -2
  count = jnp.maximum(jnp.sum(foreground), 1).astype(jnp.float32)
  num_classes = cls_logits.shape[-1]
  labels = jnp.where(foreground, classes[jnp.maximum(matches, 0)], -1)
  targets = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)  # all zero for -1
  logits = cls_logits.astype(jnp.float32)
  p = jax.nn.sigmoid(logits)
  ce = optax.sigmoid_binary_cross_entropy(logits, targets)
  p_t = p * targets + (1 - p) * (1 - targets)
  focal = ce * (1 - p_t) ** FOCAL_GAMMA * (FOCAL_ALPHA * targets + (1 - FOCAL_ALPHA) * (1 - targets))
  cls = jnp.sum(focal * valid[:, None]) / count
  target_deltas = encode(boxes[jnp.maximum(matches, 0)], anchors)
  box = jnp.sum(jnp.abs(box_deltas.astype(jnp.float32) - target_deltas) * foreground[:, None]) / count
  return cls, box


def nms(boxes, scores, labels, iou_threshold: float, max_detections: int):
  """Class-aware greedy non-maximum suppression with static shapes (torchvision's
  batched_nms: boxes of different classes never suppress each other): the `max_detections`
  best boxes kept, scores -inf where fewer are kept.

  The boxes are visited best first; a box still kept suppresses the later ones it overlaps
  by more than `iou_threshold`. One row of IoUs per visit (memory O(n), not O(n^2)), and the
  loop ends at the first missing score or once `max_detections` boxes are kept. Fewer
  candidates than `max_detections` (a small detection.candidates_per_level, a small image)
  are padded with missing scores, so the output keeps its static shape."""
  if scores.shape[0] < max_detections:
    pad = max_detections - scores.shape[0]
    boxes = jnp.concatenate([boxes, jnp.zeros((pad, 4), boxes.dtype)])
    scores = jnp.concatenate([scores, jnp.full((pad,), -jnp.inf, scores.dtype)])
    labels = jnp.concatenate([labels, jnp.zeros((pad,), labels.dtype)])
  order = jnp.argsort(-scores)
  boxes, scores, labels = boxes[order], scores[order], labels[order]
  n = scores.shape[0]
  # Boxes of another class moved out of reach: no overlap across classes.
  shifted = boxes + ((jnp.max(boxes) + 1) * labels.astype(boxes.dtype))[:, None]
  later = lambda i: jnp.arange(n) > i

  def visit(carry):
    i, keep, kept = carry
    overlaps = box_iou(shifted[i][None], shifted)[0] > iou_threshold
    suppress = keep[i] & overlaps & later(i)
    return i + 1, keep & ~suppress, kept + keep[i]

  def more(carry):
    i, _, kept = carry
    return (i < n) & (kept < max_detections) & jnp.isfinite(scores[jnp.minimum(i, n - 1)])

  i, keep, _ = jax.lax.while_loop(more, visit, (0, jnp.isfinite(scores), 0))
  keep = keep & ~later(i - 1)  # boxes never visited are not kept
  top_scores, top = jax.lax.top_k(jnp.where(keep, scores, -jnp.inf), max_detections)
  return boxes[top], top_scores, labels[top]


def detect(cls_logits, box_deltas, anchors, level_counts, image_size: int, *,
           candidates_per_level: int = 1000, max_detections: int = 300):
  """One image's detections: per level the best `candidates_per_level` (anchor, class) scores
  above 0.05, decoded and clipped to the image, then NMS (IoU 0.5) over all levels.
  Returns (boxes (D, 4), scores (D,), classes (D,)), scores -inf in unused rows."""
  num_classes = cls_logits.shape[-1]
  boxes_all, scores_all, labels_all = [], [], []
  start = 0
  for count in level_counts:
    logits = cls_logits[start:start + count].astype(jnp.float32).reshape(-1)
    scores = jax.nn.sigmoid(logits)
    scores = jnp.where(scores > SCORE_THRESHOLD, scores, -jnp.inf)
    k = min(candidates_per_level, logits.shape[0])
    top_scores, top = jax.lax.top_k(scores, k)
    anchor = top // num_classes + start
    boxes = jnp.clip(decode(box_deltas[anchor].astype(jnp.float32), anchors[anchor]), 0, image_size)
    boxes_all.append(boxes)
    scores_all.append(top_scores)
    labels_all.append(top % num_classes)
    start += count
  return nms(jnp.concatenate(boxes_all), jnp.concatenate(scores_all), jnp.concatenate(labels_all),
             NMS_IOU, max_detections)


def check_config(config) -> None:
  """What detection does not build (yet), refused before anything runs."""
  refused = {"ema_decay": config.ema_decay > 0, "label_smoothing": config.label_smoothing > 0,
             "grad_accum_steps": config.grad_accum_steps != 1,
             "mix.mixup_alpha": config.mix.mixup_alpha > 0, "mix.cutmix_alpha": config.mix.cutmix_alpha > 0,
             "data.randaug_num_ops": config.data.randaug_num_ops > 0}
  for key, on in refused.items():
    if on:
      raise InvalidValueError(f"config.{key} is not built for detection (data.source=coco): "
                              f"leave it at its default")
  if importlib.util.find_spec("pycocotools") is None:
    raise InvalidValueError("a detection run scores its evals with pycocotools, which is not "
                            "installed: pip install -e '.[detection]'")
  if config.detection.max_boxes < 1 or config.detection.max_detections < 1:
    raise InvalidValueError("config.detection.max_boxes and max_detections must be at least 1")


# A small image is drawn magnified, by a whole factor up to this shorter side, so that the
# labels (a fixed 14 px font) neither hide its objects nor run into one another.
DRAW_MIN_SIDE = 512
_LABEL_FONT_PX = 14
_PALETTE = ((0.9, 0.1, 0.1), (0.1, 0.6, 0.1), (0.1, 0.3, 0.9), (0.9, 0.6, 0.0), (0.6, 0.1, 0.7))


def draw_scale(width: int, height: int) -> int:
  """The whole factor draw_detections magnifies a width x height image by (1: none)."""
  return max(1, -(-DRAW_MIN_SIDE // min(width, height)))


def draw_detections(image, detections, path: str) -> None:
  """Writes `image` (a PIL image) with `detections` (a restored detector's result for it)
  drawn, as PNG at `path`, whole or not at all: magnified by draw_scale (pixels kept square,
  nearest-neighbour), each box with its label on a band of its colour above it."""
  from PIL import Image, ImageDraw, ImageFont
  picture = image.convert("RGB")
  scale = draw_scale(*picture.size)
  if scale > 1:
    picture = picture.resize((picture.width * scale, picture.height * scale), Image.NEAREST)
  try:
    font = ImageFont.load_default(size=_LABEL_FONT_PX)
  except TypeError:  # Pillow < 10.1: its one bitmap font, ~11 px
    font = ImageFont.load_default()
  pen = ImageDraw.Draw(picture)
  for k, (name, score, box) in enumerate(detections):
    colour = tuple(int(255 * c) for c in _PALETTE[k % len(_PALETTE)])
    x0, y0, x1, y1 = (float(v) * scale for v in box)
    pen.rectangle((x0, y0, x1, y1), outline=colour, width=3)
    text = f"{name} {score:.2f}"
    left, top, right, bottom = pen.textbbox((0, 0), text, font=font)
    height = bottom - top + 4
    y = y0 - height if y0 >= height else y0  # above the box where there is room
    pen.rectangle((x0, y, x0 + right - left + 6, y + height), fill=colour)
    pen.text((x0 + 3, y + 2 - top), text, fill=(255, 255, 255), font=font)
  write_file_atomically(path, lambda tmp: picture.save(tmp, format="PNG"))


def detection_loss(model):
  """The task's loss for steps.make_train_step: per image the focal loss and the L1 box loss,
  each over its foreground anchors (the model's: `anchor_boxes`), summed over the batch's real
  images (the step divides by their count: the mean over images, masked-out ones counting for
  nothing)."""

  def loss(apply, batch, key):
    out = apply(batch["image"])
    anchor_boxes = jnp.asarray(model.anchor_boxes(batch["image"].shape[1], out["levels"])[0])
    cls, box = jax.vmap(losses, in_axes=(0, 0, None, 0, 0, 0))(
        out["cls"], out["box"], anchor_boxes, batch["boxes"], batch["classes"], batch["box_mask"])
    weight = batch["mask"].astype(jnp.float32)
    cls, box = jnp.sum(cls * weight), jnp.sum(box * weight)
    return cls + box, {"train/classification_loss": cls, "train/box_loss": box}

  return loss


def detections(model, *, max_detections: int = 300, candidates_per_level: int = 1000):
  """`outputs(apply, images) -> (boxes, scores, classes)` for steps.make_predict_fn: per uint8
  NHWC image (resized and padded as the eval data) `max_detections` boxes in its pixels, their
  scores (-inf in unused rows) and classes. The eval step and a restored detector both run it."""

  def outputs(apply, images):
    out = apply(images)
    image_size = images.shape[1]
    anchor_boxes, counts = model.anchor_boxes(image_size, out["levels"])
    return jax.vmap(lambda c, b: detect(c, b, jnp.asarray(anchor_boxes), counts, image_size,
                                        candidates_per_level=candidates_per_level,
                                        max_detections=max_detections))(out["cls"], out["box"])

  return outputs


class Detection(Task):
  def add_config(self, c) -> None:
    # Object detection (data.source=coco, a retinanet_* model).
    c.detection = ml_collections.ConfigDict()
    c.detection.max_boxes = 100      # ground-truth boxes per image the batch holds (more: the first)
    c.detection.scale_jitter = (1.0, 1.0)  # train: the resize's random factor, (low, high)
    c.detection.max_detections = 300  # per image, after NMS: torchvision RetinaNet's detections_per_img
                                     # (COCO's AP counts the best 100 of them)
    c.detection.candidates_per_level = 1000  # best scores per pyramid level that reach NMS

  def check_config(self, config) -> None:
    check_config(config)

  def make_source(self, config, split: str):
    data, options = config.data, dict(max_boxes=config.detection.max_boxes,
                                       scale_jitter=config.detection.scale_jitter)
    split_name = data.train_split if split == "train" else data.eval_split
    if data.source == "synthetic":  # random boxes on random images: throughput and the GPU plan
      size = data.synthetic_size if split == "train" else max(data.synthetic_size // 10, 1)
      return coco.SyntheticDetections(size, config.image_size, data.num_classes, options["max_boxes"],
                                      seed=0 if split == "train" else 1)
    if data.source == "tfds":  # coco/2017 and datasets laid out like it
      return coco.TfdsDetections(data.name, split_name, data.dir or None, **options)
    return coco.CocoSource(data.dir, split_name, **options)

  def transform(self, source, image_size: int, train: bool, config):
    return source.transform(image_size, train=train)  # boxes move with the pixels

  def batch_fields(self, config) -> dict:  # jaxnet/core/tasks/detection/coco.py: example
    boxes = config.detection.max_boxes
    return {"boxes": ((boxes, 4), "float32"), "classes": ((boxes,), "int32"),
            "box_mask": ((boxes,), "bool"), "image_id": ((), "int32"), "scale": ((), "float32"),
            "source_size": ((2,), "int32")}

  def loss(self, model, config, num_classes: int, batch_devices: int = 1):
    return detection_loss(model)

  def eval_outputs(self, model, config, num_classes: int):
    """The detections (in the batch's padded images' pixels) with the batch's image_id, scale
    and mask, for the COCO evaluation on the host (`evaluate`)."""
    detect_batch = self.predict_outputs(model, config)

    def outputs(apply, batch):
      boxes, scores, classes = detect_batch(apply, batch["image"])
      return {"boxes": boxes, "scores": scores, "classes": classes, "image_id": batch["image_id"],
              "scale": batch["scale"], "source_size": batch["source_size"], "mask": batch["mask"]}

    return outputs

  def evaluate(self, outputs, eval_source) -> dict:
    found = []
    for out in outputs:
      out = jax.device_get(out)
      for k in np.flatnonzero(out["mask"]):
        boxes = coco.to_source_pixels(out["boxes"][k], out["scale"][k], out["source_size"][k])
        found.append({"image_id": out["image_id"][k], "boxes": boxes,
                      "scores": out["scores"][k], "classes": out["classes"][k]})
    return {**coco.evaluate(eval_source, found), "eval/examples": len(found)}

  def describe(self, metrics: dict) -> str:
    return (f"mAP {metrics['eval/mAP']:.4f}  AP50 {metrics['eval/AP50']:.4f}  "
            f"AP75 {metrics['eval/AP75']:.4f}")

  def predict_outputs(self, model, config):
    return detections(model, max_detections=config.detection.max_detections,
                      candidates_per_level=config.detection.candidates_per_level)

  def preprocess(self, data: bytes, config, channels: int) -> dict:
    """The eval data's resize and padding (jaxnet/core/tasks/detection/coco.py), with each image's scale
    from its own pixels to the batch's and its (height, width)."""
    transform = coco.DetectionTransform(config.image_size, 1, train=False, warn=False)
    return transform.map({"image": data, "boxes": np.zeros((0, 4), np.float32),
                          "classes": np.zeros((0,), np.int32), "image_id": 0, "path": ""})

  def postprocess(self, outputs, examples, class_names, min_score: float = 0.3, **unused) -> list:
    """Per image [(class name, score, (x0, y0, x1, y1) in the image's pixels)], best first,
    those scoring at least `min_score` (an image given as the eval input itself: in its pixels)."""
    boxes, scores, classes = outputs
    in_image = [coco.to_source_pixels(boxes[i], e.get("scale", 1.0), e.get("source_size", e["image"].shape[:2]))
                for i, e in enumerate(examples)]
    return [[(class_names[c], float(s), tuple(float(v) for v in b))
             for b, s, c in zip(in_image[i], scores[i], classes[i]) if s >= min_score] for i in range(len(examples))]

  def lines(self, path, result) -> list[str]:
    return [f"{path}: {len(result)} detections"] + [
        f"  {score:8.4f}  {name:<16} {' '.join(f'{v:7.1f}' for v in box)}" for name, score, box in result]

  def draw(self, image, result, path: str) -> None:
    draw_detections(image, result, path)


TASK = Detection(name="detection", headline="eval/mAP", headline_label="eval mAP", exports=("onnx", "torch"),
                 plots=(("mAP", "COCO box AP", (("eval/mAP", "o--", "mAP"), ("eval/AP50", "o:", "AP50"))),),
                 eval_keys=("detection.",), source_keys=("detection.",),
                 # coco: DIR/annotations/instances_SPLIT.json and DIR/SPLIT/; tfds: datasets laid
                 # out as coco/2017; synthetic: random boxes on random images
                 sources=("coco", "tfds", "synthetic"))
