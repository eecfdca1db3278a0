"""End-to-end checks of the training loop through the command line (issue: the whole loop)."""

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from jaxnet.core import checkpoint as ckpt
from jaxnet.core.metrics import read_jsonl
from tests.helpers import REPO, max_abs_diff, run_main


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory):
  """The digits quick start, shortened to 120 steps (the full run is the README command)."""
  workdir = tmp_path_factory.mktemp("digits")
  proc = run_main(workdir, "total_steps=120", "eval_every_steps=60", "checkpoint_every_steps=60",
                  "log_every_steps=20")
  return workdir, proc


def test_quick_start_learns_and_records_everything(quick_start):
  workdir, proc = quick_start
  records = read_jsonl(workdir)
  final = [r for r in records if "eval/top1" in r][-1]
  assert final["step"] == 120
  assert final["eval/top1"] >= 0.93, final          # full 330-step run reaches >= 0.97
  assert final["eval/top5"] > final["eval/top1"]  # top-5 is its own count (exact: test_tools.py)
  assert final["eval/examples"] == 359               # every test image exactly once
  train = [r for r in records if "train/loss" in r]
  assert [r["step"] for r in train] == [20, 40, 60, 80, 100, 120]
  for key in ("train/loss", "train/accuracy", "train/images_per_sec", "train/learning_rate"):
    assert all(np.isfinite(r[key]) for r in train), key
  assert train[-1]["train/loss"] < 0.5 * train[0]["train/loss"]
  # Progress lines and a final line with the test accuracy.
  assert "img/s" in proc.stdout and "ETA" in proc.stdout
  assert f"test top-1 {final['eval/top1']:.4f}" in proc.stdout.splitlines()[-1]
  # The workdir holds the resolved config, TensorBoard events and checkpoints.
  assert json.load(open(workdir / "config.json"))["model"]["name"] == "resnet_tiny"
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(workdir / "tensorboard"))
  assert sorted(os.listdir(workdir / "checkpoints")) == ["120", "60"]
  saved = os.listdir(workdir / "checkpoints" / "120")
  assert {"state", "data_iter", "config"} <= set(saved)


@pytest.mark.slow
def test_readme_quick_start_reaches_97_percent(tmp_path):
  """The README's first command, unshortened: 330 steps to >= 97% test top-1 (`-m slow`;
  the test above is its 120-step version)."""
  proc = run_main(tmp_path)
  final = [r for r in read_jsonl(tmp_path) if "eval/top1" in r][-1]
  assert final["step"] == 330 and final["eval/examples"] == 359
  assert final["eval/top1"] >= 0.97, final
  assert f"test top-1 {final['eval/top1']:.4f}" in proc.stdout.splitlines()[-1]


def test_the_run_writes_mlperfs_log_events_and_its_input_line(quick_start):
  from jaxnet.core import mlperf_log
  workdir, proc = quick_start
  events = mlperf_log.read(str(workdir / "mlperf.log"))
  keys = [e["key"] for e in events]
  assert keys.index("init_start") < keys.index("init_stop") < keys.index("run_start") < keys.index("run_stop")
  assert keys.count("block_start") == keys.count("block_stop") == 2  # an eval at step 60 and the final one
  evals = [(e["metadata"]["samples_count"], e["value"]) for e in events if e["key"] == "eval_accuracy"]
  metrics = [(r["step"] * 64, r["eval/top1"]) for r in read_jsonl(workdir) if "eval/top1" in r]
  assert evals == metrics  # batch 64
  assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "success"
  assert {e["key"]: e["value"] for e in events}["global_batch_size"] == 64
  # The input's rate against the step's, once, on the second log window.
  assert proc.stdout.count("input: ") == 1 and "img/s delivered over 20 steps" in proc.stdout
  checker = pytest.importorskip("mlperf_logging.compliance_checker.mlp_compliance")
  valid = checker.main(str(workdir / "mlperf.log"), "training_4.0.0/common.yaml",
                       checker.make_checker("training", "4.0.0", True, False))[0]
  assert valid


