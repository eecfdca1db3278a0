"""Inference latency and throughput of the deploy formats, on this machine.

  python experiments/bench_inference.py [--model resnet50] [--image-size 224] [--batches 1,16]
                                        [--iterations 20] [--workdir DIR] [--torch] [--no-jax]

Rows: jaxnet's `jax.export` function in fp32, in bf16 and in int8 (qwix, dynamic activation
ranges), each called under jax.jit as a server embedding it would, and onnxruntime (CPU
execution provider) running the `--format=onnx` export in fp32 and its `--int8`
quantization. With --torch (where torch and torchvision are installed; not a jaxnet
dependency), the peer: torchvision's model of the same name with the same weights (through
jaxnet's torchvision-name export; for a ViT, torchvision's VisionTransformer of the same
shape with its own random weights, torchvision having no timm-style ViT), exported by
`torch.onnx.export` (opset 17, dynamic batch) and quantized by the same onnxruntime call
on the same calibration images, run in the same onnxruntime. Its input is the float NCHW
tensor torchvision's models take (the uint8 decode-to-normalised step is done for it,
outside the timing), and, as a second peer, the same model wrapped to take jaxnet's input
(uint8 NHWC, cast, transposed and normalised inside the graph, as jaxnet's graph does).
Each cell calls the model `--iterations` times on one batch after 2 warm-up calls,
interleaving the engines round by round, and reports the median (p50) and 99th-percentile
latency and images/s at the median; the nodes of each ONNX graph as written are counted.

Weights: the workdir's model with --workdir, else random weights (BN statistics drawn too;
speed does not depend on them); the int8 models are calibrated on random images, so only
their speed means something. Prints one markdown table with the hardware and versions.
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
  from jaxnet.core.state import get_policy
  from jaxnet.tools.predictor import Predictor
  config = config_base.base_config()
  config.model.name, config.image_size, config.precision = name, image_size, precision
  config = config_base.with_model_options(config)
  model = models.from_config(config.model, 1000, get_policy(precision).compute_dtype)
  variables = jax.jit(lambda: model.init(jax.random.PRNGKey(0),
                                         jnp.zeros((1, image_size, image_size, 3)), train=False))()
  return Predictor(config, model, variables, num_classes=1000, step=0, workdir="random weights")


def with_precision(predictor, precision: str):
  from jaxnet.core import models
  from jaxnet.core.state import get_policy
  from jaxnet.tools.predictor import Predictor
  config = predictor.config.copy_and_resolve_references()
  config.precision = precision
  model = models.from_config(config.model, predictor.num_classes, get_policy(precision).compute_dtype)
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


def randomise_bn_statistics(predictor, seed: int = 0):
  """Running means and variances drawn at random (a trained model's are not 0 and 1), so that
  BN folding is exercised as it would be."""
  import jax
  import numpy as np
  if "batch_stats" not in predictor.variables:  # (a ViT: no BN)
    return predictor
  rng = np.random.default_rng(seed)
  draw = lambda path, x: (rng.uniform(0.5, 1.5, x.shape) if path[-1].key == "var"
                          else rng.normal(0, 0.1, x.shape)).astype(np.float32)
  predictor.variables = {**predictor.variables,
                         "batch_stats": jax.tree_util.tree_map_with_path(draw, predictor.variables["batch_stats"])}
  return predictor


def torch_peer(predictor, calibration, onnx_quantization):
  """{label: ONNX model} of torchvision's model with the predictor's weights, exported by
  torch.onnx.export, fp32 and int8, in two forms: as torchvision's model is (float NCHW
  normalised input, made outside the graph) and wrapped to take jaxnet's input (uint8 NHWC,
  normalised inside, as jaxnet's graph does); and the function that makes the first form's
  input from uint8 NHWC images."""
  import io
  import numpy as np
  import onnx
  import torch
  import torchvision
  from jaxnet.tools.weights.export import torch_tensors
  name, jax_model = predictor.config.model.name, predictor.model
  if name.startswith("vit"):  # torchvision's ViT of the same shape, its own random weights
    model = torchvision.models.VisionTransformer(
        image_size=predictor.config.image_size, patch_size=jax_model.patch_size, num_layers=jax_model.depth,
        num_heads=jax_model.num_heads, hidden_dim=jax_model.width, mlp_dim=jax_model.mlp_dim,
        num_classes=predictor.num_classes)
  else:
    model = getattr(torchvision.models, name)(num_classes=predictor.num_classes)
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in
                           torch_tensors(predictor.variables, name).items()}, strict=True)
  model.eval()
  mean = np.asarray(predictor.config.data.mean, np.float32).reshape(1, 3, 1, 1)
  std = np.asarray(predictor.config.data.std, np.float32).reshape(1, 3, 1, 1)

  class Uint8Input(torch.nn.Module):  # jaxnet's interface: uint8 NHWC in, normalised inside
    def __init__(self):
      super().__init__()
      self.model = model
      self.register_buffer("scale", torch.from_numpy(1 / (255 * std)))
      self.register_buffer("shift", torch.from_numpy(-mean / std))

    def forward(self, images):
      return self.model(images.permute(0, 3, 1, 2).float() * self.scale + self.shift)

  def exported(module, example):
    buffer = io.BytesIO()
    with torch.no_grad():
      torch.onnx.export(module, example, buffer, opset_version=17, dynamo=False,
                        input_names=["images"], output_names=["logits"],
                        dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}})
    return onnx.load_from_string(buffer.getvalue())

  size = predictor.config.image_size
  to_input = lambda images: ((images.transpose(0, 3, 1, 2).astype(np.float32) / 255 - mean) / std)
  fp32 = exported(model, torch.zeros(1, 3, size, size))
  fp32_uint8 = exported(Uint8Input().eval(), torch.zeros(1, size, size, 3, dtype=torch.uint8))
  return {"torch.onnx.export fp32": fp32,
          "torch.onnx.export int8": onnx_quantization(fp32, to_input(calibration)),
          "torch.onnx.export fp32, uint8 input": fp32_uint8,
          "torch.onnx.export int8, uint8 input": onnx_quantization(fp32_uint8, calibration)}, to_input


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="resnet50")
  parser.add_argument("--image-size", type=int, default=224)
  parser.add_argument("--batches", default="1,16")
  parser.add_argument("--iterations", type=int, default=20)
  parser.add_argument("--workdir", default=None, help="a trained workdir (default: random weights)")
  parser.add_argument("--calibration-images", type=int, default=32)
  parser.add_argument("--torch", action="store_true", help="add torch.onnx.export's graph of the same model")
  parser.add_argument("--no-jax", action="store_true", help="leave out the jax.export rows")
  parser.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0: its default)")
  args = parser.parse_args()

  import jax
  import numpy as np
  import onnxruntime as ort
  from jaxnet import api
  from jaxnet.tools import export, onnx as onnx_export
  from jaxnet.tools.onnx import int8 as onnx_int8
  batches = [int(b) for b in args.batches.split(",")]

  if args.workdir:
    fp32 = with_precision(api.restore(args.workdir), "fp32")
  else:
    fp32 = randomise_bn_statistics(random_predictor(args.model, args.image_size, "fp32"))
  shape = fp32.image_shape
  rng = np.random.default_rng(0)
  calibration = (onnx_int8.calibration_images(fp32, args.calibration_images) if args.workdir else
                 rng.integers(0, 256, (args.calibration_images, *shape), dtype=np.uint8))

  engines, inputs, nodes = {}, {}, {}
  if not args.no_jax:
    for label, predictor in (("jax.export fp32", fp32), ("jax.export bf16", with_precision(fp32, "bf16")),
                             ("jax.export int8 (qwix)", export.qwix_quantize(fp32))):
      call = jax.jit(export.export(predictor).call)
      engines[label] = (lambda c: lambda x: jax.block_until_ready(c(x)))(call)
  options = ort.SessionOptions()
  if args.threads:
    options.intra_op_num_threads = args.threads
  onnx_models = {"jaxnet ONNX fp32": onnx_export.to_onnx(fp32)}
  onnx_models["jaxnet ONNX int8"] = onnx_int8.quantize_onnx(onnx_models["jaxnet ONNX fp32"], calibration)
  if args.torch:
    def quantization(model, images):  # onnx_int8.quantize_onnx, on the torch graph's own input
      try:
        return onnx_int8.quantize_onnx(model, images)
      except AssertionError:  # its symbolic shape inference fails on torch's ViT graph
        print("  torch's graph: quant_pre_process's symbolic shape inference failed; quantized "
              "without it", file=sys.stderr, flush=True)
        return onnx_int8.quantize_onnx(model, images, symbolic_shapes=False)
    peers, to_input = torch_peer(fp32, calibration, quantization)
    onnx_models.update(peers)
    inputs["torch.onnx.export fp32"] = inputs["torch.onnx.export int8"] = to_input
  for label, model in onnx_models.items():
    nodes[label] = len(model.graph.node)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    engines[label] = (lambda s: lambda x: s.run(["logits"], {"images": x})[0])(session)

  rows = {}
  for batch in batches:
    images = rng.integers(0, 256, (batch, *shape), dtype=np.uint8)
    feeds = {label: inputs.get(label, lambda x: x)(images) for label in engines}
    if args.torch and not args.model.startswith("vit"):  # the same weights: the same logits
      a, b = engines["jaxnet ONNX fp32"](images), engines["torch.onnx.export fp32"](feeds["torch.onnx.export fp32"])
      print(f"  batch {batch}: jaxnet ONNX vs torch ONNX fp32 logits: max abs difference "
            f"{np.abs(a - b).max():.2e}", file=sys.stderr, flush=True)
    for label, call in engines.items():  # warm-up
      call(feeds[label])
      call(feeds[label])
    seconds = {label: [] for label in engines}
    for _ in range(args.iterations):  # interleaved: load changes hit every engine alike
      for label, call in engines.items():
        start = time.perf_counter()
        call(feeds[label])
        seconds[label].append(time.perf_counter() - start)
    for label in engines:
      p50, p99 = np.percentile(seconds[label], 50), np.percentile(seconds[label], 99)
      rows[label, batch] = (p50 * 1e3, p99 * 1e3, batch / p50)
      print(f"  {label}, batch {batch}: p50 {p50 * 1e3:.1f} ms", file=sys.stderr, flush=True)

  weights = args.workdir or ("random weights" + (", BN statistics drawn" if "batch_stats" in fp32.variables else ""))
  print(f"### Inference: `bench_inference.py` ({fp32.config.model.name}, {shape[0]}px, {weights}, "
        f"{args.iterations} interleaved calls per cell)\n")
  print(benchlib.cpu_line())
  print(benchlib.load_line())
  print(benchlib.versions_line("onnx", "onnxruntime", "qwix", *(("torch", "torchvision") if args.torch else ())))
  print(f"jax devices: {', '.join(str(d) for d in jax.devices())}; onnxruntime: CPUExecutionProvider, "
        f"{args.threads or 'default'} intra-op threads")
  print(benchlib.date_line() + "\n")
  precision = lambda label: "int8" if "int8" in label else "fp32"
  print("| engine | ONNX nodes | batch | p50 ms | p99 ms | images/s | latency vs torch's graph | "
        "vs torch's, uint8 input |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|")
  for (label, batch), (p50, p99, ips) in rows.items():
    versus = ["", ""]
    if args.torch and label.startswith("jaxnet ONNX"):
      versus = [f"{p50 / rows[f'torch.onnx.export {precision(label)}{form}', batch][0]:.2f}x"
                for form in ("", ", uint8 input")]
    print(f"| {label} | {nodes.get(label, '')} | {batch} | {p50:.1f} | {p99:.1f} | {ips:.1f} | "
          f"{' | '.join(versus)} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
