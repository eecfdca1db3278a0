"""Crop geometry, decoding and the Grain decode+crop transforms."""

import io
import math

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from jaxnet.core.data import decode, transforms
from jaxnet.core.data.transforms import (CorruptImageError, EvalDecodeCrop, TrainDecodeCrop,
                                    decode_jpeg, eval_crop_geometry, random_resized_crop_box)

AREA, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


def jpeg_bytes(pixels: np.ndarray, quality: int = 95, mode: str | None = None, **save_options) -> bytes:
  buffer = io.BytesIO()
  image = Image.fromarray(pixels)
  (image.convert(mode) if mode else image).save(buffer, format="JPEG", quality=quality, **save_options)
  return buffer.getvalue()


def smooth_image(height: int, width: int) -> np.ndarray:
  """Low-frequency colour gradients: resamplers agree closely on these."""
  ys, xs = np.mgrid[:height, :width]
  return np.stack([255 * xs / width, 255 * ys / height,
                   127 + 100 * np.sin(xs / 60.0) * np.cos(ys / 45.0)],
                  axis=-1).astype(np.uint8)


# --- random_resized_crop_box ------------------------------------------------

@pytest.mark.parametrize("height,width", [(375, 500), (500, 375), (224, 224), (33, 47)])
def test_random_crops_inside_image_and_within_bounds(height, width):
  rng = np.random.default_rng(0)
  fallback = transforms._center_box_with_ratio(height, width, RATIO)
  random_crops = 0
  for _ in range(2000):
    top, left, h, w = box = random_resized_crop_box(rng, height, width)
    assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
    assert h >= 1 and w >= 1
    if box == fallback:
      continue
    random_crops += 1
    # h, w are rounded from the exact sizes: allow half a pixel each way.
    area = height * width
    assert (w + 0.5) * (h + 0.5) >= AREA[0] * area
    assert (w - 0.5) * (h - 0.5) <= AREA[1] * area
    assert (w + 0.5) / (h - 0.5) >= RATIO[0]
    assert (w - 0.5) / (h + 0.5) <= RATIO[1]
  # Ten attempts almost always find a fitting crop on ordinary shapes.
  assert random_crops >= 1900


def test_random_crops_cover_the_ranges():
  rng = np.random.default_rng(1)
  boxes = np.array([random_resized_crop_box(rng, 1000, 1000) for _ in range(3000)])
  fractions = boxes[:, 2] * boxes[:, 3] / 1e6
  log_aspect = np.log(boxes[:, 3] / boxes[:, 2])
  assert fractions.min() < 0.1 and fractions.max() > 0.9
  assert log_aspect.min() < math.log(0.8) and log_aspect.max() > math.log(1.25)
  # Aspect is log-uniform: symmetric around 0 in log space.
  assert abs(np.median(log_aspect)) < 0.03
  # Positions are spread over the image, not pinned to a corner.
  assert boxes[:, 0].max() > 600 and boxes[:, 1].max() > 600


