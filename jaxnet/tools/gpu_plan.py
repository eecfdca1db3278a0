"""jaxnet's train and eval steps compiled for GPUs this machine does not have, and what they
would do (`python -m jaxnet.cli.gpu_plan`).

XLA can compile for a CUDA target on a machine with no GPU, given the CUDA plugin wheels of
the installed jaxlib (`--install-plugin` puts them in a cache folder, `plugin_dir`; no CUDA
libraries needed) and a description of the device (jaxnet/tools/gpu_targets/*.txtpb).
The steps compiled are the ones training runs, built by `jaxnet.core.experiment.Experiment`
over the target's devices, on synthetic data of the config's shapes (only the batch's shape
matters; progressive resizing is off: the steps are compiled at config.image_size). The
plan reads the compiled program (jaxnet/tools/hlo.py) and its memory analysis. Without a
device there is no autotuning: this shows the program's structure and memory, not its speed
(the roofline is an upper bound on images/s, not a prediction).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
import os
import re

from jaxnet.core.adapters import xla
from jaxnet.core.errors import UserError
from jaxnet.core.metrics import prepare_output, write_atomically

TARGETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_targets")
PLUGINS = (("jax-cuda12-plugin", "jax-cuda12-pjrt"), ("jax-cuda13-plugin", "jax-cuda13-pjrt"))
GIB = 2.0**30


def plugin_dir(version: str | None = None) -> str:
  """Where the CUDA plugin wheels of jaxlib `version` (default: the installed one) live for the
  plan: a folder of jaxnet's cache (JAXNET_CUDA_PLUGIN_DIR, else
  ~/.cache/jaxnet/cuda-plugin/VERSION), outside every Python environment, so that no other jax
  program loads them: installed into an environment, the plugin makes every jax program on a
  machine without a GPU print jax's plugin configuration error, with tracebacks."""
  if os.environ.get("JAXNET_CUDA_PLUGIN_DIR"):
    return os.environ["JAXNET_CUDA_PLUGIN_DIR"]
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "jaxnet", "cuda-plugin", version or importlib.metadata.version("jaxlib"))


def install_hint(version: str) -> str:
  return (f"rerun with --install-plugin (it puts jax-cuda12-plugin=={version} and "
          f"jax-cuda12-pjrt=={version}, about 480 MB installed, in {plugin_dir(version)}, outside "
          f"your Python environment; no CUDA libraries or GPU needed)")


def folder_plugin_versions(folder: str) -> dict[str, str]:
  """{distribution name: version} of the plugin wheels installed in `folder` (an --install-plugin
  folder); {} when it holds none."""
  if not os.path.isdir(folder):
    return {}
  names = {name for pair in PLUGINS for name in pair}
  return {d.metadata["Name"]: d.version for d in importlib.metadata.distributions(path=[folder])
          if d.metadata["Name"] in names}


def folder_matches(folder: str, version: str | None = None) -> bool:
  """Whether `folder` holds a plugin and its PJRT of jaxlib `version` (default: the installed one)."""
  version = version or importlib.metadata.version("jaxlib")
  found = folder_plugin_versions(folder)
  return any(found.get(plugin) == found.get(pjrt) == version for plugin, pjrt in PLUGINS)


def check_plugin() -> str:
  """The CUDA plugin's name, found in the Python environment or in plugin_dir() (which the
  command line puts on sys.path); a UserError naming the fix when none matches jaxlib."""
  jaxlib = importlib.metadata.version("jaxlib")
  found = []
  for plugin, pjrt in PLUGINS:
    try:
      versions = (importlib.metadata.version(plugin), importlib.metadata.version(pjrt))
    except importlib.metadata.PackageNotFoundError:
      continue
    if versions == (jaxlib, jaxlib):
      return plugin
    found.append(f"{plugin} {versions[0]} / {pjrt} {versions[1]}")
  if found:
    raise UserError(f"the CUDA plugin ({', '.join(found)}) does not match jaxlib {jaxlib}: "
                    f"{install_hint(jaxlib)}")
  raise UserError(f"compiling for a GPU target needs the CUDA plugin of jaxlib {jaxlib}: "
                  f"{install_hint(jaxlib)}")


