"""jaxnet's train and eval steps compiled for GPUs this machine does not have.

XLA can compile for a CUDA target on a machine with no GPU, given the CUDA plugin wheels of
the installed jaxlib (`pip install --no-deps jax-cuda12-plugin==V jax-cuda12-pjrt==V`, no
CUDA libraries needed) and a description of the device (jaxnet/gpu_targets/*.txtpb). The
steps compiled are the ones training runs, built by `jaxnet.experiment.Experiment` over the
target's devices, on synthetic data of the config's shapes. `python -m jaxnet.gpu_plan`
(jaxnet/gpu_plan.py) turns what is compiled here into its table.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
import os
import re

from jaxnet.errors import UserError

TARGETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_targets")
PLUGINS = (("jax-cuda12-plugin", "jax-cuda12-pjrt"), ("jax-cuda13-plugin", "jax-cuda13-pjrt"))
GIB = 2.0**30


def install_hint(version: str) -> str:
  return f"pip install --no-deps jax-cuda12-plugin=={version} jax-cuda12-pjrt=={version}"


def check_plugin() -> str:
  """The installed CUDA plugin's name; a UserError naming the fix when none matches jaxlib."""
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
  raise UserError(f"compiling for a GPU target needs the CUDA plugin of jaxlib {jaxlib} "
                  f"(no CUDA libraries or GPU needed): {install_hint(jaxlib)}")


def target_text(target: str) -> tuple[str, str]:
  """(name, GpuTargetConfigProto text) for a known target name or a .txtpb path."""
  if os.path.isfile(target):
    return os.path.splitext(os.path.basename(target))[0], open(target).read()
  path = os.path.join(TARGETS_DIR, f"{target}.txtpb")
  if not os.path.isfile(path):
    known = sorted(f[:-6] for f in os.listdir(TARGETS_DIR) if f.endswith(".txtpb"))
    raise UserError(f"unknown --target={target}: use one of {', '.join(known)}, or the path of a "
                    f"GpuTargetConfigProto text file (see jaxnet/gpu_targets/)")
  return target, open(path).read()


def device_memory(text: str) -> int:
  return int(re.search(r"device_memory_size:\s*(\d+)", text).group(1))


def bandwidth(text: str) -> float:
  return float(re.search(r"memory_bandwidth:\s*(\d+)", text).group(1))


def topology_devices(text: str, gpus: int, hosts: int = 1):
  """The devices of `hosts` x (gpus / hosts) GPUs described by `text`, for compiling only."""
  from jax.experimental import topologies
  if gpus < 1 or hosts < 1 or gpus % hosts:
    raise UserError(f"--gpus={gpus} does not split over --hosts={hosts}: use a multiple of {hosts}")
  topology = topologies.get_topology_desc(platform="cuda", target_config=text,
                                          topology=f"1x{hosts}x{gpus // hosts}")
  return list(topology.devices)


def plan_config(config, per_gpu_batch: int | None = None, gpus: int = 1):
  """A copy of `config` whose data is synthetic images of the same size (nothing is read)."""
  config = copy.deepcopy(config)
  with config.unlocked():
    if per_gpu_batch:
      accum = max(config.grad_accum_steps, 1)
      config.batch_size = per_gpu_batch * gpus
      if config.batch_size % (gpus * accum):
        raise UserError(f"batch {config.batch_size} does not split into {accum} micro-batches "
                        f"over {gpus} GPUs")
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


def run_options() -> dict:
  """The XLA flags a GPU run gets from jaxnet.runtime (latency-hiding scheduler, all-reduce
  combine threshold), as compile options; a flag set in XLA_FLAGS is left to XLA_FLAGS."""
  from jaxnet import runtime, xla_flags
  user = {xla_flags.flag_name(f) for f in os.environ.get("XLA_FLAGS", "").split()}
  options = {}
  for flag in runtime.default_xla_flags("gpu").split():
    name, _, value = flag.lstrip("-").partition("=")
    if name not in user:  # compile options are typed: "true" -> True, "134217728" -> int
      options[name] = {"true": True, "false": False}.get(value, int(value) if value.isdigit() else value)
  return options