def test_fallback_is_center_crop_clamped_to_ratio():
  rng = np.random.default_rng(0)
  # 50 px wide: any crop with aspect >= 3/4 and >= 8% area would be
  # wider than the image, so every draw falls back.
  boxes = {random_resized_crop_box(rng, 1000, 50) for _ in range(50)}
  assert boxes == {((1000 - 67) // 2, 0, 67, 50)}  # h = round(50 / (3/4))
  assert random_resized_crop_box(rng, 50, 1000, attempts=0) == (0, (1000 - 67) // 2, 50, 67)
  # In-range aspect with no attempts: the whole image.
  assert random_resized_crop_box(rng, 375, 500, attempts=0) == (0, 0, 375, 500)


def test_eval_geometry_is_resize_256_then_center_crop_224():
  # 375x500: the shorter side becomes 256, the longer int(256 * 500 / 375) = 341;
  # the crop starts at round(32 / 2) = 16 and round(117 / 2) = round(58.5) = 58 (half to even).
  assert eval_crop_geometry(375, 500, 224) == ((256, 341), (16, 58))
  assert eval_crop_geometry(500, 375, 224) == ((341, 256), (58, 16))
  assert eval_crop_geometry(100, 100, 64, crop_fraction=1.0) == ((64, 64), (0, 0))
  # timm's crop_pct 0.95 at 224: floor(224 / 0.95) = 235.
  assert eval_crop_geometry(300, 300, 224, crop_fraction=0.95) == ((235, 235), (6, 6))
  with pytest.raises(ValueError, match="eval_crop_fraction"):
    eval_crop_geometry(300, 300, 224, crop_fraction=1.5)


# --- decode_jpeg ------------------------------------------------------------

def test_decode_rgb_gray_cmyk_and_png():
  pixels = smooth_image(120, 160)
  rgb = decode_jpeg(jpeg_bytes(pixels))
  assert rgb.shape == (120, 160, 3) and rgb.dtype == np.uint8
  assert np.abs(rgb.astype(int) - pixels).mean() < 3

  gray = decode_jpeg(jpeg_bytes(pixels[..., 0]))
  assert gray.shape == (120, 160, 3)
  assert np.array_equal(gray[..., 0], gray[..., 1])

  cmyk = decode_jpeg(jpeg_bytes(pixels, mode="CMYK"))
  assert cmyk.shape == (120, 160, 3)
  assert np.abs(cmyk.astype(int) - pixels).mean() < 4

  png = io.BytesIO()
  Image.fromarray(pixels).save(png, format="PNG")
  assert np.array_equal(decode_jpeg(png.getvalue()), pixels)  # PIL fallback, lossless


@pytest.mark.parametrize("data", [b"", b"not an image at all",
                                  np.random.default_rng(0).bytes(5000)])
def test_decode_garbage_raises_corrupt(data):
  with pytest.raises(CorruptImageError):
    decode_jpeg(data)


def test_decode_truncated_raises_corrupt():
  data = jpeg_bytes(np.random.default_rng(0).integers(0, 255, (200, 300, 3), np.uint8))
  with pytest.raises(CorruptImageError, match="truncated|Premature"):
    decode_jpeg(data[: len(data) // 2])


def test_reduced_scale_decode_uses_power_of_two_factors():
  data = jpeg_bytes(smooth_image(1200, 1600))
  assert decode_jpeg(data).shape == (1200, 1600, 3)
  assert decode_jpeg(data, 600, 800).shape == (600, 800, 3)  # exactly 1/2
  assert decode_jpeg(data, 601, 1).shape == (1200, 1600, 3)  # 1/2 is too small
  assert decode_jpeg(data, 140, 190).shape == (150, 200, 3)  # 1/8
  assert decode_jpeg(data, 200, None).shape == (300, 400, 3)  # 1/4, not 5/32 etc.
  # The reduced decode is a faithful downscale of the full one.
  full = Image.fromarray(decode_jpeg(data)).resize((400, 300), Image.Resampling.BOX)
  quarter = decode_jpeg(data, 300, 400)
  assert np.abs(quarter.astype(int) - np.asarray(full)).mean() < 2


# --- Grain transforms -------------------------------------------------------

def test_train_output_contract():
  data = jpeg_bytes(smooth_image(375, 500))
  out = TrainDecodeCrop(64).random_map({"image": data, "label": 7}, np.random.default_rng(0))
  assert set(out) == {"image", "label", "mask", "corrupt"}
  assert out["image"].shape == (64, 64, 3) and out["image"].dtype == np.uint8
  assert out["label"] == 7 and out["label"].dtype == np.int32
  assert out["mask"].dtype == np.bool_ and bool(out["mask"])
  assert out["corrupt"].dtype == np.int32 and out["corrupt"] == 0


def test_train_crops_differ_across_rngs():
  data = jpeg_bytes(smooth_image(375, 500))
  op = TrainDecodeCrop(32)
  images = [op.random_map({"image": data, "label": 0}, np.random.default_rng(s))["image"]
            for s in range(5)]
  assert all(not np.array_equal(images[0], other) for other in images[1:])


needs_region_decoder = pytest.mark.skipif(
    decode._jpeg_region is None,
    reason="jaxnet.core.data._jpeg_region not built (no C compiler or libjpeg-turbo headers)")


@pytest.fixture(params=["region", "full"])
def decode_path(request, monkeypatch):
  """Runs a test through the C region decoder and through the full-decode fallback."""
  if request.param == "region" and decode._jpeg_region is None:
    pytest.skip("jaxnet.core.data._jpeg_region not built")
  if request.param == "full":
    monkeypatch.setattr(decode, "_jpeg_region", None)
  return request.param


def test_reduced_scale_train_crop_matches_full_decode(decode_path, monkeypatch):
  """A big image and a small output take the reduced decode path; the result
  must have the right size and match a full-resolution crop + resize."""
  data = jpeg_bytes(smooth_image(1200, 1600))
  scales = []  # the DCT scale of each decode: 1 / scales[i]
  real_decode = simplejpeg.decode_jpeg
  if decode_path == "region":
    real_region = decode._jpeg_region.decode_region

    def spy(data, top, left, h, w, scale_denom, fast_dct):
      scales.append(scale_denom)
      return real_region(data, top, left, h, w, scale_denom, fast_dct)
    monkeypatch.setattr(decode, "_jpeg_region", type("Spy", (), {"decode_region": staticmethod(spy)}))
  else:
    def spy(*args, **kwargs):
      out = real_decode(*args, **kwargs)
      scales.append(1200 // out.shape[0])
      return out
    monkeypatch.setattr(decode.simplejpeg, "decode_jpeg", spy)
  op = TrainDecodeCrop(64)
  for seed in range(10):
    out = op.random_map({"image": data, "label": 0}, np.random.default_rng(seed))["image"]
    assert out.shape == (64, 64, 3)
    # Same draws as the transform: box, then flip.
    rng = np.random.default_rng(seed)
    top, left, h, w = random_resized_crop_box(rng, 1200, 1600)
    reference = Image.fromarray(real_decode(data)).resize(
        (64, 64), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    reference = np.asarray(reference)
    if rng.random() < 0.5:
      reference = reference[:, ::-1]
    assert np.abs(out.astype(int) - reference).mean() < 3
  # Crops of >= 8% of 1600x1200 are >= ~300 px: every decode was reduced.
  assert len(scales) == 10 and all(scale >= 2 for scale in scales), scales


@needs_region_decoder
@pytest.mark.parametrize("variant", [
    {},  # 4:2:0, as most camera and web JPEGs
    {"subsampling": 0},  # 4:4:4
    {"subsampling": 1},  # 4:2:2
    {"progressive": True},
    {"mode": "L"},  # greyscale, decoded to RGB
], ids=["420", "444", "422", "progressive", "grey"])
@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_region_decode_equals_crop_of_full_decode(variant, scale):
  # Odd sizes and offsets off the 8/16-pixel block grid on purpose.
  data = jpeg_bytes(np.random.default_rng(1).integers(0, 255, (301, 457, 3), np.uint8), **variant)
  full = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=-(-301 // scale),
                                min_width=-(-457 // scale))
  height, width = full.shape[:2]
  rng = np.random.default_rng(scale)
  boxes = [(0, 0, height, width), (height - 1, width - 1, 1, 1)]
  for _ in range(20):
    h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
    boxes.append((int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w))
  for top, left, h, w in boxes:
    for fast in (False, True):
      rows = decode._jpeg_region.decode_region(data, top, left, h, w, scale, fast)
      region = np.frombuffer(rows, np.uint8).reshape(h, w, 3)
      reference = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=fast,
                                         min_height=height, min_width=width)
      np.testing.assert_array_equal(region, reference[top:top + h, left:left + w])


@needs_region_decoder
def test_region_and_full_decode_paths_give_identical_images(monkeypatch):
  # Sizes not divisible by the DCT factors: the reduced decodes round up, and
  # both paths must still map the crop box to the same pixels.
  data = jpeg_bytes(smooth_image(1203, 1605))
  train, evaluate = TrainDecodeCrop(64), EvalDecodeCrop(64)

  def outputs():
    crops = [train.random_map({"image": data, "label": 0}, np.random.default_rng(s))["image"]
             for s in range(10)]
    return crops + [evaluate.map({"image": data, "label": 0})["image"]]
  region = outputs()
  monkeypatch.setattr(decode, "_jpeg_region", None)
  for a, b in zip(region, outputs()):
    np.testing.assert_array_equal(a, b)


@needs_region_decoder
def test_region_decode_rejects_bad_input():
  data = jpeg_bytes(smooth_image(64, 96))
  region = decode._jpeg_region.decode_region
  with pytest.raises(ValueError, match="outside"):
    region(data, 60, 0, 8, 8, 1, False)
  with pytest.raises(ValueError, match="Not a JPEG"):
    region(b"GIF89a" + bytes(100), 0, 0, 8, 8, 1, False)
  # Corrupt entropy-coded data before the region is an error, not grey pixels.
  damaged = data[:len(data) // 2] + bytes(200) + data[len(data) // 2 + 200:]
  with pytest.raises(ValueError):
    region(damaged, 56, 0, 8, 96, 1, False)


def test_truncated_jpeg_is_corrupt_even_if_the_crop_is_intact(decode_path):
  """The region decoder could decode a crop above the cut; the file is still
  counted as corrupt, whichever crop is drawn."""
  data = jpeg_bytes(np.random.default_rng(0).integers(0, 255, (300, 400, 3), np.uint8))
  cut = data[: len(data) * 3 // 4]
  # Whole-width crop of the top rows: intact in the truncated file.
  op = TrainDecodeCrop(32, area_range=(0.1, 0.1), ratio_range=(4, 4))
  for seed in range(5):
    out = op.random_map({"image": cut, "label": 1}, np.random.default_rng(seed))
    assert out["corrupt"] == 1 and not out["mask"]


def test_resize_without_opencv_is_close(monkeypatch):
  """Where the OpenCV wheel is missing, PIL resizes: same geometry, close pixels."""
  data = jpeg_bytes(smooth_image(375, 500))
  op = TrainDecodeCrop(64)
  with_cv2 = [op.random_map({"image": data, "label": 0}, np.random.default_rng(s))["image"]
              for s in range(5)]
  monkeypatch.setattr(transforms, "cv2", None)
  with_pil = [op.random_map({"image": data, "label": 0}, np.random.default_rng(s))["image"]
              for s in range(5)]
  for a, b in zip(with_cv2, with_pil):
    assert a.shape == b.shape == (64, 64, 3)
    assert np.abs(a.astype(int) - b).mean() < 3


def test_flip_happens_about_half_the_time():
  # Dark left half, bright right half; the crop is the whole image
  # (area 1, aspect exactly 4/3), so only the flip changes the output.
  pixels = np.zeros((300, 400, 3), np.uint8)
  pixels[:, 200:] = 255
  data = jpeg_bytes(pixels)
  op = TrainDecodeCrop(32, area_range=(1.0, 1.0), ratio_range=(4 / 3, 4 / 3))
  rng = np.random.default_rng(0)
  n, flips = 400, 0
  for _ in range(n):
    image = op.random_map({"image": data, "label": 0}, rng)["image"].astype(int)
    left, right = image[:, :16].mean(), image[:, 16:].mean()
    assert abs(left - right) > 200  # the whole image, never a partial crop
    flips += left > right
  # Binomial(400, 0.5): sd 10, so +-45 is a 4.5-sigma bound.
  assert abs(flips - n / 2) < 45


def test_oversized_header_is_rejected_before_decoding(monkeypatch):
  monkeypatch.setattr(decode, "MAX_PIXELS", 99 * 99)
  out = EvalDecodeCrop(16).map({"image": jpeg_bytes(smooth_image(100, 100)), "label": 2})
  assert out["corrupt"] == 1 and not out["mask"] and out["label"] == 2


def test_eval_is_deterministic_and_center_cropped():
  # 25 px red border around a green square: the 87.5% center crop of a
  # 400 px side (350 px, from 25 to 375) keeps only green.
  pixels = np.zeros((400, 400, 3), np.uint8)
  pixels[...] = (255, 0, 0)
  pixels[25:375, 25:375] = (0, 255, 0)
  element = {"image": jpeg_bytes(pixels), "label": 3}
  op = EvalDecodeCrop(64)
  first, second = op.map(dict(element)), op.map(dict(element))
  assert np.array_equal(first["image"], second["image"])
  assert first["image"].shape == (64, 64, 3) and first["label"] == 3
  assert bool(first["mask"]) and first["corrupt"] == 0
  inner = first["image"][2:-2, 2:-2].astype(int)  # skip JPEG ringing at the edge
  assert inner[..., 1].min() > 200 and inner[..., 0].max() < 60