def target_text(target: str) -> tuple[str, str]:
  """(name, GpuTargetConfigProto text) for a known target name or a .txtpb path."""
  path = target if os.path.isfile(target) else os.path.join(TARGETS_DIR, f"{target}.txtpb")
  if not os.path.isfile(path):
    known = sorted(f[:-6] for f in os.listdir(TARGETS_DIR) if f.endswith(".txtpb"))
    raise UserError(f"unknown --target={target}: use one of {', '.join(known)}, or the path of a "
                    f"GpuTargetConfigProto text file (see jaxnet/tools/gpu_targets/)")
  text = open(path).read()
  missing = [k for k in ("device_memory_size", "memory_bandwidth") if not re.search(rf"{k}:\s*\d+", text)]
  if missing:
    raise UserError(f"--target={target}: {path} is no GPU description jaxnet can read (no "
                    f"{' or '.join(missing)}); start from a file in jaxnet/tools/gpu_targets/")
  return os.path.splitext(os.path.basename(path))[0] if os.path.isfile(target) else target, text


def device_memory(text: str) -> int:
  return int(re.search(r"device_memory_size:\s*(\d+)", text).group(1))


def bandwidth(text: str) -> float:
  return float(re.search(r"memory_bandwidth:\s*(\d+)", text).group(1))


def topology_devices(text: str, gpus: int, hosts: int = 1):
  """The devices of `hosts` x (gpus / hosts) GPUs described by `text`, for compiling only."""
  import jax
  from jax.experimental import topologies
  if gpus < 1 or hosts < 1:
    raise UserError(f"--gpus={gpus} --hosts={hosts}: give at least 1 of each")
  if gpus % hosts:
    raise UserError(f"--gpus={gpus} does not split over --hosts={hosts}: use a multiple of {hosts}")
  try:
    topology = topologies.get_topology_desc(platform="cuda", target_config=text,
                                            topology=f"1x{hosts}x{gpus // hosts}")
  except jax.errors.JaxRuntimeError as e:  # XLA refused the description
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UserError(f"XLA cannot compile for this GPU description ({first}); start from a file "
                    f"in jaxnet/tools/gpu_targets/") from None
  return list(topology.devices)


def plan_config(config, per_gpu_batch: int | None = None, gpus: int = 1):
  """A copy of `config` whose data is synthetic images of the same size (nothing is read)."""
  config = copy.deepcopy(config)
  with config.unlocked():
    if per_gpu_batch:  # Experiment checks that it splits (into micro-batches, over the GPUs)
      config.batch_size = per_gpu_batch * gpus
      if config.data.eval_batch_size:
        config.data.eval_batch_size = config.batch_size
    config.data.source = "synthetic"
    config.data.synthetic_size = config.batch_size
    config.progressive_resizing = ()
    config.mesh.num_devices = 0
  return config


@dataclasses.dataclass
class Compiled:
  """One compiled step: its optimized HLO and per-GPU memory (bytes)."""
  hlo: str
  arguments: int
  outputs: int
  aliased: int
  temporaries: int
  code: int
  options: dict = dataclasses.field(default_factory=dict)  # XLA options it needed

  @property
  def total(self) -> int:
    """Bytes in use on each GPU while the step runs: donated (aliased) outputs reuse inputs."""
    return self.arguments + self.outputs - self.aliased + self.temporaries + self.code


# Without a device XLA cannot autotune, and its Triton GEMM emitter can then fail to tile a
# matmul ("Couldn't find output tile sizes", e.g. ViT-B/16's projections on jaxlib 0.10.2).
# Such a step is compiled again with those matmuls on cuBLAS, which a real run's autotuner
# may also pick; the plan says so.
NO_TRITON_GEMM = {"xla_gpu_enable_triton_gemm": False}


