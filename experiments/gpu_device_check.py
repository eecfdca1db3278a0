"""The GPU plan held against the GPU: jaxnet's train step compiled and run on the device,
next to `python -m jaxnet.cli.gpu_plan`'s prediction of it, and a short profile of the step.

    python experiments/gpu_device_check.py --config configs/resnet50.py --batch 256 \
        --plan h100=PLAN.json --plan h200=PLAN.json --out DIR
    python experiments/gpu_device_check.py --quick        # CPU dry run: resnet_tiny, 32px, batch 8

1. The device: `jax.devices()[0]`, its kind, memory and compute capability.
2. The step: the config's train step (built by `Experiment`, as training builds it) compiled
   on the device's own compiler with the options a run gets (`gpu_plan.run_options`), its
   memory analysis and structure (`jaxnet.tools.hlo`), then run: median img/s of `--steps`
   steps, TFLOP/s from XLA's cost analysis, and the allocator's peak (`memory_stats()`).
3. Plan against device: the plans given with --plan (the JSON of `python -m
   jaxnet.cli.gpu_plan --json`, compiled on a CPU for a target file) beside what the device
   compiled and measured: memory and kernels per step, and how far apart.
4. A profile (`jax.profiler.trace`) of `--profile-steps` steps: the kernels' time by kind
   (convolutions, GEMMs, XLA fusions, collectives, copies), the top kernels, launches per step
   and the achieved TFLOP/s against --peak-tflops; each kernel through its HLO instruction to
   its layer, part and pass, beside the row of the --plan compiled for this device (the target
   named in its kind, else the first): measured ms against the plan's roofline ms. The trace
   (perfetto JSON) is copied into --out when it is under 15 MB.

Prints tables, and writes `device_check.json` into --out (or the file --json-out names).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # run from a checkout without `pip install -e .`

import benchlib  # noqa: E402

GIB = 2.0**30
TRACE_LIMIT = 15 * 2**20  # the device tool brings back files of at most 16 MiB


def build_step(config_path: str, batch: int, overrides: dict):
  """(Experiment, its state, a batch on the device) for `config_path` at a per-GPU `batch`."""
  import jax
  from jaxnet.core import config as config_lib
  from jaxnet.core.experiment import Experiment
  from jaxnet.tools import gpu_plan
  config = config_lib.load(config_path, overrides)
  config = gpu_plan.plan_config(config, per_gpu_batch=batch, gpus=1)
  exp = Experiment(config, devices=jax.devices()[:1])
  state = jax.device_put(benchlib.filled_state(exp.abstract_state), exp.state_sharding)
  return exp, state, benchlib.synthetic_batch(exp, config.batch_size)


def compile_on_device(exp, state, batch):
  """(executable, gpu_plan.Compiled) of the train step, with the options a run gets."""
  from jaxnet.core import models
  from jaxnet.tools import gpu_plan
  with models.tracing_for("gpu" if _backend() == "gpu" else "cpu"):
    lowered = exp.train_step.lower(state, batch)
  options = gpu_plan.run_options() if _backend() == "gpu" else {}
  start = time.perf_counter()
  executable = lowered.compile(compiler_options=options)
  seconds = time.perf_counter() - start
  m = executable.memory_analysis()
  compiled = gpu_plan.Compiled(executable.as_text(), m.argument_size_in_bytes, m.output_size_in_bytes,
                               m.alias_size_in_bytes, m.temp_size_in_bytes,
                               m.generated_code_size_in_bytes, options)
  return executable, compiled, seconds


def _backend() -> str:
  import jax
  return jax.default_backend()


def flops_of(executable, analysis) -> float | None:
  """FLOPs of one step: the larger of XLA's cost analysis and jaxnet.tools.hlo's count (on a
  GPU the cost analysis leaves out the cuDNN convolutions)."""
  counts = [float(analysis.flops)]
  try:
    cost = executable.cost_analysis()
    if isinstance(cost, (list, tuple)):
      cost = cost[0] if cost else None
    if cost and cost.get("flops"):
      counts.append(float(cost["flops"]))
  except Exception:  # not every backend implements it
    pass
  return max(counts) or None


def time_steps(executable, state, batch, steps: int, warmup: int, repeats: int):
  import jax

  def step(s):
    return executable(s, batch)[0]

  for _ in range(warmup):
    state = step(state)
  jax.block_until_ready(state)
  state, times = benchlib.median_step_seconds(step, state, steps, repeats, jax.block_until_ready)
  return state, step, times


# --- the profile ---------------------------------------------------------------------------

def kernel_kinds(analysis) -> dict:
  """{HLO instruction name: kind} of the compiled step (jaxnet.tools.hlo's kinds)."""
  return {k.name: k.kind for k in analysis.kernels}


def name_kind(name: str) -> str:
  """The kind of a GPU kernel from its name alone, where the trace gives no HLO op."""
  n = name.lower()
  if "nccl" in n:
    return "collective"
  if any(s in n for s in ("sdpa", "fmha", "flash")):
    return "attention"
  if n.startswith(("loop_", "input_", "wrapped_")) or "fusion" in n:
    return "fusion"
  if any(s in n for s in ("fprop", "dgrad", "wgrad", "conv", "implicit_gemm")):
    return "conv"
  if any(s in n for s in ("gemm", "cublas", "nvjet", "cutlass", "xmma", "triton")):
    return "gemm"
  if "memcpy" in n or "memset" in n or "copy" in n or "transpose" in n:
    return "transpose"
  return "other"


def event_kind(name: str, hlo_kind: str | None) -> str:
  """The HLO instruction's kind where the event names one, except that a kernel XLA emitted
  itself (loop_/input_ names) is a fusion whatever its instruction computes, and a library's
  kernel (cuDNN attention inside a custom call) is named by its kernel."""
  by_name = name_kind(name)
  if hlo_kind is None or by_name in ("fusion", "attention", "collective"):
    return by_name
  return hlo_kind


def trace_files(log_dir: str) -> tuple[str | None, str | None]:
  """(perfetto JSON trace, xplane) written under log_dir by jax.profiler.trace."""
  perfetto = sorted(glob.glob(os.path.join(log_dir, "**", "*.trace.json.gz"), recursive=True))
  xplane = sorted(glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True))
  return (perfetto[-1] if perfetto else None), (xplane[-1] if xplane else None)


