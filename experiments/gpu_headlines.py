"""The GPU call's headlines (experiments/run_gpu_benchmarks.sh): every jaxnet row beside the best
torch row of its model, and one results.json of every stage's measurements.

    python experiments/gpu_headlines.py --tmp STAGE_DIR --out results.json

STAGE_DIR holds what the stages left: NAME.txt (each stage's output; the torch and keras peers
print RESULT lines) and NAME.json (bench_train's, gpu_device_check's, bench_end_to_end's).
Rows: img/s per GPU, ms/step, TFLOP/s (the step's FLOPs with cuDNN's convolutions and fused
attention, jaxnet.tools.hlo's count), peak memory (the allocator's peak where the stage read
it, else the compiled step's), and img/s over the best torch row of the same model and image
size (any precision, compile mode or optimizer: the fair peer at its best).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

GIB = 2.0**30
PEERS = {"torch": "resnet50", "torch_autotune": "resnet50", "torch_fp16": "resnet50", "keras": "resnet50",
         "fcn_torch": "fcn_resnet50"}
CHECKS = ("levers_on", "pool_scatter", "b512", "stem_pad4", "stem_s2d", "vit", "fcn")


def peer_results(path: str) -> list[dict]:
  """The RESULT lines a peer printed (measured or not)."""
  try:
    with open(path) as f:
      return [json.loads(line[7:]) for line in f if line.startswith("RESULT ")]
  except (OSError, ValueError):
    return []


def read_json(path: str):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def check_row(name: str, d: dict) -> dict:
  """A gpu_device_check measurement as a headline row."""
  seconds = d["ms_step"] / 1e3
  return {"row": f"jaxnet {name} ({d['model']} {d['precision']} b{d['per_gpu_batch']})", "model": d["model"],
          "img_s": d["img_s"], "ms_step": d["ms_step"],
          "tflops": d["flops_per_step"] / seconds / 1e12 if d.get("flops_per_step") else None,
          "peak_bytes": d.get("peak_bytes") or d["memory"]["total"]}


def train_rows(name: str, d: dict) -> list[dict]:
  """bench_train's cells (jaxnet, and the hand-written Flax step where it ran) as headline rows,
  then its torch peer's cells (the families' stages: torchvision's model) as peer rows."""
  rows = []
  model = "resnet50" if name == "bench_train" else name  # a family's stage is named by its model
  for r in d.get("rows", []):
    if "img_s" not in r:
      continue
    per_gpu = r["img_s"] / r["global_batch"] * r["batch_per_device"]
    ms = r["ms_step"]
    label = f"{r['precision']} b{r['batch_per_device']}"
    rows.append({"row": f"jaxnet {name} ({model} {label})", "model": model, "img_s": per_gpu, "ms_step": ms,
                 "tflops": r.get("tflops_per_device"), "peak_bytes": r.get("peak_bytes")})
    if r.get("flax_img_s"):
      rows.append({"row": f"flax-minimal ({model} {label})", "model": model,
                   "img_s": r["flax_img_s"] / r["global_batch"] * r["batch_per_device"],
                   "ms_step": r["global_batch"] / r["flax_img_s"] * 1e3, "tflops": None, "peak_bytes": None})
  for r in d.get("rows", []):
    if r.get("torch"):
      rows += peer_rows("torch", [r["torch"]], model)
  return rows


def peer_rows(name: str, results: list[dict], model: str) -> list[dict]:
  """A peer's RESULTs (each of a cell's variants: one per torch.compile mode) as peer rows."""
  rows = []
  for t in results:
    for v in t.get("variants", [t]):
      how = ", ".join(str(v[k]) for k in ("compile_mode", "optimizer") if k in v)
      label = (how + ", " if how else "") + f"{v['precision']} b{v['batch']}"
      if "img_s" in v:
        rows.append({"row": f"{name} ({model} {label})", "model": model, "img_s": v["img_s"],
                     "ms_step": v["ms_step"], "tflops": None, "peak_bytes": v.get("peak_bytes"), "peer": True})
      else:
        rows.append({"row": f"{name} ({model} {label})", "model": model, "error": v.get("error", "?"),
                     "peer": True})
  return rows


def collect(tmp: str) -> tuple[list[dict], dict]:
  """(headline rows, results.json's content) from a stage folder."""
  rows, results = [], {"peers": {}, "stages": {}}
  for name, model in PEERS.items():
    found = peer_results(os.path.join(tmp, f"{name}.txt"))
    if found:
      results["peers"][name] = found
      rows += peer_rows("keras" if name == "keras" else "torch", found, model)
  for path in sorted(glob.glob(os.path.join(tmp, "*.json"))):
    name = os.path.basename(path)[:-5]
    d = read_json(path)
    if d is None:
      continue
    results["stages"][name] = d
    if name in CHECKS and "img_s" in d:
      rows.append(check_row(name, d))
    elif "rows" in d and name != "end_to_end":
      rows += train_rows(name, d)
  return rows, results


def with_ratios(rows: list[dict]) -> list[dict]:
  """Each measured row's img/s over the best torch row of its model (None without one)."""
  best = {}
  for r in rows:
    if r.get("peer") and r["row"].startswith("torch") and "img_s" in r \
        and r["img_s"] > best.get(r["model"], {}).get("img_s", 0):
      best[r["model"]] = r
  for r in rows:
    b = best.get(r["model"])
    r["vs_best_torch"] = r["img_s"] / b["img_s"] if b and "img_s" in r else None
    r["best_torch"] = b["row"] if b else None
  return rows


def lines(rows: list[dict], end_to_end: dict | None) -> list[str]:
  fmt = lambda v, f: "-" if v is None else format(v, f)
  width = max([len(r["row"]) for r in rows] + [10])
  out = [f"{'headline':<{width}} {'img/s':>9} {'ms/step':>8} {'TFLOP/s':>8} {'peak GiB':>9} {'/best torch':>11}"]
  for r in rows:
    if "error" in r:
      out.append(f"{r['row']:<{width}} {r['error'][:80]}")
      continue
    out.append(f"{r['row']:<{width}} {r['img_s']:>9,.1f} {r['ms_step']:>8.2f} {fmt(r['tflops'], '>8.1f')} "
               f"{fmt(r['peak_bytes'] and r['peak_bytes'] / GIB, '>9.2f')} {fmt(r['vs_best_torch'], '>11.3f')}")
  for model in sorted({r["model"] for r in rows if r.get("best_torch")}):
    out.append(f"best torch row for {model}: "
               + next(r["best_torch"] for r in rows if r["model"] == model and r.get("best_torch")))
  if end_to_end:
    synthetic = next((r.get("img_s") for r in end_to_end.get("rows", []) if r["row"] == "synthetic"), None)
    for r in end_to_end.get("rows", []):
      share = f", {r['img_s'] / synthetic:.1%} of synthetic" if r.get("img_s") and synthetic else ""
      out.append(f"end to end {r['row']}: " + (f"{r['img_s']:,.1f} img/s{share}" if r.get("img_s")
                                               else r.get("error", "no rate")))
  if not rows:
    out.append("headline: no rows measured")
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--tmp", required=True, help="the stages' folder (NAME.txt, NAME.json)")
  parser.add_argument("--out", required=True, help="results.json to write")
  args = parser.parse_args(argv)
  rows, results = collect(args.tmp)
  rows = with_ratios(rows)
  results["headlines"] = rows
  print("\n".join(lines(rows, results["stages"].get("end_to_end"))))
  with open(args.out, "w") as f:
    json.dump(results, f, indent=1, default=str)
  return 0


if __name__ == "__main__":
  sys.exit(main())