def test_eval_mode_reproduces_final_eval(quick_start):
  workdir, _ = quick_start
  before = [r for r in read_jsonl(workdir) if "eval/top1" in r][-1]
  proc = run_main(workdir, mode="eval")
  after = [r for r in read_jsonl(workdir) if "eval/top1" in r][-1]
  assert after["step"] == 120
  assert after["eval/top1"] == pytest.approx(before["eval/top1"], abs=1e-9)
  assert after["eval/top5"] == pytest.approx(before["eval/top5"], abs=1e-9)
  assert "eval of checkpoint 120: top-1" in proc.stdout


def test_non_finite_eval_is_an_error_naming_precision_and_backend(tmp_path):
  """evaluation.evaluate on NaN weights raises instead of returning NaN metrics."""
  import jax
  from jaxnet import api
  from jaxnet.core import train as evaluation
  from jaxnet.core import experiment
  config = api.load_config(os.path.join(REPO, "configs", "digits.py"), precision="fp16",
                           **{"mesh.num_devices": 1})
  exp = experiment.Experiment(config, need_train_data=False)
  nan = lambda s: jax.device_put(  # every float NaN (no init to compile)
      np.full(s.shape, np.nan if np.issubdtype(s.dtype, np.floating) else 0, s.dtype), s.sharding)
  state = jax.tree.map(nan, exp.abstract_state)
  with pytest.raises(evaluation.NonFiniteEvalError,
                     match=r"eval/loss is nan \(precision fp16, backend cpu, 359 examples\)"):
    evaluation.evaluate(exp, state)


def test_model_num_classes_is_the_head_width_and_never_narrower_than_the_data():
  """model.num_classes 0 takes the dataset's count; a wider head is allowed, a narrower one
  (labels past the last logit would get all-zero targets) is an error naming both counts."""
  from jaxnet import api
  from jaxnet.core import experiment
  digits = os.path.join(REPO, "configs", "digits.py")
  build = lambda n: experiment.Experiment(
      api.load_config(digits, **{"mesh.num_devices": 1, "model.num_classes": n}), need_train_data=False)
  assert build(0).num_classes == 10
  wide = build(12)
  assert wide.num_classes == 12 and wide.model.num_classes == 12
  with pytest.raises(ValueError, match=r"model.num_classes=5, but the digits data has 10 classes"):
    build(5)


def test_nan_bf16_eval_from_the_command_line_is_one_error_line(quick_start):
  """The real case: XLA's YNNPACK fusion forced back on (the user's flag wins) makes bf16 eval NaN."""
  from jaxnet.core.adapters import xla as xla_flags
  if not xla_flags.has_ynn_bug(xla_flags.jaxlib_version()):
    pytest.skip(f"jaxlib {xla_flags.jaxlib_version()} computes bf16 evals right with YNNPACK fusion")
  workdir, _ = quick_start
  before = read_jsonl(workdir)
  proc = run_main(workdir, "precision=bf16", mode="eval", check=False,
                  flags=("--accept_config_changes=precision",), env={"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce"})
  assert proc.returncode == 1, proc.stdout[-2000:]
  error = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(error) == 1 and "Traceback" not in proc.stderr, proc.stderr
  assert "eval/loss is nan (precision bf16, backend cpu, 359 examples)" in error[0]
  assert f"XLA_FLAGS={xla_flags.YNN_FUSION_OFF} " in error[0]
  assert read_jsonl(workdir) == before  # nothing recorded


def test_periodic_actions_run_every_n_steps_and_at_the_last_step_only_when_asked():
  from jaxnet.core.train import itstime
  steps = range(1, 11)
  # Logging asks for the last step; eval and saving leave it to the loop's end (once).
  assert [s for s in steps if itstime(s, 4, 10, last=True)] == [4, 8, 10]
  assert [s for s in steps if itstime(s, 4, 10, last=False)] == [4, 8]
  assert [s for s in steps if itstime(s, 5, 10, last=False)] == [5]
  assert [s for s in steps if itstime(s, 0, 10, last=True)] == [10]  # 0: never, but the last
  assert [s for s in steps if itstime(s, 0, 10, last=False)] == []