def device_events(trace_path: str) -> list[dict]:
  """The kernels on the GPU's stream timelines of a perfetto/chrome JSON trace: {name, dur (us),
  args}. The GPU's derived lines ("XLA Ops", "XLA Modules", ...) repeat the same time and are
  left out. On a CPU (the dry run) the host's events stand in."""
  with gzip.open(trace_path, "rt") as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  meta = lambda kind: {(e["pid"], e.get("tid")) if kind == "thread_name" else e["pid"]:
                       str(e.get("args", {}).get("name", ""))
                       for e in events if e.get("ph") == "M" and e.get("name") == kind}
  processes, threads = meta("process_name"), meta("thread_name")
  gpu = {pid for pid, n in processes.items() if "gpu" in n.lower() and "/device:" in n.lower()}
  if gpu:
    keep = lambda e: e.get("pid") in gpu and "stream" in threads.get((e["pid"], e.get("tid")), "").lower()
  else:  # CPU dry run
    host = {pid for pid, n in processes.items() if "host" in n.lower() or "cpu" in n.lower()}
    keep = lambda e: e.get("pid") in host
  return [{"name": e.get("name", ""), "dur": float(e.get("dur", 0)), "args": e.get("args", {})}
          for e in events if e.get("ph") == "X" and keep(e)]


