"""Inference latency and throughput of the deploy formats, on this machine.

  python experiments/bench_inference.py [--model resnet50] [--image-size 224] [--batches 1,32]
                                        [--iterations 20] [--workdir DIR]

Rows: jaxnet's `jax.export` function in fp32, in bf16 and in int8 (`--int8`: qwix,
dynamic activation ranges), each called under jax.jit as a server embedding it would,
and onnxruntime (CPU execution provider) running the
`--format=onnx` export in fp32 and its `--int8` quantization. Each cell calls the
model `--iterations` times on one uint8 batch after 2 warm-up calls and reports the
median (p50) and 99th-percentile latency of a call and images/s at the median.

Weights: the workdir's model with --workdir, else random weights (speed does not
depend on them); the int8 model is then calibrated on random images, so only its
speed means something. Prints one markdown table with the hardware and versions.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402


def random_predictor(name: str, image_size: int, precision: str):
  import jax
  import jax.numpy as jnp
  from jaxnet.core import config as config_base
  from jaxnet.core import models
  from jaxnet.tools.predictor import Predictor
  config = config_base.base_config()
  config.model.name, config.image_size, config.precision = name, image_size, precision
  model = models.from_config(config, 1000)
  variables = jax.jit(lambda: model.init(jax.random.PRNGKey(0),
                                         jnp.zeros((1, image_size, image_size, 3)), train=False))()
  return Predictor(config, model, variables, num_classes=1000, step=0, workdir="random weights")


def with_precision(predictor, precision: str):
  from jaxnet.core import models
  from jaxnet.tools.predictor import Predictor
  config = predictor.config.copy_and_resolve_references()
  config.precision = precision
  model = models.from_config(config, predictor.num_classes)
  return Predictor(config, model, predictor.variables, num_classes=predictor.num_classes,
                   step=predictor.step, workdir=predictor.workdir)


def time_calls(call, images, iterations: int) -> list[float]:
  call(images)
  call(images)  # warm-up: compilation, allocation, onnxruntime's first-run set-up
  seconds = []
  for _ in range(iterations):
    start = time.perf_counter()
    call(images)
    seconds.append(time.perf_counter() - start)
  return seconds


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="resnet50")
  parser.add_argument("--image-size", type=int, default=224)
  parser.add_argument("--batches", default="1,32")
  parser.add_argument("--iterations", type=int, default=20)
  parser.add_argument("--workdir", default=None, help="a trained workdir (default: random weights)")
  parser.add_argument("--calibration-images", type=int, default=64)
  args = parser.parse_args()

  import jax
  import numpy as np
  import onnxruntime as ort
  from jaxnet import api
  from jaxnet.tools import export
  from jaxnet.tools import export as onnx_export
  from jaxnet.tools import export as onnx_quantize
  from jaxnet.tools import export as qwix_quantize
  onnx_export.quiet_converter_logs()
  batches = [int(b) for b in args.batches.split(",")]

  if args.workdir:
    fp32 = with_precision(api.restore(args.workdir), "fp32")
  else:
    fp32 = random_predictor(args.model, args.image_size, "fp32")
  bf16 = with_precision(fp32, "bf16")
  shape = fp32.image_shape
  rng = np.random.default_rng(0)

  engines = {}
  for label, predictor in (("jax.export fp32", fp32), ("jax.export bf16", bf16),
                           ("jax.export int8 (qwix)", qwix_quantize.quantize(fp32))):
    engines[label] = jax.jit(export.export(predictor).call)
  onnx_fp32 = onnx_export.to_onnx(fp32)
  if args.workdir:
    calibration = onnx_quantize.calibration_images(fp32, args.calibration_images)
  else:
    calibration = rng.integers(0, 256, (args.calibration_images, *shape), dtype=np.uint8)
  onnx_int8 = onnx_quantize.quantize(onnx_fp32, calibration)
  for label, model in (("onnxruntime fp32", onnx_fp32), ("onnxruntime int8", onnx_int8)):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    engines[label] = (lambda s: lambda images: s.run(["logits"], {"images": images})[0])(session)

  rows = []
  for batch in batches:
    images = rng.integers(0, 256, (batch, *shape), dtype=np.uint8)
    for label, call in engines.items():
      block = (lambda c: lambda x: jax.block_until_ready(c(x)))(call) if label.startswith("jax") else call
      seconds = np.array(time_calls(block, images, args.iterations))
      p50, p99 = np.percentile(seconds, 50), np.percentile(seconds, 99)
      rows.append((label, batch, p50 * 1e3, p99 * 1e3, batch / p50))
      print(f"  {label}, batch {batch}: p50 {p50 * 1e3:.1f} ms", file=sys.stderr, flush=True)

  weights = f"{args.workdir}" if args.workdir else "random weights"
  print(f"### Inference: `bench_inference.py` ({fp32.config.model.name}, {shape[0]}px, {weights}, "
        f"{args.iterations} calls per cell)\n")
  print(benchlib.cpu_line())
  print(benchlib.load_line())
  print(benchlib.versions_line("onnx", "onnxruntime", "jax2onnx", "qwix"))
  print(f"jax devices: {', '.join(str(d) for d in jax.devices())}; onnxruntime: CPUExecutionProvider")
  print(benchlib.date_line() + "\n")
  base = {batch: ips for label, batch, _, _, ips in rows if label == "jax.export fp32"}
  print("| engine | batch | p50 ms | p99 ms | images/s | vs jax.export fp32 |")
  print("|---|---:|---:|---:|---:|---:|")
  for label, batch, p50, p99, ips in rows:
    print(f"| {label} | {batch} | {p50:.1f} | {p99:.1f} | {ips:.1f} | {ips / base[batch]:.2f}x |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