def test_resume_is_exact(tmp_path):
  """2N steps straight through == N steps, stop, resume to 2N (params and losses)."""
  args = ("total_steps=12", "log_every_steps=1", "checkpoint_every_steps=6", "eval_every_steps=0",
          "batch_size=32")
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  run_main(straight, *args)
  # The resumed run: the same run stopped right after its step-6 checkpoint.
  shutil.copytree(straight, resumed)
  shutil.rmtree(resumed / "checkpoints" / "12")
  lines = [l for l in open(resumed / "metrics.jsonl") if json.loads(l)["step"] <= 6]
  open(resumed / "metrics.jsonl", "w").writelines(lines)
  proc = run_main(resumed, *args)
  assert "resumed from checkpoint at step 6" in proc.stdout
  assert "record-level" not in proc.stdout
  # A new run's positions are a whole-batches loader's, and say so (a record-level one's do not).
  assert [ckpt.position_elements(w, 12) for w in (straight, resumed)] == ["batches", "batches"]

  a, step_a = ckpt.load_arrays(straight)
  b, step_b = ckpt.load_arrays(resumed)
  assert step_a == step_b == 12
  assert max_abs_diff(a["params"], b["params"]) <= 1e-6
  assert max_abs_diff(a["batch_stats"], b["batch_stats"]) <= 1e-6
  assert max_abs_diff(a["opt_state"], b["opt_state"]) <= 1e-6
  loss = lambda w: {r["step"]: r["train/loss"] for r in read_jsonl(w) if "train/loss" in r}
  la, lb = loss(straight), loss(resumed)
  # Steps 7..12 saw the same examples in the same order: no repeats or skips.
  for step in range(7, 13):
    assert la[step] == pytest.approx(lb[step], abs=1e-6), step


@pytest.mark.slow  # ~50 s (two short runs with worker processes); the default set holds tests/test_pipeline.py's
def test_a_run_resumed_on_a_node_with_another_core_count_continues_at_the_next_batch(tmp_path, monkeypatch):
  """data.workers=-1 (the ImageNet recipes: one worker per core, less one) preempted on a
  2-core node (1 worker) and resumed on a 3-core one (2 workers): its steps 3-4 are those of
  the uninterrupted run (it stopped on Grain's worker-count refusal before 2026-11-29)."""
  from jaxnet import api
  from jaxnet.core.data import pipeline
  config = api.load_config(os.path.join(REPO, "configs/digits.py"), {
      "total_steps": 4, "log_every_steps": 1, "checkpoint_every_steps": 2, "eval_every_steps": 0,
      "batch_size": 16, "data.workers": -1})
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  monkeypatch.setattr(pipeline, "cores_available", lambda: 2)
  api.train(config, str(straight))
  # The resumed run: the same run stopped right after its step-2 checkpoint, on another node.
  shutil.copytree(straight, resumed)
  shutil.rmtree(resumed / "checkpoints" / "4")
  lines = [l for l in open(resumed / "metrics.jsonl") if json.loads(l)["step"] <= 2]
  open(resumed / "metrics.jsonl", "w").writelines(lines)
  monkeypatch.setattr(pipeline, "cores_available", lambda: 3)
  api.train(config, str(resumed))
  loss = lambda w: {r["step"]: r["train/loss"] for r in read_jsonl(w) if "train/loss" in r}
  assert [loss(resumed)[s] for s in (3, 4)] == pytest.approx([loss(straight)[s] for s in (3, 4)], abs=1e-6)
  a, b = ckpt.load_arrays(straight)[0], ckpt.load_arrays(resumed)[0]
  assert max_abs_diff(a["params"], b["params"]) <= 1e-6


@pytest.mark.slow  # 1.5 minutes; SIGTERM's save is held in the default run by test_reliability.py's sigterm and ctrl-c tests
def test_sigterm_saves_and_resume_matches_uninterrupted_run(tmp_path):
  args = ["total_steps=200", "log_every_steps=1", "checkpoint_every_steps=0", "eval_every_steps=0",
          "batch_size=16"]
  reference = tmp_path / "reference"
  run_main(reference, *args)

  preempted = tmp_path / "preempted"
  cmd = [sys.executable, "-m", "jaxnet.main", "--config=configs/digits.py", f"--workdir={preempted}",
         *[f"--config.{a}" for a in args]]
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  for line in proc.stdout:
    if line.startswith("step"):
      proc.send_signal(signal.SIGTERM)  # as a cluster scheduler does on preemption
      break
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  assert "preempted: checkpoint saved at step" in out
  stopped_at = int(out.split("preempted: checkpoint saved at step")[1].split(";")[0])
  assert 0 < stopped_at < 200

  resumed = run_main(preempted, *args)
  assert f"resumed from checkpoint at step {stopped_at}" in resumed.stdout
  a, _ = ckpt.load_arrays(reference)
  b, step = ckpt.load_arrays(preempted)
  assert step == 200
  assert max_abs_diff(a["params"], b["params"]) <= 1e-6