def summarize_profile(events: list[dict], kinds: dict, steps: int, step_seconds: float,
                      flops_per_step: float | None, peak_tflops: float) -> dict:
  """Time by kind, the top kernels, launches per step, achieved TFLOP/s."""
  by_kind = collections.Counter()
  by_kernel = collections.defaultdict(lambda: [0.0, 0, ""])
  matched = 0
  for e in events:
    op = str(e["args"].get("hlo_op") or e["args"].get("long_name") or "")
    op = op.split(" ")[0].lstrip("%").split("=")[0].strip()
    matched += op in kinds
    kind = event_kind(e["name"], kinds.get(op))
    by_kind[kind] += e["dur"]
    entry = by_kernel[e["name"]]
    entry[0] += e["dur"]
    entry[1] += 1
    entry[2] = kind
  busy = sum(by_kind.values())
  top = sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:12]
  out = {
      "events": len(events), "events_matched_to_hlo": matched,
      "launches_per_step": len(events) / max(steps, 1),
      "busy_ms_per_step": busy / 1e3 / max(steps, 1),
      "step_ms": step_seconds * 1e3,
      "by_kind_ms_per_step": {k: v / 1e3 / max(steps, 1) for k, v in by_kind.most_common()},
      "top_kernels": [{"name": n[:90], "kind": v[2], "ms_per_step": v[0] / 1e3 / max(steps, 1),
                       "calls_per_step": v[1] / max(steps, 1)} for n, v in top],
  }
  if flops_per_step:
    out["tflops"] = flops_per_step / step_seconds / 1e12
    out["mfu"] = out["tflops"] / peak_tflops
  return out


def layer_rows(events: list[dict], analysis, steps: int, plan_layers: list | None = None) -> dict:
  """The profile by layer, part and pass (jaxnet.tools.hlo.layer_of): each event through its
  HLO instruction to the row the compiled program's table gives it (kernels and bytes per
  step), with the measured ms per step and the bandwidth that implies, beside the CPU-compiled
  plan's row for the same layer (`plan_layers`: its "layers"; see plan_beside); the unmatched
  events' time by kernel name."""
  from jaxnet.tools import hlo
  mapped = hlo.map_trace(events, analysis)
  rows = []
  for row in hlo.layer_table(analysis):
    us = mapped["rows"].get((row["layer"], row["part"], row["pass"]), 0.0) / max(steps, 1)
    rows.append({**row, "measured_ms": us / 1e3,
                 "gb_per_s": row["bytes"] / (us * 1e-6) / 1e9 if us else None})
  rows = plan_beside(rows, plan_layers or [])
  unmatched = sorted(mapped["unmatched"].items(), key=lambda kv: -kv[1])[:10]
  return {"rows": rows, "matched": mapped["matched"], "events": mapped["events"],
          "unmatched_ms_per_step": {n: us / 1e3 / max(steps, 1) for n, us in unmatched}}


def plan_beside(rows: list[dict], plan_layers: list[dict]) -> list[dict]:
  """Each measured layer row with the plan's for the same (layer, part, pass): its kernels,
  bytes and roofline ms (`python -m jaxnet.cli.gpu_plan --json`'s "layers", compiled on a CPU
  for the target), and measured over predicted. A layer only one side has keeps its row, the
  other side's values None: the device's compiler may fuse differently from the plan's."""
  plan = {(r["layer"], r["part"], r["pass"]): r for r in plan_layers}
  out = []
  for row in rows:
    p = plan.pop((row["layer"], row["part"], row["pass"]), None)
    out.append({**row, "plan_kernels": p and p["kernels"], "plan_bytes": p and p["bytes"],
                "plan_ms": p and p["ms"],
                "measured_over_plan": row["measured_ms"] / p["ms"] if p and p["ms"] else None})
  for p in plan.values():  # planned, never seen on the device
    out.append({"layer": p["layer"], "part": p["part"], "pass": p["pass"], "kernels": 0, "flops": 0,
                "bytes": 0.0, "ms": 0.0, "measured_ms": 0.0, "gb_per_s": None,
                "plan_kernels": p["kernels"], "plan_bytes": p["bytes"], "plan_ms": p["ms"],
                "measured_over_plan": None})
  return out


def matching_plan(plans: dict, device_kind: str) -> tuple[str, dict] | tuple[None, None]:
  """(name, plan) of the plan compiled for this device (its target named in the device's
  kind: "h200" in "NVIDIA H200"), else the first plan given, else (None, None)."""
  for name, plan in plans.items():
    if name.lower() in device_kind.lower():
      return name, plan
  return next(iter(plans.items()), (None, None))


