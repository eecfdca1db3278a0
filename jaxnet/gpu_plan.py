"""Compile jaxnet's train and eval steps for GPUs you do not have, and say what they would do.

  python -m jaxnet.gpu_plan --config=configs/resnet50.py --target=h100 --gpus=8 \
      [--config.KEY=VALUE ...] [--hosts=N] [--find-max-batch] [--dump=DIR] [--json]

The steps are compiled by `jaxnet.gpu_compile` (the CUDA plugin wheels of the installed
jaxlib, no GPU and no CUDA libraries); this module is the command line and its table, which
reads the compiled program (`jaxnet.hlo_analysis`) and its memory analysis. Without a
device there is no autotuning: this shows the program's structure and memory, not its speed
(the roofline is an upper bound on images/s, not a prediction).

The config's data source is replaced by synthetic images of the same size (only the batch's
shape matters), and progressive resizing is off: the steps are compiled at config.image_size.
"""

from __future__ import annotations

import os

from jaxnet import gpu_compile
from jaxnet.gpu_compile import GIB

# Dense (no sparsity) tensor-core peaks in FLOP/s, by the dtype a convolution or matmul reads;
# f32 runs as TF32, jax's default precision on these GPUs. Sources: NVIDIA's H100 SXM datasheet
# (BF16/FP16 989.4 TFLOPS, TF32 494.7), H200 datasheet (the same), A100 datasheet (BF16/FP16 312,
# TF32 156).
PEAK_FLOPS = {
    "h100": {"bf16": 989.4e12, "f16": 989.4e12, "f32": 494.7e12},
    "h200": {"bf16": 989.4e12, "f16": 989.4e12, "f32": 494.7e12},
    "a100": {"bf16": 312e12, "f16": 312e12, "f32": 156e12},
}
# jax preallocates this fraction of each GPU's memory as the pool programs allocate from.
DEFAULT_MEM_FRACTION = 0.75


def attention_lowering(analysis) -> str:
  """Which attention a ViT step got, and why (only its fused cuDNN form shows as a library call)."""
  if analysis.attention:
    return f"cuDNN fused attention ({', '.join(sorted({a['target'] for a in analysis.attention}))})"
  import jax
  import jax.numpy as jnp
  q = jax.ShapeDtypeStruct((1, 16, 1, 64), jnp.bfloat16)
  try:
    jax.jit(lambda q: jax.nn.dot_product_attention(q, q, q, implementation="cudnn")).trace(q)
    why = "cuDNN's fused attention was not used"
  except Exception as e:  # the reason jax gives, e.g. no cuDNN library on this machine
    why = f"jax refused cuDNN's fused attention here: {str(e).splitlines()[0]}"
  return (f"XLA's (batched GEMMs around a softmax fusion): {why}; a GPU run with cuDNN >= 8.9 "
          f"uses the fused kernel (jaxnet/models/vit.py), so its attention is faster and smaller "
          f"than shown")


def mem_fraction() -> float:
  return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", DEFAULT_MEM_FRACTION))


