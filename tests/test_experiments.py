"""Every benchmark in experiments/ runs in its smallest mode and prints its table, so none can rot.

These check the tables' contents and shape, never speed (speed is what the
benchmarks print). Each runs in a subprocess on one CPU device: the 8 fake
devices of conftest.py would make every step 8 times larger. bench_train also
gets XLA's backend optimisation level 0, which cuts its CPU compile time by
more than half (mostly the init): its --tiny timings mean nothing anyway,
and the program it runs is the same.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRECISIONS = ("fp32", "bf16", "fp16")
NUMBER = re.compile(r"^\d+(\.\d+)?$")


def run_script(script, *args, xla_flags="", timeout=420, expect_exit=0):
  """Runs experiments/SCRIPT (or `-c CODE` when script is None); returns its stdout."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags, "PYTHONUNBUFFERED": "1"}
  target = [os.path.join("experiments", script)] if script else []
  proc = subprocess.run([sys.executable, *target, *args], cwd=REPO,
                        capture_output=True, text=True, timeout=timeout, env=env)
  assert proc.returncode == expect_exit, \
      f"{script} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
  return proc.stdout


def test_bench_train_tiny_has_every_precision_and_both_peer_ratios(tmp_path):
  out = run_script("bench_train.py", "--tiny", "--json", str(tmp_path / "r.json"),
                   xla_flags="--xla_backend_optimization_level=0")
  header = next(line for line in out.splitlines() if line.strip().startswith("prec"))
  columns = header.split()
  assert "jaxnet/flax" in columns and "jaxnet/torch" in columns and "jaxnet/keras" in columns
  assert "MFU" in columns
  rows = {line.split()[0]: line.split() for line in out.splitlines()
          if line.split() and line.split()[0] in PRECISIONS}
  assert set(rows) == set(PRECISIONS), out
  has_torch = importlib.util.find_spec("torch") is not None
  for precision, cells in rows.items():
    # 14 columns; "peak mem" is two tokens ("9.8 MiB").
    assert len(cells) == 15, (precision, cells)
    jaxnet_img_s, flax_ratio, torch_ratio, keras_ratio = cells[2], cells[-5], cells[-3], cells[-1]
    assert NUMBER.match(jaxnet_img_s) and float(jaxnet_img_s) > 0
    assert NUMBER.match(flax_ratio) and 0.1 < float(flax_ratio) < 10, cells
    if has_torch:
      assert NUMBER.match(torch_ratio) and float(torch_ratio) > 0, cells
    else:
      assert torch_ratio == "-"
    assert keras_ratio == "-"  # the Keras peer builds resnet50 only
  if not has_torch:
    assert "torch is not installed" in out
  assert "keras peer: resnet50 only (not resnet_tiny)" in out
  assert "CPU:" in out and "devices: 1 x cpu" in out and "versions: python" in out and "date:" in out

  record = json.loads((tmp_path / "r.json").read_text())
  by_precision = {r["precision"]: r for r in record["rows"]}
  assert set(by_precision) == set(PRECISIONS)
  for r in by_precision.values():
    assert r["flops_per_step_per_device"] > 0 and r["compile_s"] > 0 and r["peak_bytes"] > 0
    assert r["jaxnet_over_flax"] == pytest.approx(r["img_s"] / r["flax_img_s"])
    assert len(r["repeat_ms"]) == len(r["flax_repeat_ms"]) == 2
  # Only fp16 has a loss scale that skips steps (see the next test for skips that happen).
  assert by_precision["fp32"]["skipped_steps"] == by_precision["bf16"]["skipped_steps"] == 0
  assert record["failures"] == []


# A bench_train worker whose fp16 loss scale starts at 2**100: every step's fp16
# backward pass overflows, so every step is skipped (the scale only halves).
_OVERFLOWING_FP16_WORKER = """
import sys
sys.path.insert(0, "experiments")
from jaxnet.core import config as config_base
base = config_base.base_config
def overflowing():
  c = base()
  c.loss_scale.initial_scale = 2.0**100
  return c
config_base.base_config = overflowing
import bench_train
bench_train.main(["--worker", "--tiny", "--precisions", "fp16", "--batches", "2", "--no-flax"])
"""


def test_bench_train_reports_the_skipped_fp16_steps():
  out = run_script(None, "-c", _OVERFLOWING_FP16_WORKER, xla_flags="--xla_backend_optimization_level=0")
  (result,) = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
  assert result["precision"] == "fp16" and "error" not in result, result
  assert result["skipped_steps"] == 1 + 2 * 2  # --tiny: 1 warm-up step, 2 repeats of 2 steps