def profile(step, state, steps: int, kinds: dict, step_seconds: float, flops, peak: float, trace_out: str,
            analysis=None, plan_layers: list | None = None):
  import jax
  log_dir = tempfile.mkdtemp(prefix="jaxnet-profile-")
  try:
    with jax.profiler.trace(log_dir, create_perfetto_trace=True):
      for _ in range(steps):
        state = step(state)
      jax.block_until_ready(state)
    perfetto, xplane = trace_files(log_dir)
    if perfetto is None:
      return state, {"error": f"no perfetto trace under {log_dir} (xplane: {xplane})"}
    events = device_events(perfetto)
    summary = summarize_profile(events, kinds, steps, step_seconds, flops, peak)
    if analysis is not None:
      summary["layers"] = layer_rows(events, analysis, steps, plan_layers)
    size = os.path.getsize(perfetto)
    summary["trace_bytes"] = size
    if trace_out and size <= TRACE_LIMIT:
      shutil.copy(perfetto, trace_out)
      summary["trace_file"] = os.path.basename(trace_out)
    return state, summary
  finally:
    shutil.rmtree(log_dir, ignore_errors=True)


# --- the plan against the device ----------------------------------------------------------

def comparison_rows(plans: dict, device: dict) -> list[tuple]:
  """(what, each plan's value, device compile, device measured, device/plan of the first plan)."""
  rows = []

  def row(what, key_plan, device_compiled, measured=None, scale=1.0, fmt="{:.2f}"):
    values = [p.get(key_plan[0], {}).get(key_plan[1]) if isinstance(key_plan, tuple) else p.get(key_plan)
              for p in plans.values()]
    first = next((v for v in values if v), None)
    against = measured if measured is not None else device_compiled
    ratio = f"{against / first:.3f}" if first and against is not None else "-"
    show = lambda v: fmt.format(v / scale) if isinstance(v, (int, float)) else "-"
    rows.append((what, *[show(v) for v in values], show(device_compiled), show(measured), ratio))

  m = device["memory"]
  row("train step memory, GiB", ("memory", "total"), m["total"], device.get("peak_bytes"), GIB)
  row("  arguments, GiB", ("memory", "arguments"), m["arguments"], None, GIB)
  row("  temporaries, GiB", ("memory", "temporaries"), m["temporaries"], None, GIB)
  t = device["train"]
  launches = device.get("profile", {}).get("launches_per_step")
  row("kernels per step", ("train", "kernels"), t["kernels"], launches, fmt="{:.0f}")
  row("  fusions", ("train", "fusions"), t["fusions"], None, fmt="{:.0f}")
  for label, key in (("  cuDNN convolutions", "convolutions"), ("  GEMMs", "gemms")):
    rows.append((label, *[str(sum(p.get("train", {}).get(key, {}).values())) for p in plans.values()],
                 str(sum(t[key].values())), "-", "-"))
  row("TFLOP per step", ("train", "flops"), t["flops"], None, 1e12)
  roof = [p.get("roofline", {}).get("images_per_second") for p in plans.values()]
  rows.append(("roofline img/s (bound)", *[f"{r:,.0f}" if r else "-" for r in roof], "-",
               f"{device['img_s']:,.0f}" if device.get("img_s") else "-",
               f"{device['img_s'] / roof[0]:.3f}" if roof and roof[0] and device.get("img_s") else "-"))
  return rows