def plan(config, *, target: str = "h100", gpus: int = 8, hosts: int = 1, dump: str = "",
         find_max_batch: bool = False, log=None) -> dict:
  """Compiles `config`'s train and eval steps for `gpus` GPUs of `target`; returns the numbers."""
  from jaxnet import hlo_analysis
  gpu_compile.check_plugin()
  name, text = gpu_compile.target_text(target)
  devices = gpu_compile.topology_devices(text, gpus, hosts)
  config = gpu_compile.plan_config(config)
  exp, train, evaluation = gpu_compile.build(config, devices)
  per_gpu = config.batch_size // gpus
  analysis = gpu_compile.analyse_step(train, exp.abstract_state, per_gpu)
  eval_batch = config.data.eval_batch_size or config.batch_size
  eval_analysis = gpu_compile.analyse_step(evaluation, exp.abstract_state, eval_batch // gpus)
  if dump:
    os.makedirs(dump, exist_ok=True)
    for step, compiled in (("train", train), ("eval", evaluation)):
      with open(os.path.join(dump, f"{step}_step.{name}.{gpus}gpu.hlo.txt"), "w") as f:
        f.write(compiled.hlo)
  memory = gpu_compile.device_memory(text)
  usable = memory * mem_fraction()
  result = {
      "target": name, "device": devices[0].device_kind, "gpus": gpus, "hosts": hosts,
      "model": config.model.name, "precision": config.precision, "image_size": config.image_size,
      "batch_size": config.batch_size, "per_gpu_batch": per_gpu,
      "params_bytes": 4 * sum(gpu_compile.param_sizes(exp.abstract_state)),
      "memory": {"arguments": train.arguments, "outputs": train.outputs, "aliased": train.aliased,
                 "temporaries": train.temporaries, "total": train.total, "device": memory,
                 "usable": usable, "fits": train.total <= usable,
                 "eval_total": evaluation.total},
      "train": hlo_analysis.summary(analysis),
      "eval": hlo_analysis.summary(eval_analysis),
      "attention": attention_lowering(analysis) if "vit" in config.model.name else "",
      "xla_options": {**train.options, **evaluation.options},
      "transposes": [t for t in analysis.transposes if t["size"] == "activation"],
      "gradient_collectives": analysis.collectives,
      "fsdp": exp.fsdp_summary.line() if exp.fsdp_summary else "",
  }
  peaks = PEAK_FLOPS.get(name)
  if peaks:
    hbm_bandwidth = gpu_compile.bandwidth(text)
    seconds = analysis.roofline_seconds(peaks, hbm_bandwidth)
    result["roofline"] = {"step_seconds": seconds, "images_per_second": config.batch_size / seconds,
                          "compute_seconds": sum(k.count * k.flops / (peaks.get(k.dtype) or max(peaks.values()))
                                                 for k in analysis.kernels),
                          "memory_seconds": analysis.hbm_bytes / hbm_bandwidth}
  if find_max_batch:
    result["max_per_gpu_batch"] = gpu_compile.largest_batch(config, devices, usable, per_gpu, log=log)
  return result


def table(r: dict) -> str:
  """The plan as the lines the command prints."""
  m, t = r["memory"], r["train"]
  lines = [f"{r['model']} {r['precision']} {r['image_size']}px, batch {r['batch_size']} "
           f"({r['per_gpu_batch']}/GPU) on {r['gpus']}x {r['device']} ({r['hosts']} host(s)): "
           f"compiled on a CPU for a GPU target, not run",
           f"XLA options (a run's, from jaxnet.runtime, unless XLA_FLAGS sets them): "
           f"{' '.join(f'{k}={v}' for k, v in r.get('xla_options', {}).items()) or 'none'}",
           "memory per GPU (train step):",
           f"  arguments {m['arguments'] / GIB:.2f} GiB, outputs {m['outputs'] / GIB:.2f} GiB "
           f"(donated: {m['aliased'] / GIB:.2f} GiB reuse the arguments), temporaries "
           f"{m['temporaries'] / GIB:.2f} GiB",
           f"  total {m['total'] / GIB:.2f} GiB of {m['device'] / GIB:.1f} GiB "
           f"({m['usable'] / GIB:.1f} GiB usable at jax's memory fraction {mem_fraction():g}): "
           f"{'fits' if m['fits'] else 'DOES NOT FIT'}; eval step {m['eval_total'] / GIB:.2f} GiB"]
  if r.get("fsdp"):
    lines.append(f"  {r['fsdp']}")
  if "max_per_gpu_batch" in r:
    mb = r["max_per_gpu_batch"]
    bound = f", {mb['does_not_fit']} does not" if "does_not_fit" in mb else " (search stopped)"
    lines.append(f"  largest per-GPU batch that fits: {mb['per_gpu_batch']}{bound}")
  convs = t["convolutions"]
  lines.append("library calls per train step:")
  lines.append(f"  cuDNN convolutions: {sum(convs.values())} "
               f"({', '.join(f'{k} {v}' for k, v in sorted(convs.items())) or 'none'}); layouts: "
               f"{', '.join(f'{k} {v}' for k, v in sorted(t['conv_layouts'].items())) or '-'}")
  lines.append(f"  GEMMs: {sum(t['gemms'].values())} "
               f"({', '.join(f'{k} {v}' for k, v in sorted(t['gemms'].items())) or 'none'})")
  lines.append(f"  fused attention: {', '.join(f'{k} {v}' for k, v in t['attention'].items()) or 'none'}")
  if r.get("attention"):
    lines.append(f"  attention: {r['attention']}")
  tr = t["transposes"]
  lines.append(f"transposes/copies: activation-sized {tr['activation']}, weight-sized {tr['weight']} "
               f"({t['weight_copies']} of them plain copies), small {tr['small']}")
  for x in r["transposes"][:5]:
    lines.append(f"  activation-sized {x['op']} {x['shape']} in {x['inside']}")
  if "xla_gpu_enable_triton_gemm" in r.get("xla_options", {}):
    lines.append("  note: compiled with xla_gpu_enable_triton_gemm=false (XLA could not tile a Triton "
                 "GEMM without autotuning)")
  lines.append(f"kernels per train step: {t['kernels']} ({t['fusions']} fusions); eval step "
               f"{r['eval']['kernels']}")
  coll = t["collectives"]
  if coll:
    for op, c in sorted(coll.items()):
      lines.append(f"collectives: {op} x{c['count']} ({c['combined']} combining several tensors), "
                   f"{c['bytes'] / 2**20:.1f} MiB per step (fp32 params: {r['params_bytes'] / 2**20:.1f} MiB)")
  else:
    lines.append("collectives: none")
  if "roofline" in r:
    rf = r["roofline"]
    lines.append(f"roofline: {t['flops'] / 1e12:.2f} TFLOP and {t['hbm_bytes'] / GIB:.2f} GiB of HBM "
                 f"traffic per GPU per step -> at least {rf['step_seconds'] * 1e3:.2f} ms/step, at most "
                 f"{rf['images_per_second']:,.0f} img/s (an upper bound, not a prediction)")
  return "\n".join(lines)


def main(argv=None):
  import argparse
  import json
  import sys

  from jaxnet import config_io, errors

  argv = sys.argv[1:] if argv is None else argv
  parser = argparse.ArgumentParser(prog="python -m jaxnet.gpu_plan", description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", required=True, help="configs/NAME.py[:ARG], as for training")
  parser.add_argument("--target", default="h100", help="h100, h200, a100, or a .txtpb path")
  parser.add_argument("--gpus", type=int, default=8, help="GPUs in all (over all hosts)")
  parser.add_argument("--hosts", type=int, default=1)
  parser.add_argument("--find-max-batch", action="store_true",
                      help="also find the largest per-GPU batch that fits (several compiles)")
  parser.add_argument("--dump", default="", help="write the optimized HLO of both steps here")
  parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
  with errors.one_line_errors():
    rest, overrides = config_io.split_command_line(argv)
    args = parser.parse_args(rest)
    # Before jax starts: compile on this CPU process, never start the CUDA backend (jax#28376).
    os.environ["JAX_PLATFORMS"] = "cpu"
    gpu_compile.check_plugin()
    from jaxnet import xla_flags
    xla_flags.apply()
    config = config_io.load(args.config, overrides)
    log = lambda line: print(line, file=sys.stderr, flush=True)
    result = plan(config, target=args.target, gpus=args.gpus, hosts=args.hosts, dump=args.dump,
                  find_max_batch=args.find_max_batch, log=log)
  print(json.dumps(result, indent=1, default=str) if args.json else table(result))


if __name__ == "__main__":
  main()