def test_bench_train_exits_non_zero_when_a_cell_fails():
  out = run_script("bench_train.py", "--tiny", "--no-torch", "--no-flax", "--precisions", "fp32,bf16",
                   "--model", "no_such_model", expect_exit=1)
  errors = [line for line in out.splitlines() if "jaxnet error:" in line]
  assert len(errors) == 2 and all("no_such_model" in line for line in errors), out
  assert "FAILED: 3 problem(s)" in out  # two cells, and nothing measured


def _load_bench_train():
  spec = importlib.util.spec_from_file_location("bench_train", os.path.join(REPO, "experiments", "bench_train.py"))
  bench_train = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench_train)
  return bench_train


def test_a_failed_peer_cell_fails_the_run_but_a_cell_not_run_does_not():
  bench_train = _load_bench_train()
  measured = [{"precision": "bf16", "batch_per_device": 8, "img_s": 1.0}]
  peers = {"torch": {("bf16", 8): {"img_s": 1.0}},
           "keras": {("bf16", 8): {"error": "ValueError: keras-hub built 1 weights"},
                     ("fp32", 8): {"error": "not run: time budget spent"}}}
  assert bench_train.failed_cells(measured, peers, []) == [
      "keras bf16 batch 8: ValueError: keras-hub built 1 weights"]
  assert bench_train.failed_cells(measured, {"keras": {("fp32", 8): peers["keras"][("fp32", 8)]}}, []) == []


def test_the_torch_peer_is_taken_at_its_best_and_each_of_its_failures_counts():
  """A peer measuring a cell several ways (torch.compile modes): the ratio is against its
  fastest, all are kept under "variants", and a variant that failed fails the run."""
  bench_train = _load_bench_train()
  results = [{"precision": "bf16", "batch": 8, "compile_mode": "default", "img_s": 2.0},
             {"precision": "bf16", "batch": 8, "compile_mode": "max-autotune-no-cudagraphs", "img_s": 3.0},
             {"precision": "fp16", "batch": 8, "compile_mode": "default", "img_s": 1.0},
             {"precision": "fp16", "batch": 8, "compile_mode": "max-autotune-no-cudagraphs",
              "error": "OutOfMemoryError: ..."}]
  best = bench_train.best_by_cell(results)
  assert best[("bf16", 8)]["img_s"] == 3.0 and len(best[("bf16", 8)]["variants"]) == 2
  assert best[("fp16", 8)]["img_s"] == 1.0
  measured = [{"precision": "bf16", "batch_per_device": 8, "img_s": 1.0}]
  assert bench_train.failed_cells(measured, {"torch": best}, []) == [
      "torch fp16 batch 8 max-autotune-no-cudagraphs: OutOfMemoryError: ..."]


def test_peak_table_picks_the_device_and_precision():
  bench_train = _load_bench_train()

  class Args:
    peak_tflops = peak_tflops_fp32 = None

  assert bench_train.peak_for("NVIDIA H100 80GB HBM3", "bf16", Args)[0] == 989.0
  assert bench_train.peak_for("NVIDIA H100 80GB HBM3", "fp32", Args)[0] == 494.5  # TF32
  assert bench_train.peak_for("NVIDIA H100 PCIe", "fp16", Args)[0] == 756.0
  assert bench_train.peak_for("NVIDIA H200", "bf16", Args)[0] == 989.0
  assert bench_train.peak_for("NVIDIA A100-SXM4-80GB", "bf16", Args)[0] == 312.0
  assert bench_train.peak_for("cpu", "bf16", Args)[0] is None
  Args.peak_tflops = 100.0
  assert bench_train.peak_for("cpu", "bf16", Args) == (100.0, "--peak-tflops")
  assert bench_train.peak_for("cpu", "fp32", Args)[0] is None