_KILL_DURING_SECOND_SAVE = """
import os, signal, sys
import grain.python as grain
original = grain.PyGrainCheckpointHandler.save
calls = []
def save_then_die(self, directory, *a, **k):
  calls.append(directory)
  original(self, directory, *a, **k)
  if len(calls) == 2:  # the step-8 checkpoint is half written: die like a killed node
    os.kill(os.getpid(), signal.SIGKILL)
grain.PyGrainCheckpointHandler.save = save_then_die
sys.argv = ["jaxnet.main"] + sys.argv[1:]
from jaxnet.cli import main
main.run()
"""


def test_sigkill_while_checkpointing_leaves_previous_checkpoint(tmp_path):
  args = ("total_steps=12", "checkpoint_every_steps=4", "eval_every_steps=0", "log_every_steps=4",
          "batch_size=16", "async_checkpointing=false")
  proc = run_main(tmp_path, *args, python_prefix=("-c", _KILL_DURING_SECOND_SAVE), check=False)
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
  _, step = ckpt.load_arrays(tmp_path)  # the step-8 save never completed
  assert step == 4
  left = [d for d in os.listdir(tmp_path / "checkpoints") if not d.isdigit()]
  assert left and all("tmp" in d for d in left), left  # orbax's temporary directory of step 8
  proc = run_main(tmp_path, *args)
  assert "resumed from checkpoint at step 4" in proc.stdout
  _, step = ckpt.load_arrays(tmp_path)
  assert step == 12
  assert all(d.isdigit() for d in os.listdir(tmp_path / "checkpoints"))  # cleaned up on resume


def test_mistyped_override_names_the_key(tmp_path):
  proc = run_main(tmp_path, "batchsize=8", check=False)
  assert proc.returncode != 0
  assert "batchsize" in proc.stderr and "batch_size" in proc.stderr
  assert "Traceback" not in proc.stderr


def test_every_config_documents_its_command():
  import importlib.util
  folder = os.path.join(REPO, "jaxnet", "configs")
  for name in sorted(os.listdir(folder)):
    if not name.endswith(".py") or name.startswith("_"):
      continue
    spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(folder, name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    doc = module.__doc__ or ""
    assert f"jaxnet train --config={name[:-3]}" in doc, name
    assert "Expect" in doc and "Meant for" in doc, name
    module.get_config()  # builds without error


def test_the_step_runs_under_a_transfer_guard():
  import jax
  from jaxnet.core import train
  assert train._TRANSFER_GUARD == "disallow"  # set by tests/conftest.py for every run
  add_one = jax.jit(lambda x: x + 1)
  with jax.transfer_guard(train._TRANSFER_GUARD):
    with pytest.raises(Exception, match="host-to-device"):
      add_one(np.ones(3, np.float32))  # what an implicit copy in the loop would do


def test_profile_verbosity_and_config_in_tensorboard(tmp_path):
  import glob
  import gzip
  proc = run_main(tmp_path, "total_steps=4", "log_every_steps=2", "profile_steps=(2, 3)",
                  "checkpoint_every_steps=0", "batch_size=16", flags=("--verbosity=0",))
  assert "profile of steps 2-3 written to" in proc.stdout
  assert "starting from scratch" in proc.stderr  # an INFO line: --verbosity is respected
  runs = glob.glob(str(tmp_path / "tensorboard" / "plugins" / "profile" / "*"))
  assert len(runs) == 1 and glob.glob(f"{runs[0]}/*.xplane.pb")
  traces = glob.glob(f"{runs[0]}/*.trace.json.gz")
  if traces:  # jax versions that also write the Chrome trace: the annotated steps are in it
    events = json.load(gzip.open(traces[0]))["traceEvents"]
    assert sorted(e["args"]["step_num"] for e in events if e.get("name") == "train") == ["2", "3"]
  else:
    assert b"step_num" in open(glob.glob(f"{runs[0]}/*.xplane.pb")[0], "rb").read()
  events_file = glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents*"))[0]
  assert b"resnet_tiny" in open(events_file, "rb").read()  # the config, as TensorBoard text
