"""Serialize a trained model's inference function with `jax.export`, and load it back.

  python -m jaxnet.export --workdir=DIR --out=FILE [--step=N] [--platforms=cpu,cuda] [--int8]
  python -m jaxnet.export --workdir=DIR --format=torch --out=FILE.safetensors
  python -m jaxnet.export --workdir=DIR --format=onnx --out=FILE.onnx [--int8 [--calibration-images=N]]

`--format=torch` (or its older name `torchvision`) writes the weights instead, under
PyTorch's names: torchvision's for ResNets and AlexNet, timm's for ViTs
(jaxnet/weights/export.py). `--format=onnx` writes an ONNX graph with the same
input and output as below (jaxnet/onnx_export.py; `--int8` quantizes it,
jaxnet/onnx_quantize.py; docs/deploy.md). The rest of this docstring is about the
default, `--format=jax`; with `--int8` its convolutions and dense layers compute in
int8 (qwix post-training quantization, jaxnet/qwix_quantize.py).

The exported function is `logits = f(images)`:
  images  uint8 (batch, H, W, C), the preprocessed images (jaxnet/preprocess.py);
          batch is symbolic, so any batch size runs the same file
  logits  float32 (batch, num_classes)
Normalization and the model in eval mode (BN running statistics, EMA params
when the run kept an EMA) are inside: it is `steps.make_logits_fn`, the function
the eval step runs. The params are baked in as constants, so FILE alone is the
model; no jaxnet, Flax or checkpoint is needed to run it, only jax:

  exported = jax.export.deserialize(bytearray(open(FILE, "rb").read()))
  logits = exported.call(images)

FILE.json beside it records the input shape and the class names.
`platforms` lists the backends to lower for (default: the one exporting).
"""

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np


def export(predictor, platforms=None) -> "jax.export.Exported":
  """The Predictor's eval-mode function with its variables baked in, batch-polymorphic."""
  variables = predictor.variables
  logits_fn = predictor.logits_fn

  def infer(images):
    return logits_fn(variables, images)

  batch = jax.export.symbolic_shape("b")[0]
  spec = jax.ShapeDtypeStruct((batch, *predictor.image_shape), jnp.uint8)
  return jax.export.export(jax.jit(infer), platforms=platforms)(spec)


def save(predictor, path: str, platforms=None, quantization: str | None = None) -> None:
  exported = export(predictor, platforms)
  with open(path, "wb") as f:
    f.write(exported.serialize())
  metadata = {"image_shape": list(predictor.image_shape), "dtype": "uint8",
              "class_names": predictor.class_names, "platforms": list(exported.platforms),
              "workdir": str(predictor.workdir), "step": predictor.step}
  if quantization:
    metadata["quantization"] = quantization
  with open(path + ".json", "w") as f:
    json.dump(metadata, f, indent=2)


class ExportedModel:
  """A loaded export: call it on a uint8 (batch, H, W, C) array to get float32 logits."""

  def __init__(self, exported, metadata: dict | None = None):
    self.exported = exported
    self.metadata = metadata or {}
    self.class_names = self.metadata.get("class_names")
    self.image_shape = tuple(exported.in_avals[0].shape[1:])

  def __call__(self, images) -> jax.Array:
    images = np.asarray(images)
    if images.dtype != np.uint8:  # a cast would silently wrap or truncate pixel values
      raise TypeError(f"images must be uint8 (batch, {', '.join(map(str, self.image_shape))}), "
                      f"got {images.dtype}")
    return self.exported.call(images)


def load(path: str) -> ExportedModel:
  with open(path, "rb") as f:
    exported = jax.export.deserialize(bytearray(f.read()))
  try:
    with open(path + ".json") as f:
      metadata = json.load(f)
  except FileNotFoundError:  # the metadata is a convenience; the function stands alone
    metadata = None
  return ExportedModel(exported, metadata)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m jaxnet.export", description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True, help="a training workdir with checkpoints")
  parser.add_argument("--out", required=True, help="file to write the serialized function to")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  parser.add_argument("--format", choices=("jax", "torch", "torchvision", "onnx"), default="jax",
                      help="jax: the serialized inference function; torch (or torchvision, its "
                           "older name): the weights as a .safetensors file with PyTorch names "
                           "(torchvision's for ResNets and AlexNet, timm's for ViTs); onnx: an "
                           "ONNX graph, uint8 NHWC images in, fp32 logits out (docs/deploy.md)")
  parser.add_argument("--int8", action="store_true",
                      help="with --format=onnx: static int8 quantization (onnxruntime, QDQ, "
                           "per-channel weights); with --format=jax: int8 convolutions and dense "
                           "layers (qwix, dynamic activation ranges)")
  parser.add_argument("--calibration-images", type=int, default=None,
                      help="with --int8: train images that calibrate the activation ranges "
                           "(default 256)")
  parser.add_argument("--platforms", default=None,
                      help="comma-separated backends to lower for, e.g. cpu,cuda (default: this one)")
  args = parser.parse_args(argv)
  if args.format == "torchvision":
    args.format = "torch"
  if args.format == "torch" and not args.out.endswith(".safetensors"):
    parser.error(f"--format=torch writes a .safetensors file; got --out={args.out}")
  if args.format == "onnx" and not args.out.endswith(".onnx"):
    parser.error(f"--format=onnx writes a .onnx file; got --out={args.out}")
  if args.int8 and args.format not in ("onnx", "jax"):
    parser.error(f"--int8 quantizes an ONNX or a jax export, not --format={args.format}")
  if args.calibration_images is not None and not (args.int8 and args.format == "onnx"):
    parser.error("--calibration-images calibrates the ONNX --int8: add --int8 --format=onnx")
  if args.platforms and args.format != "jax":
    parser.error(f"--platforms applies to --format=jax; --format={args.format} runs anywhere")

  from jaxnet import api, errors
  with errors.one_line_errors():
    predictor = api.restore(args.workdir, step=args.step)
    if args.format == "torch":
      from jaxnet.weights import export as weights_export, pretrained
      tensors = weights_export.save(predictor, args.out)
      names = pretrained.names_of(predictor.config.model.name).NAMES
      print(f"exported step {predictor.step} of {args.workdir} to {args.out} ({len(tensors)} "
            f"tensors, {names} names)")
      return 0
    if args.format == "onnx":
      return _save_onnx(predictor, args)
    platforms = args.platforms.split(",") if args.platforms else None
    quantization = None
    if args.int8:
      from jaxnet import qwix_quantize
      predictor = qwix_quantize.quantize(predictor)
      quantization = qwix_quantize.DESCRIPTION
    save(predictor, args.out, platforms, quantization)
  print(f"exported step {predictor.step} of {args.workdir} to {args.out} "
        f"(input uint8 (batch, {', '.join(map(str, predictor.image_shape))})"
        f"{'; ' + quantization if quantization else ''})")
  return 0


def _save_onnx(predictor, args) -> int:
  from jaxnet import onnx_export, onnx_quantize
  onnx_export.quiet_converter_logs()  # a CLI entry point may set a library's log level
  if args.int8:
    n = onnx_quantize.DEFAULT_CALIBRATION_IMAGES if args.calibration_images is None \
        else args.calibration_images  # 0 is an error (calibration_images), not the default
    onnx_quantize.save_int8(predictor, args.out, n)
    kind = f"int8, calibrated on {n} train images"
  else:
    onnx_export.save(predictor, args.out)
    kind = "fp32"
  print(f"exported step {predictor.step} of {args.workdir} to {args.out} (ONNX {kind}; input uint8 "
        f"(batch, {', '.join(map(str, predictor.image_shape))}) named images, output logits)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
