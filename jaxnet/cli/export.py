"""A trained model out of jaxnet (jaxnet/tools/export.py, jaxnet/tools/onnx/; docs/deploy.md):

  python -m jaxnet.cli.export --workdir=DIR --out=FILE [--step=N] [--platforms=cpu,cuda] [--int8]
  python -m jaxnet.cli.export --workdir=DIR --format=torch --out=FILE.safetensors [--names=timm]
  python -m jaxnet.cli.export --workdir=DIR --format=onnx --out=FILE.onnx [--int8 [--calibration-images=N|DIR]]
  python -m jaxnet.cli.export --workdir=DIR --format=bundle --out=NEW_FOLDER [--step=N]

--format=jax (the default) serializes the inference function with jax.export, --int8 with
its convolutions and dense layers in int8 (qwix); --format=torch writes the weights under
PyTorch's names (torchvision's for ResNets, AlexNet, ConvNeXts and EfficientNets, timm's for
ViTs; --names=timm for a ConvNeXt's or an EfficientNet B0-B7's timm names); --format=onnx an
ONNX graph, --int8 quantized by onnxruntime; --format=bundle a folder others can load
(api.restore, predict, verify): one checkpoint with its config, classes, metrics,
environment, data identity and a MODEL_CARD.md, every file's sha256 checked on loading
(jaxnet/tools/bundle.py, docs/reproducibility.md).
"""

import sys

from jaxnet import cli
from jaxnet.cli import process


def main(argv=None):
  parser = cli.parser("export", __doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True, help="a training workdir with checkpoints")
  parser.add_argument("--out", required=True, help="file to write the serialized function to")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  parser.add_argument("--format", choices=("jax", "torch", "onnx", "bundle"), default="jax",
                      help="jax: the serialized inference function; torch: the weights as a "
                           ".safetensors file with PyTorch names (torchvision's for ResNets, "
                           "AlexNet, ConvNeXts and EfficientNets, timm's for ViTs; see --names); "
                           "onnx: an ONNX "
                           "graph, uint8 NHWC images in, fp32 logits out (docs/deploy.md); bundle: "
                           "a new folder holding one checkpoint with its records and a model card "
                           "(docs/reproducibility.md)")
  parser.add_argument("--names", choices=("torchvision", "timm"), default=None,
                      help="with --format=torch: whose tensor names to write (default: the model "
                           "family's first: torchvision's, timm's for ViTs); ConvNeXts and EfficientNet "
                           "B0-B7 have both")
  parser.add_argument("--int8", action="store_true",
                      help="with --format=onnx: static int8 quantization (onnxruntime, QDQ, "
                           "per-channel weights); with --format=jax: int8 convolutions and dense "
                           "layers (qwix, dynamic activation ranges)")
  parser.add_argument("--calibration-images", default=None, metavar="N|DIR",
                      help="with --int8: what calibrates the activation ranges: N train images "
                           "(default 256), or every image in the folder DIR (any layout)")
  parser.add_argument("--platforms", default=None,
                      help="comma-separated backends to lower for, e.g. cpu,cuda (default: this one)")
  args = parser.parse_args(argv)
  if args.format == "torch" and not args.out.endswith(".safetensors"):
    parser.error(f"--format=torch writes a .safetensors file; got --out={args.out}")
  if args.format == "onnx" and not args.out.endswith(".onnx"):
    parser.error(f"--format=onnx writes a .onnx file; got --out={args.out}")
  if args.int8 and args.format not in ("onnx", "jax"):
    parser.error(f"--int8 quantizes an ONNX or a jax export, not --format={args.format}")
  if args.calibration_images is not None and not (args.int8 and args.format == "onnx"):
    parser.error("--calibration-images calibrates the ONNX --int8: add --int8 --format=onnx")
  if args.names and args.format != "torch":
    parser.error(f"--names chooses the tensor names of --format=torch, not of --format={args.format}")
  if args.platforms and args.format != "jax":
    parser.error(f"--platforms applies to --format=jax; --format={args.format} runs anywhere")

  if args.format == "bundle":
    return _bundle(args)
  with process.one_line_errors():
    from jaxnet.core.metrics import prepare_output
    prepare_output(args.out)  # before the conversion, which can take minutes
    process.setup()
    from jaxnet import api
    from jaxnet.tools import export
    from jaxnet.tools import onnx as onnx_export
    from jaxnet.tools.onnx import int8 as onnx_int8
    predictor = api.restore(args.workdir, step=args.step)
    asked = "int8" if args.int8 else args.format
    if asked not in predictor.task.exports:
      from jaxnet.core.errors import UserError
      flag = "--int8" if args.int8 else f"--format={args.format}"
      raise UserError(f"{args.workdir} holds a {predictor.task.name} model: {flag} is not built for it "
                      f"yet (docs/{predictor.task.name}.md); it exports to "
                      f"{', '.join('--' + e if e == 'int8' else '--format=' + e for e in predictor.task.exports)}")
    shape = f"(batch, {', '.join(map(str, predictor.image_shape))})"
    if args.format == "torch":
      from jaxnet.tools.weights import export as weights_export, pretrained
      tensors = weights_export.save(predictor, args.out, args.names)
      names = pretrained.names_of(predictor.config.model.name, args.names).NAMES
      what = f"{len(tensors)} tensors, {names} names"
    elif args.format == "onnx":
      if args.int8:
        given = args.calibration_images
        if given is None:
          calibration = onnx_int8.DEFAULT_CALIBRATION_IMAGES
        elif given.lstrip("-").isdigit():
          calibration = int(given)  # 0 is an error (calibration_images), not the default
        else:
          calibration = given
        onnx_int8.save_onnx_int8(predictor, args.out, calibration)
        kind = (f"int8, calibrated on the images in {calibration}" if isinstance(calibration, str)
                else f"int8, calibrated on {calibration} train images")
      else:
        onnx_export.save_onnx(predictor, args.out)
        kind = "fp32"
      outputs = onnx_export.onnx_outputs(predictor)
      what = f"ONNX {kind}; input uint8 {shape} named images, {outputs}"
    else:
      platforms = args.platforms.split(",") if args.platforms else None
      quantization = None
      if args.int8:
        predictor = export.qwix_quantize(predictor)
        quantization = export.QWIX_DESCRIPTION
      export.save(predictor, args.out, platforms, quantization)
      what = f"input uint8 {shape}{'; ' + quantization if quantization else ''}"
  print(f"exported step {predictor.step} of {args.workdir} to {args.out} ({what})")
  return 0


def _bundle(args) -> int:
  with process.one_line_errors():
    from jaxnet.tools import bundle
    manifest = bundle.write_bundle(args.workdir, args.out, args.step)
  print(f"bundled step {manifest['step']} of {args.workdir} into {args.out} ({len(manifest['files'])} files; "
        f"see its MODEL_CARD.md): api.restore({args.out!r}) loads it, jaxnet verify "
        f"{args.out} checks it")
  return 0


if __name__ == "__main__":
  sys.exit(main())