def run_options(profile: str = "") -> dict:
  """The XLA flags a GPU run gets from the command line (xla.GPU_XLA_FLAGS: latency-hiding
  scheduler, all-reduce combine threshold; with config.distributed.cluster_profile, that
  profile's), as compile options; a flag set in XLA_FLAGS is left to XLA_FLAGS."""
  user = {xla.flag_name(f) for f in os.environ.get("XLA_FLAGS", "").split()}
  options = {}
  for flag in xla.profile_flags(profile):
    name, _, value = flag.lstrip("-").partition("=")
    if name not in user:  # compile options are typed: "true" -> True, "134217728" -> int
      options[name] = {"true": True, "false": False}.get(value, int(value) if value.isdigit() else value)
  return options


def compile_step(jitted, *args, profile: str = "") -> Compiled:
  import jax
  lowered = jitted.lower(*args)
  options = run_options(profile)
  try:
    compiled = lowered.compile(compiler_options=options)
  except jax.errors.JaxRuntimeError as e:
    if not xla.is_triton_tiling_failure(e):
      raise
    options = {**options, **NO_TRITON_GEMM}
    compiled = lowered.compile(compiler_options=options)
  m = compiled.memory_analysis()
  return Compiled(compiled.as_text(), m.argument_size_in_bytes, m.output_size_in_bytes,
                  m.alias_size_in_bytes, m.temp_size_in_bytes, m.generated_code_size_in_bytes, options)


def abstract_batch(exp, batch_size: int) -> dict:
  """The batch the pipeline delivers (jaxnet/core/data/pipeline.py; the task's fields), as
  shapes sharded over the mesh."""
  import jax
  import jax.numpy as jnp
  s = exp.batch_sharding
  shape = lambda dims, dtype: jax.ShapeDtypeStruct((batch_size,) + tuple(dims), jnp.dtype(dtype), sharding=s)
  batch = {"image": shape(exp.image_shape, "uint8"), "mask": shape((), "bool"), "corrupt": shape((), "int32")}
  return {**batch, **{k: shape(dims, dtype) for k, (dims, dtype) in exp.task.batch_fields(exp.config).items()}}


def param_sizes(abstract_state) -> list:
  """The element count of each parameter."""
  import jax
  import numpy as np
  return [int(np.prod(x.shape)) for x in jax.tree.leaves(abstract_state.params)]


def weight_elements(abstract_state) -> set:
  """The element counts of the parameters and, under FSDP, of each device's shard of them
  (what a weight-sized transpose moves)."""
  import jax
  import numpy as np
  sizes = set(param_sizes(abstract_state))
  for x in jax.tree.leaves(abstract_state.params):
    if getattr(x, "sharding", None) is not None:
      sizes.add(int(np.prod(x.sharding.shard_shape(x.shape))))
  return sizes


def build(config, devices, *, eval_step: bool = True, profile: str | None = None):
  """Experiment over `devices`, and its compiled (train, eval) steps, with the XLA options of
  cluster profile `profile` (default: the config's distributed.cluster_profile)."""
  from jaxnet.core import models
  from jaxnet.core.experiment import Experiment
  profile = cluster_profile(config) if profile is None else profile
  exp = Experiment(config, devices=devices)
  with models.tracing_for("gpu"):  # the kernels a GPU run picks (e.g. ViT's cuDNN attention)
    train = compile_step(exp.train_step, exp.abstract_state, abstract_batch(exp, config.batch_size),
                         profile=profile)
    evaluation = None
    if eval_step:
      evaluation = compile_step(exp.eval_step, exp.abstract_state,
                                abstract_batch(exp, config.data.eval_batch_size or config.batch_size),
                                profile=profile)
  return exp, train, evaluation


def cluster_profile(config) -> str:
  """config.distributed.cluster_profile, or a UserError naming the profiles there are."""
  name = str(config.distributed.get("cluster_profile", ""))
  if name and name not in xla.CLUSTER_PROFILES:
    raise UserError(f"distributed.cluster_profile={name!r} is not a profile: use "
                    f"{', '.join(sorted(xla.CLUSTER_PROFILES))}, or '' for none")
  return name