@pytest.mark.slow  # 1.5 minutes idle, 3.7 loaded; the other benchmarks' quick runs stay in the default run
@pytest.mark.bar
def test_time_to_accuracy_quick_reaches_both_targets(tmp_path):
  out = run_script("time_to_accuracy.py", "--quick", "--json", str(tmp_path / "t.json"))
  record = json.loads((tmp_path / "t.json").read_text())
  runs = {r["run"]: r for r in record["results"]}
  assert set(runs) == {"digits", "imagefolder"}
  assert runs["digits"]["target"] == 0.97
  for r in runs.values():
    assert r["reached"] and r["top1"] >= r["target"], r
    assert 0 < r["from_loop_s"] < r["from_launch_s"]
    assert r["epochs"] > 0 and r["images_per_sec"] > 0
    assert r["returncode"] == 0  # jaxnet took the SIGTERM as a preemption and exited cleanly
  # Each run's row is printed as soon as it ends (before the next run starts), so a
  # time limit that stops the script later keeps it; then all rows once more.
  lines = out.splitlines()
  rows = {name: [i for i, line in enumerate(lines) if line.split()[:1] == [name]]
          for name in ("digits", "imagefolder")}
  next_launch = next(i for i, line in enumerate(lines) if line.startswith("[imagefolder] "))
  assert len(rows["digits"]) == len(rows["imagefolder"]) == 2, out
  assert rows["digits"][0] < next_launch < rows["imagefolder"][0]
  final = lines.index("all runs:")
  assert final < rows["digits"][1] and final < rows["imagefolder"][1]
  assert all(lines[i].split()[3] == "yes" for i in rows["digits"] + rows["imagefolder"]), out


@pytest.mark.slow  # ~2 min; the benchmarks' table format is held by bench_train's and bench_scaling's quick runs
def test_bench_input_quick_prints_both_tables():
  out = run_script("bench_input.py", "--quick", "--workers", "0,1")
  assert "hardware:" in out
  assert "PIL: full decode + crop + resize" in out
  loader_table = out.split("\n2) ")[1].split("\n3) ")[0]  # 3) is DALI's table, where DALI is installed
  workers = [line.split()[0] for line in loader_table.splitlines()
             if re.match(r"^\s*[01]( \(in-process\))?\s+\d", line)]
  assert workers == ["0", "1"], out
  try:
    import nvidia.dali  # noqa: F401
  except ImportError:
    assert "3) DALI: not installed (pip install -e '.[dali]'): no rows" in out
  else:
    threads = [line.split()[0] for line in out.split("\n3) ")[1].splitlines() if re.match(r"^\s*1\s+\d", line)]
    assert threads == ["1"], out
  # Table 4: where the time goes, then prepared shards (prepare's default, all JPEG) beside full-size.
  stages, rates = out.split("\n4a) ")[1].split("\n4b) ")
  assert len(re.findall(r"^prepared, shorter side 256, 75% raw\s+(224|160)\s", stages, re.M)) == 2, out
  rows = {line[:36].strip(): line[36:].split() for line in rates.splitlines()
          if line.startswith(("full-size JPEGs", "prepared, shorter side"))}
  assert list(rows) == ["full-size JPEGs", "prepared, shorter side 256, 75% raw", "prepared, shorter side 256"]
  assert rows["full-size JPEGs"][3] == "1.00x" and float(rows["prepared, shorter side 256"][2]) > 0


@pytest.mark.skipif(not os.path.exists(os.path.join(REPO, "experiments", "bench_scaling.py")),
                    reason="experiments/bench_scaling.py is not on this branch yet")
@pytest.mark.slow  # 45 s; a benchmark's table and peer ratio are held by bench_train's quick run
def test_bench_scaling_quick():
  out = run_script("bench_scaling.py", "--quick")
  rows = [line.split() for line in out.splitlines() if re.match(r"^\s*[1248]\s+\d+\s+[\d.]+\s+\d+%", line)]
  assert [int(r[0]) for r in rows] == [1, 2, 4, 8], out
  for devices, global_batch, rate, efficiency, compile_s in rows:
    assert int(global_batch) == 8 * int(devices)  # weak scaling: 8 images per device
    assert float(rate) > 0 and float(compile_s) > 0
    # efficiency = images/s / (devices x images/s on one device), as printed (rounded)
    expected = float(rate) / (int(devices) * float(rows[0][2]))
    assert abs(int(efficiency[:-1]) - 100 * expected) <= 1, (rows, expected)
  assert "says nothing about GPU scaling" in out


