"""Train-step throughput of jaxnet, side by side with two peers, data already on the device.

    python experiments/bench_train.py                 # GPU defaults: resnet50, 224px, 64/128/256 per device
    python experiments/bench_train.py --quick         # CPU, < 3 min: resnet_tiny, 32px, batch 8
    python experiments/bench_train.py --tiny          # the tests' smoke run (< 1 min of work)
    python experiments/bench_train.py --precisions bf16 --batches 256 --peak-tflops 989
    python experiments/bench_train.py --model vit_s16 # any registered model: alexnet, vit_b16, ...

For each (precision, per-device batch):
  jaxnet        `experiment.Experiment` built from a config (synthetic source, tiny
                synthetic_size): its own jitted train step with its shardings and
                donation, fed one fixed batch from its own loader, placed on the
                devices once. Compile time is `train_step.lower(...).compile()`;
                TFLOP/s use the flops of that compiled step from XLA's cost analysis.
  flax-minimal  experiments/peers/flax_minimal.py: a hand-written jit loop around the
                same Flax module and the same initial weights (see its docstring).
                Timing repeats alternate jaxnet / flax-minimal, so machine noise hits
                both alike; jaxnet/flax ~1.00 means no framework overhead.
  torch         experiments/peers/torch_resnet.py, in its own process, before any
                jax process (so the two never share a GPU's memory); skipped with a
                note when torch is not installed. ResNets from torchvision (or its own
                definition), AlexNet from torchvision, ViTs from timm (torchvision's
                for B/16 and L/16 without timm); the test models alexnet_mini and
                vit_mini have no torch counterpart (the peer reports an error).
  keras         experiments/peers/keras_resnet.py, in its own process after torch's:
                Keras 3 on its JAX backend, keras-hub's ResNet-50 v1.5 (resnet50
                only; 25,610,152 weights checked), its documented stateless jit
                step, `mixed_bfloat16`/`mixed_float16`/`float32` policies. A
                benchmark-only install (see its docstring); skipped with a note
                when keras-hub is not installed.

Timing: warm-up steps excluded, then `--repeats` timings of `--steps` steps each,
`jax.block_until_ready` before reading the clock; the median is reported.
jaxnet runs in a fresh process per cell (so `peak_bytes_in_use` is that cell's
peak) except in --quick/--tiny, where one process runs all cells and shares one
init (the compile of init is slow on CPU; the state does not depend on precision
or batch).

MFU = achieved TFLOP/s per device / peak dense TFLOP/s per device: `--peak-tflops`
(bf16/fp16) and `--peak-tflops-fp32`, or the table PEAK_TFLOPS by device name.
fp32 is measured against the TF32 tensor-core peak, because XLA and cuDNN run
fp32 convolutions as TF32 by default on A100/H100/H200.

Exit status 1 when a cell failed (jaxnet's or the torch peer's), a worker process
failed, or nothing was measured; the FAILED lines at the end say which. Cells that
--max-seconds left no time for are listed as "not run" and are not failures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(0, str(HERE.parent))  # run from a checkout without `pip install -e .`

import benchlib  # noqa: E402

# Dense (no sparsity) peak TFLOP/s per device: (bf16/fp16 tensor core, TF32 tensor core).
# From NVIDIA's data sheets; matched in order against jax's device_kind.
PEAK_TFLOPS = [
    ("H100 PCIe", (756.0, 378.0)),
    ("H100 NVL", (835.0, 418.0)),
    ("H200 NVL", (835.0, 418.0)),
    ("H100", (989.0, 494.5)),   # SXM, e.g. "NVIDIA H100 80GB HBM3"
    ("H200", (989.0, 494.5)),   # SXM: same compute as H100 SXM, more and faster memory
    ("A100", (312.0, 156.0)),
]

PEER_PACKAGES = ("torch", "torchvision", "keras", "keras-hub")  # their versions head the output

MODES = {
    # model, image size, per-device batches, steps per repeat, warm-up steps, repeats
    "full": dict(model="resnet50", image_size=224, batches="64,128,256", steps=20, warmup=5, repeats=5),
    # resnet50 does not fit 3 minutes on the 2 shared CPU cores this was written on:
    # its step compiles in ~50 s and its init in ~30 s there, x3 precisions x2 (jaxnet, flax).
    "quick": dict(model="resnet_tiny", image_size=32, batches="8", steps=5, warmup=2, repeats=3),
    "tiny": dict(model="resnet_tiny", image_size=16, batches="2", steps=2, warmup=1, repeats=2),
}


def peak_for(device_kind: str, precision: str, args) -> tuple[float | None, str]:
  """(peak TFLOP/s per device or None, where it came from)."""
  if precision == "fp32" and args.peak_tflops_fp32:
    return args.peak_tflops_fp32, "--peak-tflops-fp32"
  if precision != "fp32" and args.peak_tflops:
    return args.peak_tflops, "--peak-tflops"
  for name, (half, tf32) in PEAK_TFLOPS:
    if name.lower() in device_kind.lower():
      return (tf32, f"{name} TF32 dense") if precision == "fp32" else (half, f"{name} bf16/fp16 dense")
  return None, "unknown device, pass " + ("--peak-tflops-fp32" if precision == "fp32" else "--peak-tflops")


# ----------------------------------------------------------------------------- worker

def _flops(compiled) -> float | None:
  """FLOPs of one step per device: the larger of XLA's cost analysis and jaxnet's count over
  the optimized HLO (jaxnet.tools.hlo). On a GPU the convolutions are cuDNN custom calls that
  the cost analysis does not count (ResNet-50 on an H200: 0.10 of 6.22 TFLOP per step)."""
  counts = []
  try:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per program
      cost = cost[0] if cost else None
    if cost and cost.get("flops"):
      counts.append(float(cost["flops"]))
  except Exception:  # some backends do not implement it
    pass
  try:
    from jaxnet.tools import hlo
    counts.append(float(hlo.analyse(compiled.as_text()).flops))
  except Exception:  # an HLO text jaxnet cannot read: the cost analysis alone
    pass
  return max(counts) if counts and max(counts) > 0 else None


def _analysed_bytes(compiled) -> int | None:
  """Peak estimate of one step from the compiled program: inputs + outputs (less donated) + scratch."""
  try:
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
               + m.temp_size_in_bytes)
  except Exception:
    return None


def bench_cell(args, precision: str, per_device_batch: int, shared: dict) -> dict:
  import jax
  import flax_minimal
  from jaxnet.core import experiment
  from jaxnet.core import sharding as parallel
  from jaxnet.core.config import base_config

  ndev = jax.device_count()
  c = base_config()
  c.model.name = args.model
  c.image_size = args.image_size
  c.precision = precision
  c.batch_size = per_device_batch * ndev
  c.total_steps = 10**6                     # only shapes the LR schedule
  c.data.source = "synthetic"
  c.data.synthetic_size = c.batch_size      # one batch is all we feed
  c.data.num_classes = args.num_classes
  c.data.workers = 0
  exp = experiment.Experiment(c)
  out = {"precision": precision, "batch_per_device": per_device_batch, "global_batch": c.batch_size}

  start = time.perf_counter()
  if "host_state" not in shared:
    state = exp.init_state()
    shared["host_state"] = jax.device_get(state)  # host copy: later cells start from the same weights
    out["init_s"] = time.perf_counter() - start
  else:
    state = jax.device_put(shared["host_state"], exp.state_sharding)
  batch = parallel.to_global(next(iter(exp.train_loader())), exp.batch_sharding)

  start = time.perf_counter()
  compiled = exp.train_step.lower(state, batch).compile()
  out["compile_s"] = time.perf_counter() - start
  out["flops_per_step_per_device"] = _flops(compiled)
  analysed = _analysed_bytes(compiled)

  def jaxnet_step(s):
    return exp.train_step(s, batch)[0]   # the loop's own jitted step (same executable as `compiled`)

  for _ in range(args.warmup):
    state = jaxnet_step(state)
  jax.block_until_ready(state)
  stats = jax.local_devices()[0].memory_stats() or {}
  # The allocator's peak is per process: it is this cell's only when the cell has
  # the process to itself (and it is read before the peer allocates anything).
  if args.isolated and stats.get("peak_bytes_in_use"):
    out["peak_bytes"], out["peak_source"] = int(stats["peak_bytes_in_use"]), "memory_stats"
  else:
    out["peak_bytes"], out["peak_source"] = analysed, "memory_analysis"

  peer_state = None
  if not args.no_flax:
    host = shared["host_state"]
    pstep, peer_state, images, labels = flax_minimal.build(
        exp.model, precision, c.batch_size, args.image_size, exp.num_classes,
        variables={"params": host.params, "batch_stats": host.batch_stats})
    start = time.perf_counter()
    pstep.lower(peer_state, images, labels).compile()
    out["flax_compile_s"] = time.perf_counter() - start

    def flax_step(s):
      return pstep(s, images, labels)[0]

    for _ in range(args.warmup):
      peer_state = flax_step(peer_state)
    jax.block_until_ready(peer_state)

  jaxnet_times, flax_times = [], []
  for _ in range(args.repeats):
    state, t = benchlib.median_step_seconds(jaxnet_step, state, args.steps, 1, jax.block_until_ready)
    jaxnet_times += t
    if peer_state is not None:
      peer_state, t = benchlib.median_step_seconds(flax_step, peer_state, args.steps, 1,
                                                   jax.block_until_ready)
      flax_times += t
  seconds = benchlib.median(jaxnet_times)
  out.update(img_s=c.batch_size / seconds, ms_step=1000 * seconds,
             repeat_ms=[1000 * t for t in jaxnet_times],
             skipped_steps=int(state.loss_scale.skipped_steps))
  if flax_times:
    out.update(flax_img_s=c.batch_size / benchlib.median(flax_times),
               flax_repeat_ms=[1000 * t for t in flax_times])
  del state, peer_state, batch, exp
  gc.collect()
  return out


def run_worker(args) -> None:
  import jax
  devices = jax.devices()
  print("INFO " + json.dumps({"device_kind": devices[0].device_kind, "device_count": len(devices),
                              "platform": jax.default_backend(),
                              "process_count": jax.process_count()}), flush=True)
  shared: dict = {}
  for precision in args.precisions.split(","):
    for b in [int(x) for x in args.batches.split(",")]:
      if args.deadline and time.time() > args.deadline:
        print("RESULT " + json.dumps({"precision": precision, "batch_per_device": b,
                                      "error": "not run: --max-seconds spent"}), flush=True)
        continue
      try:
        result = bench_cell(args, precision, b, shared)
      except Exception as e:  # e.g. out of memory at the largest batch: report, go on
        result = {"precision": precision, "batch_per_device": b,
                  "error": f"{type(e).__name__}: {e}"[:400]}
      print("RESULT " + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- orchestration

def _run_lines(cmd: list[str], env: dict, timeout: float) -> tuple[dict, list[dict], str]:
  """Runs a worker; returns (its INFO, its RESULTs, the tail of its output on failure)."""
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=str(HERE.parent))
    stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
  except subprocess.TimeoutExpired as e:
    stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    stderr, rc = f"timed out after {timeout:.0f} s", -1
  info, results = {}, []
  for line in stdout.splitlines():
    if line.startswith("INFO "):
      info = json.loads(line[5:])
    elif line.startswith("RESULT "):
      results.append(json.loads(line[7:]))
  problem = "" if rc == 0 else f"exit {rc}: {(stderr or stdout)[-1500:]}"
  return info, results, problem


def run_peer(name: str, script: str, extra: list[str], args, precisions, batches,
             share: float, env: dict) -> tuple[dict, dict, str]:
  """Runs a peer's script in its own process: (its INFO, its RESULTs by cell, how it failed or "").
  With --max-seconds the peer gets `share` of the budget; cells it has not started by then
  are reported as not run."""
  cmd = [sys.executable, str(HERE / "peers" / script), *extra,
         "--precisions", ",".join(precisions), "--batches", ",".join(map(str, batches)),
         "--image-size", str(args.image_size), "--num-classes", str(args.num_classes),
         "--steps", str(args.steps), "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
  timeout = args.timeout
  if args.max_seconds:
    cmd += ["--deadline", str(time.time() + args.max_seconds * share)]
    timeout = min(timeout, args.max_seconds * share + 120)
  info, results, problem = _run_lines(cmd, env, timeout)
  return info, best_by_cell(results), problem and f"{name} peer " + problem


def best_by_cell(results: list[dict]) -> dict:
  """{(precision, batch): the fastest of a peer's results for that cell}; a peer that measures a
  cell several ways (torch: one result per torch.compile mode) lists them all under
  "variants", and the ratio is taken against its best."""
  cells = {}
  for r in results:
    cells.setdefault((r["precision"], r["batch"]), []).append(r)
  best = {}
  for cell, rs in cells.items():
    measured = [r for r in rs if "error" not in r]
    pick = dict(max(measured, key=lambda r: r["img_s"]) if measured else rs[0])
    if len(rs) > 1:
      pick["variants"] = rs
    best[cell] = pick
  return best


def run_torch(args, precisions, batches) -> tuple[dict, dict, str]:
  """The torch peer's (INFO, RESULTs by cell, a note: why it did not run, or how its process failed)."""
  import importlib.util
  if args.no_torch:
    return {}, {}, "torch peer off (--no-torch)"
  if importlib.util.find_spec("torch") is None:
    return {}, {}, "torch is not installed: torch peer skipped"
  env = dict(os.environ)
  env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see torch_resnet.py: spin-waiting on a shared CPU
  return run_peer("torch", "torch_resnet.py",
                  ["--model", args.model, "--compile", args.torch_compile,
                   "--compile-modes", args.torch_compile_modes, "--optimizer", args.torch_optimizer,
                   "--threads", str(args.torch_threads)],
                  args, precisions, batches, 1 / 3, env)


def run_keras(args, precisions, batches) -> tuple[dict, dict, str]:
  """The Keras peer's (INFO, RESULTs by cell, a note: why it did not run, or how its process failed)."""
  import importlib.util
  if args.no_keras:
    return {}, {}, "keras peer off (--no-keras)"
  if args.model != "resnet50":
    return {}, {}, f"keras peer: resnet50 only (not {args.model})"
  if importlib.util.find_spec("keras_hub") is None:
    return {}, {}, ("keras-hub is not installed: keras peer skipped "
                    "(pip install --no-deps keras keras-hub regex tokenizers)")
  return run_peer("keras", "keras_resnet.py", [], args, precisions, batches, 1 / 4, dict(os.environ))


def fmt_bytes(n) -> str:
  if not n:
    return "-"
  return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def fmt(value, spec, missing="-"):
  return missing if value is None else format(value, spec)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--quick", action="store_true", help="CPU run in < 3 minutes")
  mode.add_argument("--tiny", action="store_true", help="smallest run, for the tests")
  parser.add_argument("--model", help="a jaxnet model name (default by mode: resnet50 / resnet_tiny)")
  parser.add_argument("--image-size", type=int)
  parser.add_argument("--precisions", default="fp32,bf16,fp16")
  parser.add_argument("--batches", help="comma list of per-device batch sizes")
  parser.add_argument("--num-classes", type=int, default=1000)
  parser.add_argument("--steps", type=int, help="steps per timed repeat")
  parser.add_argument("--warmup", type=int, help="untimed steps after compiling")
  parser.add_argument("--repeats", type=int, help="timed repeats; the median is reported")
  parser.add_argument("--peak-tflops", type=float, help="peak dense bf16/fp16 TFLOP/s per device, for MFU")
  parser.add_argument("--peak-tflops-fp32", type=float, help="peak TFLOP/s per device used for fp32 MFU")
  parser.add_argument("--no-flax", action="store_true", help="skip the flax-minimal peer")
  parser.add_argument("--no-torch", action="store_true", help="skip the torch peer")
  parser.add_argument("--no-keras", action="store_true", help="skip the keras peer")
  parser.add_argument("--torch-compile", default="auto", choices=["auto", "on", "off"],
                      help="torch.compile the peer (auto: on with CUDA, off on CPU)")
  parser.add_argument("--torch-compile-modes", default="default",
                      help="torch.compile modes to measure, one cell each; the ratio is against the best "
                           "(e.g. default,max-autotune-no-cudagraphs: the peer at its best, issue 52)")
  parser.add_argument("--torch-optimizer", default="auto", choices=["auto", "fused", "foreach", "compiled"],
                      help="the torch peer's SGD step (auto: fused on CUDA)")
  parser.add_argument("--torch-threads", type=int, default=0, help="torch CPU threads (0: default)")
  parser.add_argument("--one-process", action="store_true",
                      help="all jaxnet cells in one process (default in --quick/--tiny)")
  parser.add_argument("--timeout", type=float, default=3600, help="seconds per worker process")
  parser.add_argument("--json", help="also write all measurements to this file")
  parser.add_argument("--max-seconds", type=float, default=0,
                      help="time budget: cells not started by then are reported as not run (0: none)")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--isolated", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--deadline", type=float, default=0, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  mode_name = "tiny" if args.tiny else "quick" if args.quick else "full"
  for key, value in MODES[mode_name].items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  args.batches = str(args.batches)
  if args.worker:
    run_worker(args)
    return 0

  precisions = args.precisions.split(",")
  batches = [int(b) for b in args.batches.split(",")]
  command = "python experiments/bench_train.py " + " ".join(sys.argv[1:] if argv is None else argv)
  print(f"bench_train ({mode_name}): {args.model}, {args.image_size}px, synthetic batch on the device; "
        f"{args.warmup} warm-up steps, median of {args.repeats} x {args.steps} steps")
  print("command: " + command)
  print(benchlib.cpu_line())
  print(benchlib.versions_line(*PEER_PACKAGES))
  print(benchlib.date_line())
  if os.environ.get("XLA_FLAGS"):
    print("XLA_FLAGS: " + os.environ["XLA_FLAGS"])
  print(benchlib.load_line() + " at start", flush=True)

  start, wall_start = time.perf_counter(), time.time()
  torch_info, torch_results, torch_note = run_torch(args, precisions, batches)
  if torch_note and not torch_results:
    print("torch: " + torch_note.splitlines()[0][:300], flush=True)
  keras_info, keras_results, keras_note = run_keras(args, precisions, batches)
  if keras_note and not keras_results:
    print("keras: " + keras_note.splitlines()[0][:300], flush=True)

  worker = [sys.executable, str(Path(__file__).resolve()), "--worker", "--model", args.model,
            "--image-size", str(args.image_size), "--num-classes", str(args.num_classes),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
  if args.no_flax:
    worker.append("--no-flax")
  if args.max_seconds:
    worker += ["--deadline", str(wall_start + args.max_seconds)]
  one_process = args.one_process or mode_name != "full"
  if not one_process:
    worker.append("--isolated")
  groups = [(precisions, batches)] if one_process else [([p], [b]) for p in precisions for b in batches]
  info, results, problems = {}, {}, []
  for ps, bs in groups:
    timeout = args.timeout
    if args.max_seconds:  # a cell still running at the deadline gets 150 s to finish
      timeout = min(timeout, max(wall_start + args.max_seconds - time.time(), 0) + 150)
    cell_info, cell_results, problem = _run_lines(
        worker + ["--precisions", ",".join(ps), "--batches", ",".join(map(str, bs))],
        dict(os.environ), timeout)
    info = info or cell_info
    results.update({(r["precision"], r["batch_per_device"]): r for r in cell_results})
    if problem:
      problems.append(problem)
  total = time.perf_counter() - start

  ndev = info.get("device_count", 1)
  kind = info.get("device_kind", "unknown")
  print(f"\ndevices: {ndev} x {kind} ({info.get('platform', '?')}); "
        f"peers: flax-minimal on the same devices; torch on one "
        f"{torch_info.get('device', '-')} device "
        f"(torch.compile {'on' if torch_info.get('compile') else 'off'}, "
        f"{torch_info.get('threads', '-')} CPU threads); keras on one "
        f"{keras_info.get('device', '-')} device")
  header = (f"{'prec':>5} {'batch/dev':>9} {'jaxnet img/s':>12} {'ms/step':>9} {'TFLOP/s':>8} "
            f"{'MFU':>6} {'peak mem':>10} {'compile s':>9} {'flax img/s':>10} {'jaxnet/flax':>11} "
            f"{'torch img/s':>11} {'jaxnet/torch':>12} {'keras img/s':>11} {'jaxnet/keras':>12}")
  print(header)
  print("-" * len(header))
  peaks, mem_sources, rows = set(), set(), []
  for p in precisions:
    for b in batches:
      r = results.get((p, b), {"error": "no result (worker failed)"})
      t = torch_results.get((p, b), {})
      k = keras_results.get((p, b), {})
      if "error" in r:
        print(f"{p:>5} {b:>9}  jaxnet error: {r['error'][:150]}")
        rows.append({"precision": p, "batch_per_device": b, **r})
        continue
      seconds = r["ms_step"] / 1000
      tflops = r["flops_per_step_per_device"] / seconds / 1e12 if r.get("flops_per_step_per_device") else None
      peak, peak_src = peak_for(kind, p, args)
      mfu = tflops / peak if (tflops and peak) else None
      peaks.add(f"{p}: {peak_src}" + (f" = {peak:g} TFLOP/s" if peak else ""))
      mem_sources.add(r.get("peak_source", "-"))
      flax_ratio = r["img_s"] / r["flax_img_s"] if r.get("flax_img_s") else None
      torch_img_s = t.get("img_s")
      # The torch peer uses one device: compare per-device rates.
      torch_ratio = (r["img_s"] / ndev) / torch_img_s if torch_img_s else None
      torch_cell = fmt(torch_img_s, ".1f", "error" if "error" in t else "-")
      keras_img_s = k.get("img_s")
      keras_ratio = (r["img_s"] / ndev) / keras_img_s if keras_img_s else None  # keras: one device too
      keras_cell = fmt(keras_img_s, ".1f", "error" if "error" in k else "-")
      print(f"{p:>5} {b:>9} {r['img_s']:12.1f} {r['ms_step']:9.2f} {fmt(tflops, '8.3f'):>8} "
            f"{fmt(mfu and 100 * mfu, '5.1f'):>5}{'%' if mfu else ' '} "
            f"{fmt_bytes(r.get('peak_bytes')):>10} {r['compile_s']:9.1f} "
            f"{fmt(r.get('flax_img_s'), '10.1f'):>10} {fmt(flax_ratio, '11.3f'):>11} "
            f"{torch_cell:>11} {fmt(torch_ratio, '12.3f'):>12} "
            f"{keras_cell:>11} {fmt(keras_ratio, '12.3f'):>12}", flush=True)
      rows.append({**r, "tflops_per_device": tflops, "mfu": mfu, "peak_tflops": peak,
                   "jaxnet_over_flax": flax_ratio, "torch": t, "jaxnet_over_torch": torch_ratio,
                   "keras": k, "jaxnet_over_keras": keras_ratio})
  gflop = [r["flops_per_step_per_device"] * ndev / r["global_batch"] / 1e9 for r in rows
           if r.get("flops_per_step_per_device")]
  print(f"\nimg/s: all {ndev} device(s). TFLOP/s and MFU: per device, flops of the compiled jaxnet step "
        f"from XLA's cost analysis ({', '.join(f'{g:.2f}' for g in gflop)} GFLOP per image)")
  print("MFU peak: " + "; ".join(sorted(peaks)))
  print(f"peak mem: jaxnet only, from {' / '.join(sorted(mem_sources))} "
        "(memory_stats: the device allocator's peak_bytes_in_use; memory_analysis: the compiled "
        "step's arguments + outputs - donated + temporaries)")
  print("compile s: jaxnet's train_step.lower().compile(). jaxnet/flax, jaxnet/torch, jaxnet/keras: ratios of "
        "images/s per device (> 1: jaxnet faster)")
  if torch_results:
    src = next(iter(torch_results.values())).get("model_source", "?")
    print(f"torch: model {src}; AMP autocast for bf16/fp16, GradScaler for fp16, channels_last; "
          f"SGD step {torch_info.get('optimizer', '?')}; torch.compile modes "
          f"{','.join(torch_info.get('compile_modes', ['?']))}, img/s the best of them per cell:")
    for (p, b), t in sorted(torch_results.items()):
      for v in t.get("variants", [t]):
        print(f"  torch {p} batch {b} {v.get('compile_mode', '?')}: "
              f"{fmt(v.get('img_s'), '.1f', v.get('error', '-')[:80])}")
  elif torch_note:
    print("torch: " + torch_note.splitlines()[0][:300])
  if keras_results:
    k0 = next(iter(keras_results.values()))
    print(f"keras: {keras_info.get('keras', '?')}, keras-hub {keras_info.get('keras_hub', '?')}, "
          f"backend {keras_info.get('backend', '?')}; ResNetBackbone v1.5 + Dense head, "
          f"{k0.get('weights', 0):,} weights; stateless jit step, donated state")
  elif keras_note:
    print("keras: " + keras_note.splitlines()[0][:300])
  if info.get("platform") == "cpu":
    print("CPU timings: a shared machine's numbers are noisy (" + benchlib.load_line() + " at the end); "
          "these are not GPU numbers")
  for problem in problems:
    print("worker problem: " + problem[-800:])
  print(f"total {total:.0f} s")
  # A peer's process that failed is a failure; one that was off, not installed or not
  # applicable to the model is only a note.
  peer_failures = [n for n in (torch_note, keras_note) if " peer exit " in n]
  failures = failed_cells(rows, {"torch": torch_results, "keras": keras_results},
                          problems + peer_failures)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"command": command, "mode": mode_name, "info": info, "torch_info": torch_info,
                 "torch_note": torch_note, "keras_info": keras_info,
                 "keras_note": keras_note, "cpu": benchlib.cpu_line(),
                 "versions": benchlib.versions_line(*PEER_PACKAGES),
                 "date": benchlib.date_line(), "rows": rows, "failures": failures}, f, indent=1, default=str)
  if failures:
    print(f"FAILED: {len(failures)} problem(s):\n  " + "\n  ".join(f[:300] for f in failures), flush=True)
    return 1
  return 0


def failed_cells(rows: list[dict], peer_results: dict, problems: list[str]) -> list[str]:
  """What makes the run a failure: a cell that errored (jaxnet's or a peer's: `peer_results`
  maps a peer's name to its results by cell), a failed process, or no measurement at all.
  Cells skipped because --max-seconds was spent are not failures."""
  out = [f"jaxnet {r['precision']} batch {r['batch_per_device']}: {r['error']}"
         for r in rows if benchlib.cell_failed(r)]
  out += [f"{peer} {p} batch {b}{' ' + v['compile_mode'] if 'variants' in t else ''}: {v['error']}"
          for peer, results in peer_results.items() for (p, b), t in results.items()
          for v in t.get("variants", [t]) if benchlib.cell_failed(v)]
  out += list(problems)
  if not any("error" not in r for r in rows):
    out.append("no cell was measured")
  return out


if __name__ == "__main__":
  sys.exit(main())
