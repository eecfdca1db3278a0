"""jax, jaxlib and XLA: the versions with a known XLA:CPU bug, the flags jaxnet asks of XLA
on GPUs, jax's distributed client, and the two XLA failures jaxnet tells apart by their text.
"""

import importlib.metadata
import os
import re

# XLA:CPU's YNNPACK fusion in jaxlib 0.11.2 to 0.12.x computes a bf16 relu -> matmul ->
# relu -> sum, fused into one kernel, as inf/NaN. Every eval-mode ResNet contains that chain
# (batch norm is elementwise in eval mode; the global average pool is the sum), so bf16
# evaluations on a CPU came out NaN while training looked fine. jaxlib 0.10.0 to 0.11.1
# compute it correctly. The empty fusion list turns the fusion off (the command line sets it,
# jaxnet/cli/process.py); the standalone reproduction is in docs/models.md and
# tests/test_adapters.py, which fails for a jaxlib outside this range that computes it wrong
# (widen the range) and for one inside it that has fixed it (narrow it). The range is closed:
# an unknown flag in XLA_FLAGS aborts XLA, and a later jaxlib may no longer define this one.
YNN_FUSION_OFF = "--xla_cpu_experimental_ynn_fusion_type="
YNN_BUG_VERSIONS = ((0, 11, 2), (0, 13))  # [first with the bug, first not checked)

# XLA flags for multi-GPU data parallelism (never on CPU): the latency-hiding scheduler
# overlaps gradient all-reduces with the backward pass; combining all-reduces into larger
# buffers amortises NCCL's launch cost. The command line puts them in XLA_FLAGS on a machine
# with a GPU plugin; `python -m jaxnet.cli.gpu_plan` compiles with them.
GPU_XLA_FLAGS = ("--xla_gpu_enable_latency_hiding_scheduler=true",
                 "--xla_gpu_all_reduce_combine_threshold_bytes=134217728")

GPU_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")

# config.distributed.cluster_profile: opt-in settings for a kind of cluster, on top of
# GPU_XLA_FLAGS (a profile's flag replaces a default of the same name; the user's XLA_FLAGS and
# environment variables still win). "h100" is what NVIDIA's JAX-Toolbox documents for H100
# training (rosetta/docs/GPU_performance.md; docs/multihost.md cites each setting): collectives
# on their own highest-priority stream, FSDP's all-gathers and reduce-scatters combined into
# large buffers, not by dimension; loops double-buffered; one CUDA queue so that the
# latency-hiding scheduler's order is the order the GPU runs; NCCL's protocols and NVLink
# SHARP (NVLS) all-reduce on NVLink4. Left out: the all-reduce threshold stays GPU_XLA_FLAGS'
# 128 MiB (JAX-Toolbox's 8 GiB combines a data-parallel step's gradients into one all-reduce
# that cannot start before the backward pass ends), and the xla_gpu_enable_pipelined_* flags,
# which jaxlib 0.12's XLA no longer has (a compile option naming one is refused).
CLUSTER_PROFILES = {
    "h100": {
        "xla_flags": ("--xla_gpu_enable_latency_hiding_scheduler=true",
                      "--xla_gpu_enable_highest_priority_async_stream=true",
                      "--xla_gpu_all_gather_combine_threshold_bytes=8589934592",
                      "--xla_gpu_reduce_scatter_combine_threshold_bytes=8589934592",
                      "--xla_gpu_enable_all_gather_combine_by_dim=false",
                      "--xla_gpu_enable_reduce_scatter_combine_by_dim=false",
                      "--xla_gpu_enable_while_loop_double_buffering=true"),
        "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1",
                "NCCL_PROTO": "SIMPLE,LL,LL128",
                "NCCL_NVLS_ENABLE": "1",
                "NCCL_LL_BUFFSIZE": "-2",
                "NCCL_LL128_BUFFSIZE": "-2"},
    },
}


def profile_flags(profile: str) -> list[str]:
  """The GPU flags of a run with cluster profile `profile` ("" for none): the profile's, then
  each of GPU_XLA_FLAGS the profile does not name."""
  flags = list(CLUSTER_PROFILES[profile]["xla_flags"]) if profile else []
  named = {flag_name(f) for f in flags}
  return flags + [f for f in GPU_XLA_FLAGS if flag_name(f) not in named]


def flag_name(flag: str) -> str:
  """'--xla_foo=1' -> 'xla_foo'."""
  return flag.lstrip("-").split("=", 1)[0]


def version_tuple(version: str) -> tuple:
  """'0.12.0.1' -> (0, 12, 0, 1); '0.13.0.dev20260101' -> (0, 13, 0)."""
  return tuple(int(p) for p in re.match(r"\d+(?:\.\d+)*", version).group(0).split("."))


def jaxlib_version() -> tuple | None:
  try:
    return version_tuple(importlib.metadata.version("jaxlib"))
  except importlib.metadata.PackageNotFoundError:
    return None


def has_ynn_bug(version: tuple | None) -> bool:
  """Whether jaxlib `version` is one whose YNNPACK fusion miscomputes bf16 (see above)."""
  first, unchecked = YNN_BUG_VERSIONS
  return version is not None and first <= version < unchecked


def ynn_hint(precision: str, platform: str) -> str:
  """For an error about a non-finite bf16 CPU result: the YNNPACK bug, if it can be the cause."""
  active = {flag_name(f): f for f in os.environ.get("XLA_FLAGS", "").split()}
  if (precision != "bf16" or platform != "cpu" or not has_ynn_bug(jaxlib_version())
      or active.get(flag_name(YNN_FUSION_OFF)) == YNN_FUSION_OFF):
    return ""
  return (f"This jaxlib's XLA:CPU YNNPACK fusion computes some bf16 results as NaN (docs/models.md): "
          f"start the process with XLA_FLAGS={YNN_FUSION_OFF} (the command line sets it unless "
          f"XLA_FLAGS already sets that flag). ")


def distributed_client():
  """jax.distributed's client (its key-value store is what the heartbeat uses), or None when
  jax.distributed is not initialised. jax has no public accessor: this is its private
  global state, the one orbax's barriers use too."""
  from jax._src import distributed
  return distributed.global_state.client


def is_runtime_failure(error: BaseException) -> bool:
  """Whether `error` is jax's runtime's (a failed collective, a lost coordination service):
  in a multi-process run, possibly the first sign of a process that died."""
  import jax
  return isinstance(error, jax.errors.JaxRuntimeError)


def is_triton_tiling_failure(error: BaseException) -> bool:
  """XLA's GPU compiler could not tile a matmul for Triton without autotuning (compiling with
  no device present, e.g. ViT-B/16's projections on jaxlib 0.10.2)."""
  return "tile sizes" in str(error)