def format_table(header: list[str], rows: list[tuple]) -> str:
  widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
  line = lambda r: "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
  return "\n".join([line(header)] + [line(r) for r in rows])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default="configs/resnet50.py")
  parser.add_argument("--batch", type=int, default=256, help="per-GPU batch")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="config overrides, e.g. --set precision=bf16")
  parser.add_argument("--plan", action="append", default=[], metavar="NAME=PLAN.json",
                      help="a plan from python -m jaxnet.cli.gpu_plan --json (repeatable)")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--profile-steps", type=int, default=3)
  parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak per GPU")
  parser.add_argument("--out", default="", help="folder for device_check.json and the trace")
  parser.add_argument("--tag", default="", help="names the outputs device_check_TAG.json, step_trace_TAG...")
  parser.add_argument("--json-out", default="", help="write the measurements here instead of into --out")
  parser.add_argument("--no-trace-file", action="store_true", help="summarize the profile, keep no trace")
  parser.add_argument("--quick", action="store_true", help="CPU dry run: resnet_tiny, 32px, batch 8")
  args = parser.parse_args(argv)
  overrides = dict(s.split("=", 1) for s in args.set)
  if args.quick:
    overrides = {"model.name": "resnet_tiny", "image_size": "32", "data.num_classes": "10", **overrides}
    args.batch, args.steps, args.warmup, args.repeats, args.profile_steps = min(args.batch, 8), 3, 1, 2, 2

  suffix = f"_{args.tag}" if args.tag else ""
  trace_out = ""
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    trace_out = "" if args.no_trace_file else os.path.join(args.out, f"step_trace{suffix}.json.gz")
  from jaxnet.cli import process
  process.setup()  # the XLA flags and compile cache a run gets
  import jax
  from jaxnet.tools import gpu_plan, hlo

  d = jax.devices()[0]
  stats = d.memory_stats() or {}
  device_line = (f"device: {jax.device_count()} x {d.device_kind} ({jax.default_backend()}); "
                 f"{d}; compute capability {getattr(d, 'compute_capability', '-')}; "
                 f"cores {getattr(d, 'core_count', '-')}; "
                 f"memory limit {stats.get('bytes_limit', 0) / GIB:.1f} GiB (jax's pool)")
  print(f"gpu_device_check: {args.config} {overrides or ''} per-GPU batch {args.batch}")
  print(benchlib.cpu_line())
  print(benchlib.versions_line("orbax-checkpoint", "jax-cuda13-plugin", "jax-cuda12-plugin"))
  print(benchlib.date_line())
  print(device_line, flush=True)

  exp, state, batch = build_step(args.config, args.batch, overrides)
  config = exp.config
  executable, compiled, compile_s = compile_on_device(exp, state, batch)
  analysis = gpu_plan.analyse_step(compiled, exp.abstract_state, args.batch)
  flops = flops_of(executable, analysis)
  state, step, times = time_steps(executable, state, batch, args.steps, args.warmup, args.repeats)
  seconds = benchlib.median(times)
  stats = jax.local_devices()[0].memory_stats() or {}
  device = {
      "device_kind": d.device_kind, "device": str(d), "backend": jax.default_backend(),
      "model": config.model.name, "precision": config.precision, "image_size": config.image_size,
      "per_gpu_batch": args.batch, "compile_s": compile_s,
      "memory": {"arguments": compiled.arguments, "outputs": compiled.outputs, "aliased": compiled.aliased,
                 "temporaries": compiled.temporaries, "total": compiled.total},
      "peak_bytes": stats.get("peak_bytes_in_use"), "bytes_limit": stats.get("bytes_limit"),
      "train": hlo.summary(analysis), "xla_options": compiled.options,
      "img_s": config.batch_size / seconds, "ms_step": seconds * 1e3, "repeat_ms": [t * 1e3 for t in times],
      "flops_per_step": flops,
  }
  print(f"\ntrain step on the device: {device['img_s']:,.0f} img/s ({device['ms_step']:.2f} ms/step, "
        f"median of {args.repeats} x {args.steps} steps; repeats "
        f"{', '.join(f'{t:.2f}' for t in device['repeat_ms'])} ms), compiled in {compile_s:.1f} s; "
        + (f"{flops / seconds / 1e12:.1f} TFLOP/s ({flops / seconds / 1e12 / args.peak_tflops:.1%} of "
           f"{args.peak_tflops:g})" if flops else "no cost analysis"), flush=True)
  if device["peak_bytes"]:
    print(f"allocator peak in use: {device['peak_bytes'] / GIB:.2f} GiB of {device['bytes_limit'] / GIB:.1f} GiB")

  plans = {}
  for spec in args.plan:
    name, path = spec.split("=", 1)
    try:
      with open(path) as f:
        plans[name] = json.load(f)
    except (OSError, ValueError) as e:
      print(f"plan {name}: not read ({e})")
  plan_name, plan = matching_plan(plans, d.device_kind)
  try:
    if not args.profile_steps:
      raise RuntimeError("not profiled (--profile-steps 0)")
    state, device["profile"] = profile(step, state, args.profile_steps, kernel_kinds(analysis), seconds,
                                       flops, args.peak_tflops, trace_out, analysis,
                                       (plan or {}).get("layers"))
  except Exception as e:  # the plan comparison below still prints
    device["profile"] = {"error": f"{type(e).__name__}: {e}"[:500]}
  p = device["profile"]
  if "error" in p:
    print(f"\nprofile: {p['error']}")
  else:
    print(f"\nprofile of {args.profile_steps} steps: {p['events']} device events "
          f"({p['events_matched_to_hlo']} matched to the step's HLO), {p['launches_per_step']:.0f} per step; "
          f"device busy {p['busy_ms_per_step']:.2f} ms of a {p['step_ms']:.2f} ms step; trace "
          f"{p['trace_bytes'] / 2**20:.1f} MB" + (f" -> {p['trace_file']}" if p.get("trace_file") else
                                                     " (too large to bring back)"))
    busy = max(p["busy_ms_per_step"], 1e-9)
    print(format_table(["kind", "ms/step", "share"],
                       [(k, f"{v:.2f}", f"{v / busy:.1%}") for k, v in p["by_kind_ms_per_step"].items()]))
    print("top kernels:")
    print(format_table(["kernel", "kind", "ms/step", "calls/step"],
                       [(k["name"], k["kind"], f"{k['ms_per_step']:.3f}", f"{k['calls_per_step']:.0f}")
                        for k in p["top_kernels"]]))
    if "layers" in p:
      lay = p["layers"]
      rows = sorted(lay["rows"], key=lambda r: -r["measured_ms"])
      show = lambda v, f: "-" if v is None else format(v, f)
      print(f"by layer (the step's HLO: {lay['matched']} of {lay['events']} events matched; rows by measured "
            f"time; GB/s = the row's bytes in the compiled program / its measured time; plan: "
            + (f"python -m jaxnet.cli.gpu_plan for {plan_name}, compiled on a CPU, its roofline ms (a bound)"
               if plan_name else "none given") + "):")
      print(format_table(["layer", "part", "pass", "kernels", "GiB", "ms/step", "GB/s",
                          "plan kernels", "plan GiB", "plan ms", "measured/plan"],
                         [(r["layer"], r["part"], r["pass"], str(r["kernels"]), f"{r['bytes'] / GIB:.2f}",
                           f"{r['measured_ms']:.3f}", f"{r['gb_per_s']:.0f}" if r["gb_per_s"] else "-",
                           show(r["plan_kernels"], "d"), show(r["plan_bytes"] and r["plan_bytes"] / GIB, ".2f"),
                           show(r["plan_ms"], ".3f"), show(r["measured_over_plan"], ".2f"))
                          for r in rows[:45]]))
      planned, measured = (sum(r["plan_ms"] or 0 for r in rows), sum(r["measured_ms"] for r in rows))
      if planned:
        print(f"layers in all: measured {measured:.2f} ms/step, plan's roofline {planned:.2f} ms/step "
              f"({measured / planned:.2f}x)")
      if lay["unmatched_ms_per_step"]:
        print("unmatched events (no HLO instruction named): " + "; ".join(
            f"{n} {ms:.3f} ms" for n, ms in lay["unmatched_ms_per_step"].items()))

  header = ["", *[f"plan {n} (CPU compile)" for n in plans], "device compile", "device measured",
            "measured/plan"]
  print(f"\nplan against device ({d.device_kind}, per-GPU batch {args.batch}; measured memory is the "
        f"allocator's peak, measured kernels the profile's launches per step):")
  print(format_table(header, comparison_rows(plans, device)))
  attention = device["train"]["attention"]
  if "vit" in config.model.name:
    print(f"attention kernels in the compiled step: "
          f"{', '.join(f'{k} x{v}' for k, v in attention.items()) or 'none fused (XLA GEMMs + softmax)'}")
  device["plans"] = plans
  json_out = args.json_out or (args.out and os.path.join(args.out, f"device_check{suffix}.json"))
  if json_out:
    with open(json_out, "w") as f:
      json.dump(device, f, indent=1, default=str)


if __name__ == "__main__":
  main()
