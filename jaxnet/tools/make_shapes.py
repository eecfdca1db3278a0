"""Write a small COCO-format detection dataset of shapes, for tests and the detection quick
start (nothing is downloaded: scikit-image draws the shapes and gives their boxes).

    python -m jaxnet.cli.make_shapes DIR --train 1000 --val 200

gives DIR/annotations/instances_{train,val}.json and DIR/{train,val}/*.jpg: images 96-160
pixels a side, each with 1-4 rectangles, circles, triangles and ellipses (COCO category ids
1-4) of 16-56 pixels on a tinted, noisy background. A shape may reach past the image's edge;
its box is then the part inside the image, as COCO annotates a cut-off object, so no box
needs the COCO source's clipping.
The annotation files are written last, each in one rename, so an interrupted run leaves no
dataset that looks complete.
"""

import json
import os
import time

import numpy as np
import simplejpeg

CATEGORIES = ("rectangle", "circle", "triangle", "ellipse")  # COCO ids 1..4, in this order


def shapes_image(rng: np.random.Generator, min_side: int = 96, max_side: int = 160):
  """One uint8 HxWx3 image and its [(category id, [x, y, w, h])], boxes inside the image."""
  from skimage.draw import random_shapes
  height, width = (int(v) for v in rng.integers(min_side, max_side + 1, size=2))
  # Shapes' colours stay below 255, so the untouched background is exactly the white pixels.
  image, labels = random_shapes((height, width), max_shapes=4, min_shapes=1, min_size=16, max_size=56,
                                intensity_range=((0, 254),), allow_overlap=False,
                                rng=int(rng.integers(2**31)))
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
  return np.clip(image, 0, 255).astype(np.uint8), boxes


def make_shapes(root: str, train_images: int = 1000, val_images: int = 200, seed: int = 0,
                verbose: bool = True) -> str:
  """Generate the dataset and return `root`. Deterministic in `seed`."""
  rng = np.random.default_rng(seed)
  start = time.perf_counter()
  os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
  for split, count in (("train", train_images), ("val", val_images)):
    os.makedirs(os.path.join(root, split), exist_ok=True)
    images, annotations = [], []
    for i in range(count):
      pixels, boxes = shapes_image(rng)
      name = f"{split}_{i:06d}.jpg"
      with open(os.path.join(root, split, name), "wb") as f:
        f.write(simplejpeg.encode_jpeg(pixels, quality=92, colorspace="RGB"))
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