def profile_changes(config, devices, train: Compiled, analysis) -> dict:
  """What the config's cluster profile changes in the train step: the step compiled again
  with only the default flags, and both steps' kernels and collectives side by side."""
  from jaxnet.tools import hlo
  profile = cluster_profile(config)
  exp, default, _ = build(config, devices, eval_step=False, profile="")
  base = hlo.summary(analyse_step(default, exp.abstract_state, config.batch_size // len(devices)))
  with_profile = hlo.summary(analysis)
  return {"profile": profile, "environment": dict(xla.CLUSTER_PROFILES[profile]["env"]),
          "options": {k: v for k, v in train.options.items() if default.options.get(k) != v},
          "kernels": (base["kernels"], with_profile["kernels"]),
          "fusions": (base["fusions"], with_profile["fusions"]),
          "collectives": {op: ((base["collectives"].get(op) or {}).get("count", 0),
                               (with_profile["collectives"].get(op) or {}).get("count", 0),
                               (base["collectives"].get(op) or {}).get("exposed", 0),
                               (with_profile["collectives"].get(op) or {}).get("exposed", 0))
                          for op in sorted(set(base["collectives"]) | set(with_profile["collectives"]))},
          "temporaries": (default.temporaries, train.temporaries)}


def analyse_step(compiled: Compiled, state_abstract, per_gpu_batch: int):
  from jaxnet.tools import hlo
  # A transpose of at least 1024 values per example is activation-sized (logits are not).
  return hlo.analyse(compiled.hlo, weight_elements=weight_elements(state_abstract),
                              min_activation_elements=per_gpu_batch * 1024)


# What else a run keeps in the pool besides the step: allocator fragmentation and jax's own
# buffers, a stated guess (not measured on a GPU) of this fraction of the pool.
MARGIN = 0.03


def batch_bytes(config, per_gpu_batch: int, channels: int) -> int:
  """One batch as it waits on a GPU: uint8 images, int32 label and corrupt, bool mask."""
  return per_gpu_batch * (config.image_size ** 2 * channels + 4 + 4 + 1)


def run_bytes(config, step_bytes: int, per_gpu_batch: int, channels: int, usable: float) -> float:
  """What a run keeps on each GPU at this per-GPU batch: the step's memory (train or eval,
  whichever is larger), data.prefetch batches read ahead of it, and the MARGIN."""
  return (step_bytes + config.data.prefetch * batch_bytes(config, per_gpu_batch, channels)
          + MARGIN * usable)


def largest_batch(config, devices, usable: float, start: int, log=None) -> dict:
  """The largest per-GPU batch a run fits in `usable` bytes (run_bytes: the train step, the
  batches prefetched beside it, a margin), found by compiling: doubling (or halving) from
  `start`, then bisecting to within 1/8 of the answer. At the answer the eval step is
  compiled too, and the headroom left is what remains of the pool beside the larger step."""
  gpus, tried, channels = len(devices), {}, len(config.data.mean)
  if log:  # minutes of compiling: say so first, then each try before its compile
    log(f"finding the largest per-GPU batch that fits: one train-step compile per try (each as "
        f"long as the first), from {start} per GPU, doubling or halving, then bisecting")

  def fits(per_gpu):
    if per_gpu not in tried:
      if log:
        log(f"  per-GPU batch {per_gpu}: compiling ...")
      _, train, _ = build(plan_config(config, per_gpu, gpus), devices, eval_step=False)
      tried[per_gpu] = run_bytes(config, train.total, per_gpu, channels, usable)
      if log:
        log(f"  per-GPU batch {per_gpu}: step {train.total / GIB:.2f} GiB, with {config.data.prefetch} "
            f"prefetched batches and the margin {tried[per_gpu] / GIB:.2f} GiB "
            f"({'fits' if tried[per_gpu] <= usable else 'does not fit'})")
    return tried[per_gpu] <= usable

  lo, hi = 0, None
  b = start
  if fits(b):
    lo = b
    while hi is None and b < 1 << 15:
      b *= 2
      if fits(b):
        lo = b
      else:
        hi = b
  else:
    hi = b
    while b > 1 and lo == 0:
      b //= 2
      if fits(b):
        lo = b
      else:
        hi = b
  while hi is not None and lo and hi - lo > max(1, lo // 8):
    mid = (lo + hi) // 2
    if fits(mid):
      lo = mid
    else:
      hi = mid
  result = {"per_gpu_batch": lo, "tried": tried}
  if hi is None:
    result["exact"] = False
  else:
    result["does_not_fit"] = hi
  if lo:
    if log:
      log(f"  per-GPU batch {lo} fits: compiling its eval step too ...")
    _, train, evaluation = build(plan_config(config, lo, gpus), devices)
    needed = run_bytes(config, max(train.total, evaluation.total), lo, channels, usable)
    result.update(headroom_bytes=usable - needed, train_bytes=train.total, eval_bytes=evaluation.total,
                  prefetch_bytes=config.data.prefetch * batch_bytes(config, lo, channels),
                  margin_bytes=MARGIN * usable)
  return result


# --- the plan --------------------------------------------------------------------------

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
  """Which attention a step got (a model whose class declares ATTENTION), and why (only its fused cuDNN form shows as a library call)."""
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
          f"uses the fused kernel (jaxnet/core/models/vit.py), so its attention is faster and smaller "
          f"than shown")


def mem_fraction() -> float:
  return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", DEFAULT_MEM_FRACTION))


def plan(config, *, target: str = "h100", gpus: int = 8, hosts: int = 1, dump: str = "",
         find_max_batch: bool = False, log=None) -> dict:
  """Compiles `config`'s train and eval steps for `gpus` GPUs of `target`; returns the numbers."""
  from jaxnet.core import models
  from jaxnet.tools import hlo
  if dump:  # before minutes of compiling
    prepare_output(os.path.join(dump, "train_step.hlo.txt"))
  check_plugin()
  name, text = target_text(target)
  devices = topology_devices(text, gpus, hosts)
  config = plan_config(config)
  if log:
    log(f"compiling the train and eval steps of {config.model.name} for {gpus}x {name} ...")
  exp, train, evaluation = build(config, devices)
  per_gpu = config.batch_size // gpus
  analysis = analyse_step(train, exp.abstract_state, per_gpu)
  eval_batch = config.data.eval_batch_size or config.batch_size
  eval_analysis = analyse_step(evaluation, exp.abstract_state, eval_batch // gpus)
  if dump:
    for step, compiled in (("train", train), ("eval", evaluation)):
      write_atomically(os.path.join(dump, f"{step}_step.{name}.{gpus}gpu.hlo.txt"), compiled.hlo)
  memory = device_memory(text)
  usable = memory * mem_fraction()
  result = {
      "target": name, "device": devices[0].device_kind, "gpus": gpus, "hosts": hosts,
      "model": config.model.name, "precision": config.precision, "image_size": config.image_size,
      "batch_size": config.batch_size, "per_gpu_batch": per_gpu,
      "params_bytes": 4 * sum(param_sizes(exp.abstract_state)),
      "memory": {"arguments": train.arguments, "outputs": train.outputs, "aliased": train.aliased,
                 "temporaries": train.temporaries, "total": train.total, "device": memory,
                 "usable": usable, "fits": train.total <= usable,
                 "eval_total": evaluation.total},
      "train": hlo.summary(analysis),
      "eval": hlo.summary(eval_analysis),
      "attention": attention_lowering(analysis) if models.declared(config.model.name, "ATTENTION") else "",
      "xla_options": {**train.options, **evaluation.options},
      "transposes": [t for t in analysis.transposes if t["size"] == "activation"],
      "gradient_collectives": analysis.collectives,
      "fsdp": exp.fsdp_summary.line() if exp.fsdp_summary else "",
  }
  peaks = PEAK_FLOPS.get(name)
  if peaks:
    hbm_bandwidth = bandwidth(text)
    seconds = analysis.roofline_seconds(peaks, hbm_bandwidth)
    result["layers"] = hlo.layer_table(analysis, peaks, hbm_bandwidth)
    result["roofline"] = {"step_seconds": seconds, "images_per_second": config.batch_size / seconds,
                          "compute_seconds": sum(k.count * k.flops / (peaks.get(k.dtype) or max(peaks.values()))
                                                 for k in analysis.kernels),
                          "memory_seconds": analysis.hbm_bytes / hbm_bandwidth}
  if cluster_profile(config):
    result["cluster_profile"] = profile_changes(config, devices, train, analysis)
  if find_max_batch:
    result["max_per_gpu_batch"] = largest_batch(config, devices, usable, per_gpu, log=log)
  return result


def table(r: dict) -> str:
  """The plan as the lines the command prints."""
  m, t = r["memory"], r["train"]
  lines = [f"{r['model']} {r['precision']} {r['image_size']}px, batch {r['batch_size']} "
           f"({r['per_gpu_batch']}/GPU) on {r['gpus']}x {r['device']} ({r['hosts']} host(s)): "
           f"compiled on a CPU for a GPU target, not run",
           f"XLA options (a run's, from the command line, unless XLA_FLAGS sets them): "
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
    lines.append(f"  largest per-GPU batch a run fits (step, {mb.get('prefetch_bytes', 0) / GIB:.2f} GiB of "
                 f"prefetched batches, a {MARGIN:.0%} margin): {mb['per_gpu_batch']}{bound}")
    if "headroom_bytes" in mb:
      lines.append(f"  at {mb['per_gpu_batch']}: train step {mb['train_bytes'] / GIB:.2f} GiB, eval step "
                   f"{mb['eval_bytes'] / GIB:.2f} GiB; headroom left {mb['headroom_bytes'] / GIB:.2f} GiB")
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
      lines.append(f"collectives: {op} x{c['count']} ({c['combined']} combining several tensors, "
                   f"{c['exposed']} exposed: no compute scheduled between start and done), "
                   f"{c['bytes'] / 2**20:.1f} MiB per step (fp32 params: {r['params_bytes'] / 2**20:.1f} MiB)")
  else:
    lines.append("collectives: none")
  if "cluster_profile" in r:
    lines += profile_lines(r["cluster_profile"])
  if "roofline" in r:
    rf = r["roofline"]
    lines.append(f"roofline: {t['flops'] / 1e12:.2f} TFLOP and {t['hbm_bytes'] / GIB:.2f} GiB of HBM "
                 f"traffic per GPU per step -> at least {rf['step_seconds'] * 1e3:.2f} ms/step, at most "
                 f"{rf['images_per_second']:,.0f} img/s (an upper bound, not a prediction)")
  return "\n".join(lines)


def layer_lines(r: dict) -> list[str]:
  """The train step's kernels by layer, part and pass (jaxnet.tools.hlo.layer_table): kernels,
  HBM bytes (operands + results of each kernel) and the roofline ms of each row, in the order
  the step first runs them; the rows add up to the plan's roofline."""
  rows = r.get("layers") or []
  total = sum(row["ms"] for row in rows) or 1.0
  lines = [f"per layer (train step, {r['target']}: each kernel at max(FLOPs / peak, bytes / HBM bandwidth), "
           f"a bound, not a measurement):",
           f"  {'layer':<12} {'part':<18} {'pass':<9} {'kernels':>7} {'GiB':>7} {'GFLOP':>8} {'ms':>7} {'share':>6}"]
  for row in rows:
    lines.append(f"  {row['layer'][:12]:<12} {row['part'][:18]:<18} {row['pass']:<9} {row['kernels']:>7} "
                 f"{row['bytes'] / GIB:>7.2f} {row['flops'] / 1e9:>8.1f} {row['ms']:>7.3f} {row['ms'] / total:>6.1%}")
  return lines


def profile_lines(p: dict) -> list[str]:
  """profile_changes(...) as the lines the plan prints: defaults -> with the profile."""
  lines = [f"distributed.cluster_profile={p['profile']} (above) beside the defaults: options "
           f"{' '.join(f'{k}={v}' for k, v in p['options'].items()) or 'none changed'}; "
           f"environment {' '.join(f'{k}={v}' for k, v in p['environment'].items())}",
           f"  train step kernels {p['kernels'][0]} -> {p['kernels'][1]} (fusions {p['fusions'][0]} -> "
           f"{p['fusions'][1]}), temporaries {p['temporaries'][0] / GIB:.2f} -> {p['temporaries'][1] / GIB:.2f} GiB"]
  for op, (count, new_count, exposed, new_exposed) in p["collectives"].items():
    lines.append(f"  {op}: x{count} -> x{new_count}, exposed {exposed} -> {new_exposed}")
  return lines