@pytest.mark.slow  # 55 s; the ONNX engines themselves are held by test_onnx_export.py, a benchmark's table by bench_train's
def test_bench_inference_smallest_prints_every_engine_and_node_counts():
  """resnet18 at 32px, batch 1, 2 calls a cell: every engine's row (torch's peer needs torch,
  not a test dependency, so it is left out here)."""
  for name in ("onnx", "onnxruntime", "qwix"):
    pytest.importorskip(name, reason="the onnx extra is not installed")
  out = run_script("bench_inference.py", "--model", "resnet18", "--image-size", "32", "--batches", "1",
                   "--iterations", "2", "--calibration-images", "8")
  rows = {line.split("|")[1].strip(): line.split("|")[2:] for line in out.splitlines()
          if line.startswith("| ") and not line.startswith("| engine")}
  assert list(rows) == ["jax.export fp32", "jax.export bf16", "jax.export int8 (qwix)",
                        "jaxnet ONNX fp32", "jaxnet ONNX int8"], out
  # resnet18 as written: input 3 (Transpose, Cast, Add), stem 3, 8 blocks of 5 and 3
  # projections, head 3 (GlobalAveragePool, Flatten, Gemm)
  assert rows["jaxnet ONNX fp32"][0].strip() == "52"
  for cells in rows.values():
    assert float(cells[2]) > 0 and float(cells[4]) > 0  # p50 ms, images/s
  assert "CPU:" in out and "onnxruntime" in out