def compile_step(jitted, *args) -> Compiled:
  import jax
  lowered = jitted.lower(*args)
  options = run_options()
  try:
    compiled = lowered.compile(compiler_options=options)
  except jax.errors.JaxRuntimeError as e:
    if "tile sizes" not in str(e):
      raise
    options = {**options, **NO_TRITON_GEMM}
    compiled = lowered.compile(compiler_options=options)
  m = compiled.memory_analysis()
  return Compiled(compiled.as_text(), m.argument_size_in_bytes, m.output_size_in_bytes,
                  m.alias_size_in_bytes, m.temp_size_in_bytes, m.generated_code_size_in_bytes, options)


def abstract_batch(exp, batch_size: int) -> dict:
  """The batch the pipeline delivers (jaxnet/data/pipeline.py), as shapes sharded over the mesh."""
  import jax
  import jax.numpy as jnp
  s = exp.batch_sharding
  return {"image": jax.ShapeDtypeStruct((batch_size,) + exp.image_shape, jnp.uint8, sharding=s),
          "label": jax.ShapeDtypeStruct((batch_size,), jnp.int32, sharding=s),
          "mask": jax.ShapeDtypeStruct((batch_size,), jnp.bool_, sharding=s),
          "corrupt": jax.ShapeDtypeStruct((batch_size,), jnp.int32, sharding=s)}


def param_sizes(abstract_state) -> list:
  """The element count of each parameter."""
  import jax
  import numpy as np
  return [int(np.prod(x.shape)) for x in jax.tree.leaves(abstract_state.params)]


def weight_elements(abstract_state) -> set:
  """The element counts of the parameters (what a weight-sized transpose moves)."""
  return set(param_sizes(abstract_state))


def build(config, devices, *, eval_step: bool = True):
  """Experiment over `devices`, and its compiled (train, eval) steps."""
  from jaxnet import models
  from jaxnet.experiment import Experiment
  exp = Experiment(config, devices=devices)
  with models.tracing_for("gpu"):  # the kernels a GPU run picks (e.g. ViT's cuDNN attention)
    train = compile_step(exp.train_step, exp.abstract_state, abstract_batch(exp, config.batch_size))
    evaluation = None
    if eval_step:
      evaluation = compile_step(exp.eval_step, exp.abstract_state,
                                abstract_batch(exp, config.data.eval_batch_size or config.batch_size))
  return exp, train, evaluation


def analyse_step(compiled: Compiled, state_abstract, per_gpu_batch: int):
  from jaxnet import hlo_analysis
  # A transpose of at least 1024 values per example is activation-sized (logits are not).
  return hlo_analysis.analyse(compiled.hlo, weight_elements=weight_elements(state_abstract),
                              min_activation_elements=per_gpu_batch * 1024)


def largest_batch(config, devices, usable: float, start: int, log=None) -> dict:
  """The largest per-GPU batch whose train step fits in `usable` bytes, found by compiling:
  doubling (or halving) from `start`, then bisecting to within 1/8 of the answer."""
  gpus, tried = len(devices), {}

  def fits(per_gpu):
    if per_gpu not in tried:
      _, train, _ = build(plan_config(config, per_gpu, gpus), devices, eval_step=False)
      tried[per_gpu] = train.total
      if log:
        log(f"  per-GPU batch {per_gpu}: {train.total / GIB:.2f} GiB "
            f"({'fits' if train.total <= usable else 'does not fit'})")
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
  if hi is None:
    return {"per_gpu_batch": lo, "exact": False, "tried": tried}
  while lo and hi - lo > max(1, lo // 8):
    mid = (lo + hi) // 2
    if fits(mid):
      lo = mid
    else:
      hi = mid
  return {"per_gpu_batch": lo, "does_not_fit": hi, "tried": tried}
