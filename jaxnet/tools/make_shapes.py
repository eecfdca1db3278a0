"""Write a small dataset of shapes in COCO's detection format with a segmentation mask per
image beside it, for tests and the detection and segmentation quick starts (nothing is
downloaded: scikit-image draws the shapes and gives their boxes).

    python -m jaxnet.cli.make_shapes DIR --train 1000 --val 200

gives DIR/annotations/instances_{train,val}.json and DIR/{train,val}/*.jpg: images 96-160
pixels a side, each with 1-4 rectangles, circles, triangles and ellipses (COCO category ids
1-4) of 16-56 pixels on a tinted, noisy background. A shape may reach past the image's edge;
its box is then the part inside the image, as COCO annotates a cut-off object, so no box
needs the COCO source's clipping. DIR/masks/{train,val}/*.png give each pixel its class (0 the
background, 1-4 the shapes, as COCO's ids) and DIR/classes.txt their names: the image/mask
folder pair that data.source=masks reads (jaxnet/core/tasks/segmentation).
The annotation files are written last, each in one rename, so an interrupted run leaves no
dataset that looks complete.
"""

import json
import os
import time

import numpy as np
import simplejpeg
from PIL import Image

CATEGORIES = ("rectangle", "circle", "triangle", "ellipse")  # COCO ids 1..4, in this order


def shapes_image(rng: np.random.Generator, min_side: int = 96, max_side: int = 160, with_mask: bool = False):
  """One uint8 HxWx3 image and its [(category id, [x, y, w, h])], boxes inside the image;
  `with_mask`: and its uint8 HxW mask of category ids (0: background)."""
  from skimage.draw import random_shapes
  height, width = (int(v) for v in rng.integers(min_side, max_side + 1, size=2))
  # Shapes' colours stay below 255, so the untouched background is exactly the white pixels.
  image, labels = random_shapes((height, width), max_shapes=4, min_shapes=1, min_size=16, max_size=56,
                                intensity_range=((0, 254),), allow_overlap=False,
                                rng=int(rng.integers(2**31)))
  drawn = image
  background = np.all(image == 255, axis=-1)
  tint = rng.integers(150, 256, size=3)
  image = np.where(background[..., None], tint, image).astype(np.float32)
  image += rng.normal(0, 8, image.shape).astype(np.float32)
  # skimage's boxes bound the whole shape, also where it was drawn past the edge: keep the
  # part inside the image (a shape's centre is always inside, so none is left empty).
  boxes = []
  for name, ((r0, r1), (c0, c1)) in labels:
    r0, c0, r1, c1 = max(int(r0), 0), max(int(c0), 0), min(int(r1), height), min(int(c1), width)
    boxes.append((CATEGORIES.index(name) + 1, [c0, r0, c1 - c0, r1 - r0]))
  image = np.clip(image, 0, 255).astype(np.uint8)
  return (image, boxes, shapes_mask(drawn, background, boxes)) if with_mask else (image, boxes)


def shapes_mask(drawn, background, boxes) -> np.ndarray:
  """The category of each pixel of skimage's drawing: shapes do not overlap and each has one
  colour, so a colour's pixels are one shape, the one whose box fits them best."""
  mask = np.zeros(background.shape, np.uint8)
  colours, pixel_colour = np.unique(drawn.reshape(-1, drawn.shape[-1]), axis=0, return_inverse=True)
  pixel_colour = pixel_colour.reshape(background.shape)
  for k in range(len(colours)):
    where = (pixel_colour == k) & ~background
    if not where.any():
      continue
    rows, cols = np.nonzero(where)
    r0, r1, c0, c1 = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1

    def overlap(box):
      x, y, w, h = box
      inter = max(0, min(c1, x + w) - max(c0, x)) * max(0, min(r1, y + h) - max(r0, y))
      return inter / ((r1 - r0) * (c1 - c0) + w * h - inter)

    category, _ = max(boxes, key=lambda b: overlap(b[1]))
    mask[where] = category
  return mask


def make_shapes(root: str, train_images: int = 1000, val_images: int = 200, seed: int = 0,
                verbose: bool = True) -> str:
  """Generate the dataset and return `root`. Deterministic in `seed`."""
  rng = np.random.default_rng(seed)
  start = time.perf_counter()
  os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
  with open(os.path.join(root, "classes.txt"), "w") as f:
    f.write("\n".join(("background",) + CATEGORIES) + "\n")
  for split, count in (("train", train_images), ("val", val_images)):
    os.makedirs(os.path.join(root, split), exist_ok=True)
    os.makedirs(os.path.join(root, "masks", split), exist_ok=True)
    images, annotations = [], []
    for i in range(count):
      pixels, boxes, mask = shapes_image(rng, with_mask=True)
      name = f"{split}_{i:06d}.jpg"
      with open(os.path.join(root, split, name), "wb") as f:
        f.write(simplejpeg.encode_jpeg(pixels, quality=92, colorspace="RGB"))
      Image.fromarray(mask, mode="L").save(os.path.join(root, "masks", split, name.replace(".jpg", ".png")))
      image_id = i + 1
      images.append({"id": image_id, "file_name": name, "height": pixels.shape[0], "width": pixels.shape[1]})
      for category, box in boxes:
        annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": category,
                            "bbox": box, "area": box[2] * box[3], "iscrowd": 0})
    coco = {"images": images, "annotations": annotations,
            "categories": [{"id": k + 1, "name": n, "supercategory": "shape"} for k, n in enumerate(CATEGORIES)]}
    path = os.path.join(root, "annotations", f"instances_{split}.json")
    with open(path + ".tmp", "w") as f:
      json.dump(coco, f)
    os.replace(path + ".tmp", path)
    if verbose:
      print(f"{split}: {count} images, {len(annotations)} boxes ({time.perf_counter() - start:.1f}s)",
            flush=True)
  return root