def _experiment_module(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "experiments", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_device_check_profile_summary_sorts_kernels_by_kind():
  """The profile's kinds as the H200 trace named them: cuDNN convolutions by their HLO custom
  call, XLA's own kernels (loop_/input_) as fusions whatever the HLO op computes, cuDNN's
  flash attention by its kernel name; time per step, launches per step and TFLOP/s."""
  check = _experiment_module("gpu_device_check")
  kinds = {"custom-call.1": "conv", "fusion.7": "conv", "fusion.8": "fusion"}
  events = [
      {"name": "sm90_xmma_fprop_implicit_gemm_bf16", "dur": 2000.0, "args": {"hlo_op": "custom-call.1"}},
      {"name": "loop_convert_multiply_fusion_11", "dur": 1000.0, "args": {"hlo_op": "fusion.7"}},
      {"name": "input_add_reduce_fusion_18", "dur": 500.0, "args": {"hlo_op": "fusion.8"}},
      {"name": "cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "dur": 400.0, "args": {}},
      {"name": "ncclDevKernel_AllReduce_Sum_f32", "dur": 100.0, "args": {}},
  ] * 2
  s = check.summarize_profile(events, kinds, steps=2, step_seconds=0.005, flops_per_step=1e12,
                              peak_tflops=1000.0)
  assert s["by_kind_ms_per_step"] == {"conv": 2.0, "fusion": 1.5, "attention": 0.4, "collective": 0.1}
  assert s["launches_per_step"] == 5 and s["events_matched_to_hlo"] == 6
  assert s["busy_ms_per_step"] == pytest.approx(4.0)
  assert s["top_kernels"][0]["kind"] == "conv" and s["top_kernels"][0]["ms_per_step"] == 2.0
  assert s["tflops"] == pytest.approx(200.0) and s["mfu"] == pytest.approx(0.2)


def test_end_to_end_rate_skips_the_windows_that_hold_the_compile(tmp_path):
  e2e = _experiment_module("bench_end_to_end")
  path = tmp_path / "metrics.jsonl"
  rates = [63, 294, 6556, 6487, 6450]
  path.write_text("".join(json.dumps({"step": 10 * (i + 1), "train/images_per_sec": r}) + "\n"
                          for i, r in enumerate(rates)) + json.dumps({"step": 50, "eval/top1": 1.0}) + "\n")
  assert e2e.rate_from_metrics(str(path)) == (6487, rates)


def test_time_to_accuracy_plan_names_each_term_and_the_bottleneck(tmp_path, capsys):
  tta = _experiment_module("time_to_accuracy")
  bench = {"hardware": "CPU: test", "date": "date: today",
           "transform": {"prepared, shorter side 256": {"224": 400.0, "192": 500.0, "160": 600.0}},
           "loader": {"full-size JPEGs": {"224": 100.0, "160": 120.0},
                      "prepared, shorter side 256": {"224": 300.0, "160": 450.0}}}
  (tmp_path / "bench.json").write_text(json.dumps(bench))
  assert tta.main(["--plan", "--input-json", str(tmp_path / "bench.json"), "--cores", "113"]) == 0
  out = capsys.readouterr().out
  h100 = out.split("8x H100")[1].split("8x H200")[0]
  rows = {line.split()[0]: line.split() for line in h100.splitlines() if line.strip()[:1].isdigit()}
  # 112 workers x 300 img/s at 224px = 33,600 < the step's 8 x 6,647: the input bounds that phase.
  assert rows["224px"][3] == "33,600" and rows["224px"][-1] == "input"
  assert rows["192px"][3] == "42,000"  # 112 x 300 x 500/400: the transform's ratio to 224
  # 160px: 112 x 450 = 50,400 against the step's 53,176 x (224/160)^2 = 104,225.
  assert rows["160px"][2] == "104,225" and rows["160px"][-1] == "input"
  seconds = {p: float(rows[p][-2]) for p in rows}
  assert seconds["224px"] == pytest.approx(40 * 1_281_167 * 0.15 / 33_600, abs=0.1)
  assert "the bottleneck: the input" in h100 and "compile" in h100 and "evals" in h100
  # The same host with fast input: the step bounds every phase.
  assert tta.main(["--plan", "--input-per-core", "5000"]) == 0
  assert "the bottleneck: the step" in capsys.readouterr().out
  # A bench that measured several prepared shards: the plan takes prepare's default's row.
  bench["default_prepared"] = "prepared, shorter side 256, 75% raw"
  bench["transform"][bench["default_prepared"]] = {"224": 800.0, "192": 900.0, "160": 1000.0}
  bench["loader"][bench["default_prepared"]] = {"224": 600.0, "160": 700.0}
  (tmp_path / "bench.json").write_text(json.dumps(bench))
  assert tta.main(["--plan", "--input-json", str(tmp_path / "bench.json"), "--cores", "113"]) == 0
  out = capsys.readouterr().out
  assert "input: prepared, shorter side 256, 75% raw, jaxnet's Grain loader" in out
  rows = {line.split()[0]: line.split() for line in out.split("8x H100")[1].split("8x H200")[0].splitlines()
          if line.strip()[:1].isdigit()}
  assert rows["224px"][3] == "67,200"  # 112 x 600


def test_mlperf_log_names_the_benchmark_its_model_family_declares(tmp_path):
  """submission_benchmark is MLPerf's "resnet" for every ResNet (ResNet.MLPERF_BENCHMARK), the
  model's own name for the others: asked of the model (models.declared), never its name's prefix."""
  from jaxnet import api
  from jaxnet.core import mlperf_log
  for name, want in (("resnet_tiny", "resnet"), ("resnet50", "resnet"), ("vit_s16", "vit_s16")):
    (tmp_path / name).mkdir()
    log = mlperf_log.MlperfLog(str(tmp_path / name))
    log.settings(api.load_config("digits", **{"model.name": name}), devices="cpu", train_samples=1, eval_samples=1)
    log.close()
    events = {e["key"]: e["value"] for e in mlperf_log.read(str(tmp_path / name / "mlperf.log"))}
    assert events["submission_benchmark"] == want, name


def test_time_to_accuracy_reads_mlperf_logs(tmp_path):
  tta = _experiment_module("time_to_accuracy")
  from jaxnet.core import mlperf_log
  log = mlperf_log.MlperfLog(str(tmp_path))
  for key, value, ms in (("run_start", None, 1000), ("eval_accuracy", 0.5, 4000), ("eval_accuracy", 0.76, 9000),
                         ("eval_accuracy", 0.77, 12000)):
    log.event(key, value, time_ms=ms)
  log.close()
  assert tta.mlperf_time_to_target(str(tmp_path / "mlperf.log"), 0.759) == 8.0
  assert tta.mlperf_time_to_target(str(tmp_path / "mlperf.log"), 0.8) is None
  assert tta.mlperf_time_to_target(str(tmp_path / "missing.log"), 0.759) is None


def test_device_check_sets_each_measured_layer_beside_the_plans():
  """The per-layer table: each measured row beside the plan's row of the same layer, part and
  pass (measured over the roofline ms); a planned row the device never ran stays, with no
  measurement; the plan is the one compiled for the device's own target."""
  check = _experiment_module("gpu_device_check")
  measured = [{"layer": "stage1", "part": "bn", "pass": "backward", "kernels": 3, "bytes": 2.0,
               "measured_ms": 1.5, "gb_per_s": 1.0},
              {"layer": "head", "part": "head gemm", "pass": "forward", "kernels": 1, "bytes": 1.0,
               "measured_ms": 0.2, "gb_per_s": 1.0}]
  plan = [{"layer": "stage1", "part": "bn", "pass": "backward", "kernels": 4, "bytes": 3.0, "ms": 0.5},
          {"layer": "stem", "part": "pool", "pass": "backward", "kernels": 1, "bytes": 1.0, "ms": 0.1}]
  rows = {(r["layer"], r["part"]): r for r in check.plan_beside(measured, plan)}
  assert rows["stage1", "bn"]["plan_kernels"] == 4 and rows["stage1", "bn"]["measured_over_plan"] == 3.0
  assert rows["head", "head gemm"]["plan_ms"] is None and rows["head", "head gemm"]["measured_over_plan"] is None
  assert rows["stem", "pool"]["measured_ms"] == 0.0 and rows["stem", "pool"]["plan_ms"] == 0.1
  plans = {"h100": {"target": "h100"}, "h200": {"target": "h200"}}
  assert check.matching_plan(plans, "NVIDIA H200")[0] == "h200"
  assert check.matching_plan(plans, "NVIDIA A100")[0] == "h100"
  assert check.matching_plan({}, "cpu") == (None, None)


def test_gpu_headlines_sets_each_jaxnet_row_against_the_best_torch_row_of_its_model(tmp_path):
  """run_gpu_benchmarks.sh's headlines: the torch peers' RESULT lines (every compile mode), the
  device checks and bench_train's cells in one table; each row over the fastest torch row of
  its model, whatever its mode or precision; a failed cell listed with its error; one
  results.json of it all."""
  heads = _experiment_module("gpu_headlines")
  result = lambda **kw: "RESULT " + json.dumps({"precision": "bf16", "batch": 256, "ms_step": 40.0,
                                                "peak_bytes": 2**30, **kw}) + "\n"
  (tmp_path / "torch.txt").write_text("INFO {}\n" + result(img_s=6000.0, compile_mode="default", optimizer="fused"))
  (tmp_path / "torch_autotune.txt").write_text(
      result(img_s=6400.0, compile_mode="max-autotune-no-cudagraphs", optimizer="fused")
      + "RESULT " + json.dumps({"precision": "fp16", "batch": 256, "error": "not run: time budget spent"}) + "\n")
  check = {"model": "resnet50", "precision": "bf16", "per_gpu_batch": 256, "img_s": 8000.0, "ms_step": 32.0,
           "flops_per_step": 6.4e12, "peak_bytes": 10 * 2**30, "memory": {"total": 1}}
  (tmp_path / "levers_on.json").write_text(json.dumps(check))
  (tmp_path / "fcn.json").write_text(json.dumps({**check, "model": "fcn_resnet50", "img_s": 100.0}))
  cell = {"precision": "fp16", "batch_per_device": 256, "global_batch": 256, "img_s": 7040.0, "ms_step": 36.4,
          "tflops_per_device": 172.0, "peak_bytes": 2**30, "flax_img_s": 7126.0}
  (tmp_path / "bench_train.json").write_text(json.dumps({"rows": [cell]}))
  (tmp_path / "convnext_tiny.json").write_text(json.dumps({"rows": [
      {**cell, "precision": "bf16", "img_s": 3000.0, "flax_img_s": None,
       "torch": {"precision": "bf16", "batch": 256, "img_s": 2500.0, "ms_step": 1.0, "compile_mode": "default"}}]}))
  (tmp_path / "end_to_end.json").write_text(json.dumps({"rows": [
      {"row": "synthetic", "img_s": 6000.0}, {"row": "prepared", "img_s": 5700.0}]}))
  out = tmp_path / "results.json"
  assert heads.main(["--tmp", str(tmp_path), "--out", str(out)]) == 0
  rows = {r["row"]: r for r in json.loads(out.read_text())["headlines"]}
  assert rows["jaxnet levers_on (resnet50 bf16 b256)"]["vs_best_torch"] == pytest.approx(1.25)
  assert rows["jaxnet levers_on (resnet50 bf16 b256)"]["tflops"] == pytest.approx(200.0)
  assert rows["jaxnet bench_train (resnet50 fp16 b256)"]["vs_best_torch"] == pytest.approx(1.1)
  assert rows["flax-minimal (resnet50 fp16 b256)"]["img_s"] == 7126.0
  assert rows["torch (resnet50 default, fused, bf16 b256)"]["vs_best_torch"] == pytest.approx(0.9375)
  assert "error" in rows["torch (resnet50 fp16 b256)"]
  assert rows["jaxnet convnext_tiny (convnext_tiny bf16 b256)"]["vs_best_torch"] == pytest.approx(1.2)
  assert rows["jaxnet fcn (fcn_resnet50 bf16 b256)"]["vs_best_torch"] is None  # no torch fcn row
  results = json.loads(out.read_text())
  assert sorted(results["peers"]) == ["torch", "torch_autotune"] and "end_to_end" in results["stages"]
