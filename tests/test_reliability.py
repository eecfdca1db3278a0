"""A workdir never loses or poisons a model: ordinary mishaps, one test each.

Process boundaries matter for most of these (a lock, a kill, a signal, a full
disk), so they run `python -m jaxnet.main` on digits with tiny runs.
"""

import ast
import contextlib
import errno
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image
import pytest

from jaxnet.cli import report as report_command
from jaxnet.cli import export as export_command
from jaxnet.cli import process
from jaxnet import api

from jaxnet.core import checkpoint as ckpt
from jaxnet.core.adapters import grain as grain_adapter

from jaxnet.core import checkpoint as checkpoint_files

from jaxnet.core import config as config_io

from jaxnet.core import errors

from jaxnet.core import checkpoint as integrity

from jaxnet.cli import process as quiet
from jaxnet.core import train as train_lib
from jaxnet.core import provenance
from jaxnet.core import workdir as workdir_lib
from jaxnet.core.adapters import orbax as orbax_adapter
from jaxnet.core.metrics import read_jsonl
from tests.helpers import REPO, copy_run, run_main

ARGS = ("total_steps=20", "log_every_steps=5", "checkpoint_every_steps=10", "eval_every_steps=0",
        "batch_size=32")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A finished 20-step run with checkpoints 10 and 20; tests work on copies of it."""
  workdir = tmp_path_factory.mktemp("trained") / "w"
  run_main(workdir, *ARGS)
  return workdir


def _popen(workdir, *overrides):
  """Starts a training run in the background; its stdout goes to a file (see _wait_until)."""
  cmd = [sys.executable, "-m", "jaxnet.main", "--config=configs/digits.py", f"--workdir={workdir}",
         *[f"--config.{o}" for o in overrides]]
  log = open(f"{workdir}.out", "w+")
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.PIPE, text=True)
  proc.log = log
  return proc


def _wait_until(proc, condition, what, limit=300):
  deadline = time.time() + limit
  while not condition():
    if proc.poll() is not None:
      raise AssertionError(f"the run ended before {what}: {proc.stderr.read()[-3000:]}")
    assert time.time() < deadline, f"no {what} after {limit} s"
    time.sleep(0.2)


def _printed(proc, prefix):
  return lambda: any(l.startswith(prefix) for l in open(proc.log.name))


def _finish(proc, timeout):
  _, err = proc.communicate(timeout=timeout)
  return open(proc.log.name).read(), err


def _assert_one_clear_line(proc):
  assert proc.returncode not in (0, None), proc.stdout[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  errors_printed = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(errors_printed) == 1, proc.stderr[-3000:]
  return errors_printed[0]


# 1 -------------------------------------------------------------------------

def test_second_run_on_a_held_workdir_exits_naming_the_holder(tmp_path, capsys):
  workdir = tmp_path / "w"
  first = _popen(workdir, "total_steps=100000", "log_every_steps=1", "checkpoint_every_steps=2",
                 "batch_size=32")
  try:
    _wait_until(first, _printed(first, "step"), "a progress line")
    second = run_main(workdir, "total_steps=60", "optim.learning_rate=0.8", check=False)
    line = _assert_one_clear_line(second)
    assert "in use by another training run" in line and f"PID {first.pid}" in line, line
    assert first.poll() is None  # the first run was not disturbed
    _wait_until(first, lambda: any(d.isdigit() for d in os.listdir(workdir / "checkpoints")),
                "a checkpoint")
  finally:
    first.send_signal(signal.SIGKILL)
    first.communicate()
  # kill -9 leaves no stale lock: the same run resumes from a checkpoint (in this process: the
  # lock is the workdir's, whoever takes it next; a Python start costs seconds).
  capsys.readouterr()
  api.train(api.load_config(os.path.join(REPO, "configs/digits.py"),
                            {"total_steps": 1, "log_every_steps": 1, "checkpoint_every_steps": 2, "batch_size": 32}),
            str(workdir))
  assert "resumed from checkpoint at step" in capsys.readouterr().out


# 2 -------------------------------------------------------------------------

def test_checksums_detect_a_flipped_bit():
  tree = {"w": jnp.arange(1000, dtype=jnp.float32), "b": jnp.ones(3, jnp.bfloat16), "s": jnp.int32(7)}
  finite, sums, _ = integrity.inspect(tree)
  assert finite and set(sums) == {"w", "b", "s"}
  words = np.asarray(tree["w"]).view(np.uint32).copy()
  for position, bit in [(0, 0), (500, 17), (999, 31)]:
    flipped = words.copy()
    flipped[position] ^= np.uint32(1 << bit)
    changed = {**tree, "w": jnp.asarray(flipped.view(np.float32))}
    assert integrity.inspect(changed)[1]["w"] != sums["w"]
  # Swapping two values changes the sum too (positions are salted).
  swapped = {**tree, "w": tree["w"].at[0].set(1.0).at[1].set(0.0)}
  assert integrity.inspect(swapped)[1]["w"] != sums["w"]
  with pytest.raises(ckpt.DamagedCheckpointError, match="checksum mismatch in w"):
    integrity.verify(swapped, {"algorithm": integrity.CHECKSUM_ALGORITHM, "leaves": sums}, 5, "dir")


def test_checksums_on_the_host_are_the_devices_bit_for_bit():
  """Arrays in host memory are hashed in numpy, others in one jitted pass: one algorithm, so a
  checkpoint saved by either verifies under the other (a CPU run's restored on a GPU)."""
  rng = np.random.default_rng(0)
  tree = {"w": jnp.asarray(rng.standard_normal((70_001,), np.float32)),  # more than one host chunk
          "b": jnp.asarray(rng.standard_normal((3, 5)), jnp.bfloat16), "h": jnp.full((4,), -0.5, jnp.float16),
          "s": jnp.int32(-7), "u": jnp.arange(9, dtype=jnp.uint8), "m": jnp.array([True, False, True]),
          "k": jax.random.PRNGKey(3)}
  leaves = jax.tree.leaves(tree)
  device_finite, device_sums = jax.device_get(integrity._inspect_on_device(tree))
  host_finite, host_sums = integrity._inspect_on_host(leaves)
  assert device_finite and host_finite
  assert [int(s) for s in device_sums] == host_sums and len(set(host_sums)) == len(leaves)
  assert integrity.inspect(tree)[1] == integrity.inspect(jax.device_get(tree))[1]  # numpy leaves too
  bad = {**tree, "h": tree["h"].at[2].set(jnp.inf)}
  assert not integrity._inspect_on_host(jax.tree.leaves(bad))[0]
  assert integrity.inspect(bad)[0] is False and integrity.inspect(bad)[2] == ["h"]


def _flip_bytes_of_largest_file(directory):
  files = [f for f in glob.glob(f"{directory}/**/*", recursive=True) if os.path.isfile(f)]
  largest = max(files, key=os.path.getsize)
  data = bytearray(open(largest, "rb").read())
  middle = len(data) // 2
  for i in range(middle, middle + 300):
    data[i] ^= 0x5A
  open(largest, "wb").write(bytes(data))


def test_damaged_checkpoints_are_reported_and_skipped(trained, tmp_path, capsys):
  workdir = copy_run(trained, tmp_path)
  _flip_bytes_of_largest_file(workdir / "checkpoints" / "20" / "state")
  os.makedirs(workdir / "checkpoints" / "999")  # empty: as a half-copied directory looks

  evaluated = run_main(workdir, mode="eval", check=False)
  line = _assert_one_clear_line(evaluated)
  assert "checkpoint 999" in line and "damaged" in line
  with pytest.raises(ckpt.DamagedCheckpointError, match="checkpoint 20 .* damaged"):
    ckpt.load_arrays(workdir, 20)
  # A damaged checkpoint older than a complete one is damaged too, not one that rotation was
  # deleting while it was read (that would send the user to read another step).
  older = copy_run(trained, tmp_path, "older")
  _flip_bytes_of_largest_file(older / "checkpoints" / "10" / "state")
  with pytest.raises(ckpt.DamagedCheckpointError, match="checkpoint 10 .* damaged"):
    ckpt.load_arrays(older, 10)

  capsys.readouterr()  # the resume in this process (a Python start costs seconds), as the command line's
  api.train(_digits("total_steps=30", "keep_checkpoints=1"), str(workdir))
  resumed = capsys.readouterr().out
  assert "checkpoint 999" in resumed and "checkpoint 20" in resumed
  assert "resumed from checkpoint at step 10" in resumed
  assert sorted(os.listdir(workdir / "checkpoints")) == ["30"]  # rotation kept the newest
  assert len(os.listdir(workdir / "checkpoints_damaged")) == 2
  tree, step = ckpt.load_arrays(workdir)
  assert step == 30 and all(np.all(np.isfinite(x)) for x in jax.tree.leaves(tree["params"]))


# 3 -------------------------------------------------------------------------

def test_non_finite_state_is_never_saved(tmp_path):
  checkpoints = ckpt.Checkpoints(str(tmp_path / "unit"), keep=2, async_save=False)
  state = {"params": {"w": jnp.array([1.0, jnp.nan])}, "step": jnp.int32(3)}
  with pytest.raises(errors.NonFiniteError, match=r"step 3 has non-finite values \(params/w\)"):
    checkpoints.save(3, state, b"", {})
  checkpoints.close()
  assert not os.listdir(tmp_path / "unit" / "checkpoints")

  workdir = tmp_path / "diverged"
  proc = run_main(workdir, "total_steps=40", "optim.learning_rate=1e6", "log_every_steps=10",
                  "checkpoint_every_steps=5", "batch_size=32", check=False)
  line = _assert_one_clear_line(proc)
  assert "training diverged" in line and "learning_rate" in line, line
  # The first step with a non-finite loss or gradient, or the save that found a
  # non-finite state (BN variances can overflow before the loss does).
  first_bad = int(line.split(" at step ")[1].split(",")[0].split(" ")[0])
  assert first_bad <= 10  # found before the step-10 log line, by the save at step 5 or 10
  saved = [int(s) for s in os.listdir(workdir / "checkpoints") if s.isdigit()]
  assert all(s < first_bad for s in saved)
  for step in saved:
    tree, _ = ckpt.load_arrays(workdir, step)
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(tree) if x.dtype.kind == "f")
  newest = max(saved) if saved else None
  assert (f"newest intact checkpoint is step {newest}" if saved else "no intact checkpoint") in line


def test_fp16_stops_on_a_non_finite_loss_not_on_a_skipped_step():
  """fp16 skips a step with non-finite gradients (loss scaling) and goes on; a non-finite
  loss stops it, naming the step. fp32/bf16 stop at a non-finite gradient norm too."""
  newest = "The newest intact checkpoint is step 5."
  skipped = {"train/loss": jnp.float32(2.3), "train/grad_norm": jnp.float32(jnp.inf)}
  finite = {"train/loss": jnp.float32(2.2), "train/grad_norm": jnp.float32(1.0)}
  train_lib.check_finite_metrics([finite, skipped, finite], 8, newest, fp16=True)
  with pytest.raises(errors.NonFiniteError, match=r"diverged at step 7,.*intact checkpoint is step 5"):
    train_lib.check_finite_metrics([finite, skipped, finite], 8, newest, fp16=False)
  nan_loss = {"train/loss": jnp.float32(jnp.nan), "train/grad_norm": jnp.float32(jnp.nan)}
  with pytest.raises(errors.NonFiniteError, match=r"diverged at step 8,"):
    train_lib.check_finite_metrics([finite, skipped, nan_loss], 8, newest, fp16=True)


# 4 -------------------------------------------------------------------------

@pytest.mark.slow  # a minute; the config check is held in the default run by test_eval_refuses_a_config_that_changes_what_the_model_sees
def test_resume_with_a_changed_config(trained, tmp_path):
  workdir = copy_run(trained, tmp_path)
  config_before = (workdir / "config.json").read_bytes()
  def digits(*overrides):  # the config the command line builds from these overrides
    pairs = (o.split("=") for o in (*ARGS, *overrides))
    return api.load_config(os.path.join(REPO, "configs/digits.py"),
                           {k: v if v.isalnum() and not v.isdigit() else ast.literal_eval(v)
                            for k, v in pairs})

  with pytest.raises(workdir_lib.ConfigChangedError) as refused:
    api.train(digits("image_size=32", "batch_size=16", "precision=bf16", "label_smoothing=0.1",
                     "model.name=resnet18"), workdir)
  message = str(refused.value)
  for change in ("image_size: 16 -> 32", "batch_size: 32 -> 16", "precision: 'fp32' -> 'bf16'",
                 "label_smoothing: 0.0 -> 0.1", "model.name: 'resnet_tiny' -> 'resnet18'"):
    assert change in message, message
  assert "new --workdir" in message and "--accept_config_changes=" in message
  assert (workdir / "config.json").read_bytes() == config_before

  # On the command line: one short message, no orbax dump, nothing written.
  proc = run_main(workdir, *ARGS, "optim.name=adamw", check=False)
  _assert_one_clear_line(proc)
  assert "optim.name: 'sgd' -> 'adamw'" in proc.stderr and len(proc.stderr.splitlines()) < 8
  assert (workdir / "config.json").read_bytes() == config_before

  # Cadence and length may change; the change is recorded.
  api.train(digits("total_steps=25", "log_every_steps=25"), workdir)
  history = [json.loads(l) for l in open(workdir / "config_history.jsonl")]
  assert history[-1]["changes"] == {"log_every_steps": [5, 25], "total_steps": [20, 25]}
  assert history[-1]["resumed_from_step"] == 20
  assert json.load(open(workdir / "config.json"))["total_steps"] == 25

  # A key that alters training goes ahead once accepted.
  changed = digits("total_steps=26", "log_every_steps=25", "optim.learning_rate=0.2")
  with pytest.raises(workdir_lib.ConfigChangedError, match="optim.learning_rate: 0.4 -> 0.2"):
    api.train(changed, workdir)
  api.train(changed, workdir, accept_config_changes=["optim.learning_rate"])
  assert json.load(open(workdir / "config.json"))["optim"]["learning_rate"] == 0.2
  assert ckpt.load_arrays(workdir)[1] == 26

  # Another model, accepted: its arrays cannot take the checkpoint's. One line naming them;
  # the checkpoints are healthy, so nothing is set aside, and config.json is unchanged.
  config_before, steps_before = (workdir / "config.json").read_bytes(), os.listdir(workdir / "checkpoints")
  proc = run_main(workdir, *ARGS, "model.name=resnet18", flags=("--accept_config_changes=all",),
                  check=False)
  line = _assert_one_clear_line(proc)
  assert "holds a different model or optimizer" in line, line
  assert "(16,) in the checkpoint, (64,) in this run" in line, line  # resnet_tiny vs resnet18 widths
  assert os.listdir(workdir / "checkpoints") == steps_before
  assert not (workdir / "checkpoints_damaged").exists()
  assert (workdir / "config.json").read_bytes() == config_before


def _digits(*overrides):
  """The config the command line builds from ARGS and these overrides."""
  pairs = (o.split("=") for o in (*ARGS, *overrides))
  return api.load_config(os.path.join(REPO, "configs/digits.py"),
                         {k: v if v.isalnum() and not v.isdigit() else ast.literal_eval(v)
                          for k, v in pairs})


def test_a_deleted_config_json_is_restored_from_the_checkpoints(trained, tmp_path):
  workdir = copy_run(trained, tmp_path)
  original = json.load(open(workdir / "config.json"))
  os.remove(workdir / "config.json")
  # The checkpoints' config is the reference: a changed learning rate is refused...
  with pytest.raises(workdir_lib.ConfigChangedError, match=r"optim.learning_rate: 0.4 -> 0.2"):
    api.train(_digits("optim.learning_rate=0.2"), workdir)
  # ...and config.json is back, as the checkpoint saved it; nothing else was written.
  assert json.load(open(workdir / "config.json")) == original
  assert sorted(os.listdir(workdir / "checkpoints")) == ["10", "20"]

  # Without checkpoint 20's config, the older checkpoint's is used.
  os.remove(workdir / "config.json")
  os.remove(workdir / "checkpoints" / "20" / "config" / orbax_adapter.JSON_ITEM_FILE)
  assert workdir_lib.saved_config(str(workdir)) == json.load(
      open(workdir / "checkpoints" / "10" / "config" / orbax_adapter.JSON_ITEM_FILE))


def test_an_invalid_config_json_is_one_line_naming_it(trained, tmp_path):
  workdir = copy_run(trained, tmp_path)
  (workdir / "config.json").write_text('{\n  "seed": 0,\n}\n')
  for attempt in (lambda: api.train(_digits(), workdir), lambda: api.evaluate(workdir)):
    with pytest.raises(errors.UserError) as refused:
      attempt()
    message = str(refused.value)
    assert message.startswith(f"{workdir / 'config.json'} is not a valid config (") and "\n" not in message
    assert "delete it and train again" in message, message
  (workdir / "config.json").write_text("[]")
  with pytest.raises(errors.UserError, match="holds no JSON object"):
    workdir_lib.saved_config(str(workdir))


def test_a_refused_run_leaves_no_workdir_behind(tmp_path):
  """Values that only the experiment's build can refuse (an unknown model, too few
  devices): a workdir this run created goes again; one that existed stays."""
  for overrides, message in [(["model.name=nope"], "unknown model 'nope'"),
                             (["mesh.num_devices=64"], "asked for 64 devices"),
                             (["mesh.fsdp=True", "mesh.fsdp_devices=3"], "mesh.fsdp_devices=3 does not divide")]:
    workdir = tmp_path / "new"
    with pytest.raises((errors.UserError, ValueError), match=message):
      api.train(_digits(*overrides), workdir)
    assert not workdir.exists()
  existing = tmp_path / "existing"
  existing.mkdir()
  with pytest.raises(ValueError, match="unknown model"):
    api.train(_digits("model.name=nope"), existing)
  assert existing.is_dir()


# 5 -------------------------------------------------------------------------

@contextlib.contextmanager
def _tmpfs(path, size):
  os.makedirs(path)
  if shutil.which("mount") is None or os.geteuid() != 0:
    pytest.skip("mounting a small tmpfs needs root and mount(8)")
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           capture_output=True, text=True)
  if mounted.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
  try:
    yield path
  finally:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _tmpfs_bytes(path) -> int:
  """What the files under `path` would take on a tmpfs: each file's length rounded up to
  whole 4 KiB pages. Not the blocks the file system under the probe reports: those vary
  with it (preallocated up to twice on XFS, fewer on a compressing one such as a CI host's)."""
  return sum(-(-os.lstat(os.path.join(d, f)).st_size // 4096) * 4096
             for d, _, files in os.walk(path) for f in files)


def test_full_disk_stops_cleanly_and_keeps_the_newest_checkpoint(trained, tmp_path):
  # A disk on which the run's first checkpoint fits and its second does not (the size of
  # one is measured: it changes with the state, ~0.7 MB without an EMA copy). The module's
  # run trained this state (ARGS): its files but one of its two checkpoints are what this
  # run has written when it saves the second, half a checkpoint short of room for it.
  args = ("log_every_steps=10", "checkpoint_every_steps=5", "keep_checkpoints=1", "batch_size=32")
  checkpoint = _tmpfs_bytes(trained / "checkpoints" / "20")
  size_k = (_tmpfs_bytes(trained) - _tmpfs_bytes(trained / "checkpoints" / "10") + checkpoint // 2) // 1024
  with _tmpfs(tmp_path / "small", f"{size_k}k") as mount:
    workdir = mount / "w"
    proc = run_main(workdir, "total_steps=40", *args, check=False)
    shown = f"disk {size_k} KiB, checkpoint {checkpoint} B\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
    line = _assert_one_clear_line(proc)
    # The first save that does not fit is step 10's (a later one's if the probe's files were
    # smaller than this run's). Whichever it is, the run stops there in one line and keeps
    # the checkpoint before it.
    failed = re.search(r"checkpoint at step (\d+) FAILED \(no space left on device\)", line)
    assert failed and int(failed[1]) >= 10, shown
    step, kept = int(failed[1]), int(failed[1]) - 5
    assert f"writing {workdir}/checkpoints/{step}" in line and f"newest intact checkpoint is step {kept}" in line, shown
    assert len(proc.stderr.splitlines()) <= 3, shown  # no orbax tracebacks
    assert sorted(os.listdir(workdir / "checkpoints")) == [str(kept)], (os.listdir(workdir / "checkpoints"), shown)
    assert ckpt.load_arrays(workdir)[1] == kept


def test_a_failed_save_is_the_error_reported_when_closing_fails_too(tmp_path, monkeypatch):
  """A full disk fails the checkpoint first; the TensorBoard events buffered since the
  last flush then fail at close too (seen in CI). The run reports the checkpoint."""
  from jaxnet.core import metrics
  def full_disk(self, step, *args, **kwargs):  # save's signature (data_elements=...)
    raise self._save_failed(step, OSError(errno.ENOSPC, "No space left on device"))
  def flush_fails(self):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(ckpt.Checkpoints, "save", full_disk)
  monkeypatch.setattr(metrics.EventFile, "close", flush_fails)
  with pytest.raises(ckpt.CheckpointSaveError, match=r"checkpoint at step 5 FAILED \(no space left"):
    api.train(_digits("total_steps=10", "checkpoint_every_steps=5"), tmp_path / "w")


def test_a_failed_saves_late_writes_are_removed_at_close(tmp_path):
  # The first failed write ends orbax's save; tensorstore's writes of other arrays
  # can land after the cleanup and recreate the temporary directory (seen once in CI).
  checkpoints = ckpt.Checkpoints(str(tmp_path))
  partial = os.path.join(checkpoints.directory, "10.orbax-checkpoint-tmp", "state", "d")
  os.makedirs(partial)
  error = checkpoints._save_failed(10, OSError(errno.ENOSPC, "No space left on device"))
  assert "no space left on device" in str(error)
  assert not os.path.exists(os.path.dirname(os.path.dirname(partial)))

  def late_write():
    time.sleep(0.2)
    try:
      os.makedirs(partial)
      open(os.path.join(partial, "chunk"), "w").write("x")
    except FileNotFoundError:  # close's cleanup removed a parent mid-write: what it is for
      pass

  writer = threading.Thread(target=late_write)
  writer.start()
  checkpoints.close()
  writer.join()
  assert os.listdir(checkpoints.directory) == []


def test_read_only_workdir_still_evaluates(trained, tmp_path):
  with _tmpfs(tmp_path / "ro", "8m") as mount:
    shutil.copytree(trained, mount / "w")
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    proc = run_main(mount / "w", mode="eval")
    assert "eval of checkpoint 20: top-1" in proc.stdout
    assert "could not record the eval metrics" in proc.stderr


def test_ctrl_c_saves_then_exits(tmp_path):
  proc = _popen(tmp_path / "once", "total_steps=100000", "log_every_steps=1",
                "checkpoint_every_steps=0", "batch_size=32")
  _wait_until(proc, _printed(proc, "step"), "a progress line")
  proc.send_signal(signal.SIGINT)
  out, err = _finish(proc, 300)
  assert proc.returncode == 130, err[-3000:]
  assert "Traceback" not in err
  assert "interrupted: checkpoint saved at step" in out
  stopped = int(out.split("checkpoint saved at step ")[1].split(";")[0])
  _, step = ckpt.load_arrays(tmp_path / "once")
  assert step == stopped



def test_sigterm_stops_at_the_latest_at_the_next_log_step(tmp_path):
  """A single-process run too: the host reaches step boundaries ahead of the device and
  waits for it at log steps, so a signal that arrives while it waits is acted on there."""
  proc = _popen(tmp_path / "term", "total_steps=100000", "log_every_steps=5",
                "checkpoint_every_steps=0", "batch_size=32")
  _wait_until(proc, _printed(proc, "step      10/"), "the step-10 progress line")
  seen = open(proc.log.name).read()
  proc.send_signal(signal.SIGTERM)
  out, err = _finish(proc, 300)
  assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
  stopped = int(out.split("preempted: checkpoint saved at step ")[1].split(";")[0])
  logged_before = [int(l.split()[1].split("/")[0]) for l in seen.splitlines() if l.startswith("step ")]
  logged_after = [int(l.split()[1].split("/")[0]) for l in out[len(seen):].splitlines()
                  if l.startswith("step ")]
  # Never past the first log step printed after the signal (nor before the last one before it).
  assert max(logged_before) <= stopped <= (logged_after[0] if logged_after else max(logged_before) + 5)
  assert ckpt.load_arrays(tmp_path / "term")[1] == stopped


def test_a_second_ctrl_c_exits_at_once(monkeypatch, capsys):
  from jaxnet.cli import process as runtime
  exits = []
  monkeypatch.setattr(os, "_exit", exits.append)
  # Python's default_int_handler, or SIG_IGN where the suite was started in the background by
  # a shell without job control (`cmd &` in a script), which the process inherits.
  before = signal.getsignal(signal.SIGINT)
  with runtime.StopSignals() as signals:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.1)  # Python runs the handler between bytecodes
    assert signals.received == "SIGINT" and signals.requested() and not exits
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.1)
  assert exits == [130]
  assert "second Ctrl-C: exiting now without saving" in capsys.readouterr().err
  assert signal.getsignal(signal.SIGINT) is before  # restored


# 7 -------------------------------------------------------------------------

@pytest.mark.parametrize("override,message", [
    ({"batch_size": 0}, "batch_size=0 must be >= 1"),
    ({"batch_size": -1}, "batch_size=-1 must be >= 1"),
    ({"total_steps": -5}, "total_steps=-5 must be >= 0"),
    ({"total_steps": 0, "num_epochs": 0.0}, "num_epochs=0.0 must be > 0"),
    ({"keep_checkpoints": 0}, "keep_checkpoints=0 must be >= 1"),
    ({"image_size": 0}, "image_size=0 must be >= 1"),
])
def test_bad_values_are_refused_before_anything_is_written(tmp_path, override, message):
  config = api.load_config(os.path.join(REPO, "configs/digits.py"), override)
  workdir = tmp_path / "never"
  with pytest.raises(config_io.InvalidConfigError, match=message.replace("(", r"\(")):
    api.train(config, workdir)
  assert not workdir.exists()


def test_bad_input_on_the_command_line_is_one_line(tmp_path):
  proc = run_main(tmp_path / "w", "batch_size=0", check=False)
  assert "batch_size=0 must be >= 1" in _assert_one_clear_line(proc)
  assert not (tmp_path / "w").exists()

  bad_config = tmp_path / "bad.py"
  bad_config.write_text("from jaxnet.core.config import base_config\n\ndef get_config(:\n  pass\n")
  proc = run_main(tmp_path / "w", config=str(bad_config), check=False)
  assert f"{bad_config}:3: SyntaxError" in _assert_one_clear_line(proc)

  a_file = tmp_path / "file"
  a_file.write_text("")
  with pytest.raises(errors.UserError, match="is a file, not a directory"):
    api.train(api.load_config(os.path.join(REPO, "configs/digits.py")), a_file)

  missing = tmp_path / "missing"
  with pytest.raises(FileNotFoundError, match="no checkpoint"):
    api.evaluate(missing, api.load_config(os.path.join(REPO, "configs/digits.py")))
  assert not missing.exists()


def test_predict_and_export_errors_are_one_line(trained, tmp_path, capsys):
  from jaxnet.tools import export
  from jaxnet.cli import predict
  not_an_image = tmp_path / "notes.png"
  not_an_image.write_text("hello")
  empty = tmp_path / "empty"
  empty.mkdir()
  cases = [
      (predict.main, [f"--workdir={trained}", str(tmp_path / "nope.png")], "nope.png not found"),
      (predict.main, [f"--workdir={trained}", str(not_an_image)], "as an image ("),
      (predict.main, [f"--workdir={empty}", str(not_an_image)], "config.json not found"),
      (export_command.main, [f"--workdir={empty}", f"--out={tmp_path / 'm.jax'}"], "config.json not found"),
  ]
  for entry, argv, expected in cases:
    with pytest.raises(SystemExit) as stopped:
      entry(argv)
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and expected in err, err
  shutil.copy(trained / "config.json", empty / "config.json")
  with pytest.raises(SystemExit):
    export_command.main([f"--workdir={empty}", f"--out={tmp_path / 'm.jax'}"])
  assert "no checkpoint" in capsys.readouterr().err

  # A damaged newest checkpoint: predict and export stop with one line, as --mode=eval does,
  # and none of orbax's tracebacks of the other arrays' failed reads (once thousands of lines).
  damaged = copy_run(trained, tmp_path)
  _flip_bytes_of_largest_file(damaged / "checkpoints" / "20" / "state")
  image = tmp_path / "seven.png"
  PIL.Image.fromarray(np.full((8, 8), 200, np.uint8)).save(image)
  for command in (["jaxnet.cli.predict", f"--workdir={damaged}", str(image)],
                  ["jaxnet.cli.export", f"--workdir={damaged}", f"--out={tmp_path / 'd.jax'}"]):
    proc = subprocess.run([sys.executable, "-m", *command], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    line = _assert_one_clear_line(proc)
    assert "checkpoint 20" in line and "damaged" in line, line
    assert len(proc.stderr.splitlines()) <= 3, proc.stderr[-3000:]
  assert not (tmp_path / "d.jax").exists()


def test_metrics_have_one_line_per_step_after_a_resume(trained, tmp_path, capsys):
  workdir = copy_run(trained, tmp_path)
  # As if the run was killed while writing its final checkpoint.
  shutil.rmtree(workdir / "checkpoints" / "20")
  capsys.readouterr()  # the resume in this process (a Python start costs seconds), as the command line's
  api.train(_digits("log_every_steps=4"), str(workdir))
  printed = capsys.readouterr().out
  assert "resumed from checkpoint at step 10" in printed
  assert "(mean of 2 steps)" in printed  # steps 11-12: the first window after the resume
  records = read_jsonl(workdir)
  steps = [r["step"] for r in records]
  assert len(steps) == len(set(steps)), steps
  assert steps == [5, 10, 12, 16, 20]
  by_step = {r["step"]: r for r in records}
  assert by_step[12]["train/window_steps"] == 2 and by_step[16]["train/window_steps"] == 4
  assert "eval/top1" in by_step[20] and "train/loss" in by_step[20]  # one line, both kinds


def test_a_torn_last_metrics_line_is_skipped_and_never_joined(trained, tmp_path, capsys):
  """A kill during a write leaves the last line of metrics.jsonl cut short: readers skip
  and count it; `--mode=eval` writes its record on a line of its own, which a resume keeps."""
  from jaxnet.core import metrics
  from jaxnet.tools import report
  workdir = copy_run(trained, tmp_path)
  path = workdir / "metrics.jsonl"
  whole = read_jsonl(workdir)
  path.write_text(path.read_text() + '{"step": 25, "train/loss": 0.3')  # torn mid-record
  assert metrics.read_jsonl_counted(workdir) == (whole, 1)

  assert report_command.main([str(workdir), "--out", str(tmp_path / "report")]) == 0
  out = capsys.readouterr().out
  assert f"note: skipped 1 unreadable line of {path} (a write cut short" in out
  assert json.load(open(tmp_path / "report" / "summary.json"))["w"]["final_step"] == 20

  evaluated = api.evaluate(workdir, step=10)
  records, skipped = metrics.read_jsonl_counted(workdir)
  assert skipped == 1 and records[:-1] == whole
  assert records[-1]["step"] == 10 and records[-1]["eval/top1"] == pytest.approx(evaluated["eval/top1"])

  # A resume from step 20 drops only the torn line: every record, the eval's too, stays.
  assert metrics.drop_records_after(str(workdir), 20) == 1
  assert metrics.read_jsonl_counted(workdir) == (records, 0)



# A full disk under the run's own records, injected: the Nth write to metrics.jsonl, or to
# the TensorBoard event file, fails with ENOSPC as it would on a full filesystem.
_FULL_DISK = """
import errno, os, sys
target, budget = os.environ["JAXNET_TEST_FULL"], [int(os.environ["JAXNET_TEST_FULL_AFTER"])]

def spend():
  budget[0] -= 1
  if budget[0] < 0:
    raise OSError(errno.ENOSPC, "No space left on device")

if target == "metrics.jsonl":
  import builtins
  from jaxnet.core import metrics

  class Full:
    def __init__(self, f):
      self._f = f
    def __getattr__(self, name):
      return getattr(self._f, name)
    def write(self, text):
      spend()
      return self._f.write(text)

  def open_(path, *args, **kwargs):
    f = builtins.open(path, *args, **kwargs)
    return Full(f) if str(path).endswith("metrics.jsonl") else f
  metrics.open = open_
else:
  from tensorboardX import record_writer
  write = record_writer.RecordWriter.write
  def write_(self, data):
    spend()
    return write(self, data)
  record_writer.RecordWriter.write = write_
sys.argv = ["jaxnet.main"] + sys.argv[1:]
from jaxnet.cli import main
main.run()
"""


def _tensorboard_scalars(workdir) -> dict:
  """{tag: {step: value}} of WORKDIR's TensorBoard event file (TFRecord framing of Event protos)."""
  import struct
  from tensorboardX.proto import event_pb2
  [path] = glob.glob(str(workdir / "tensorboard" / "events.out.tfevents*"))
  data, scalars, at = open(path, "rb").read(), {}, 0
  while at < len(data):
    (length,) = struct.unpack("<Q", data[at:at + 8])
    event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
    at += 12 + length + 4
    for value in event.summary.value:
      if value.HasField("simple_value"):
        scalars.setdefault(value.tag, {})[event.step] = value.simple_value
  return scalars


@pytest.mark.parametrize("target,after", [("metrics.jsonl", 3), ("tensorboard", 22)])  # 22: 2 + 10 scalars x 2 steps
def test_a_full_disk_under_metrics_or_tensorboard_is_one_line(tmp_path, target, after):
  """Once, the TensorBoard writer's thread died and the run hung; a failed metrics.jsonl
  write ended in three chained tracebacks. Now: one line, the newest intact checkpoint."""
  workdir = tmp_path / "w"
  proc = run_main(workdir, "total_steps=40", "log_every_steps=1", "checkpoint_every_steps=2",
                  "async_checkpointing=False", "batch_size=32", python_prefix=("-c", _FULL_DISK),
                  env={"JAXNET_TEST_FULL": target, "JAXNET_TEST_FULL_AFTER": str(after)},
                  check=False, timeout=150)
  line = _assert_one_clear_line(proc)
  assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr[-3000:]
  written = re.escape(f"{workdir}/{target}")
  match = re.fullmatch(rf"error: writing {written}\S* FAILED \(no space left on device\) at step "
                       rf"(\d+); training stopped\. The newest intact checkpoint is step (\d+)\. "
                       rf"Free space there, then rerun the same command to resume\.", line)
  assert match, line
  step, intact = int(match[1]), int(match[2])
  assert intact == step - 2 + step % 2  # the last save before the failed write (every 2 steps)
  assert ckpt.load_arrays(workdir)[1] == intact
  if target == "metrics.jsonl":
    assert step == after + 1  # one line per step: the 4th line failed
    records = read_jsonl(workdir)
    assert [r["step"] for r in records] == list(range(1, after + 1))
    # TensorBoard holds the same numbers (written by the loop, flushed at close).
    assert _tensorboard_scalars(workdir)["train/loss"] == pytest.approx(
        {r["step"]: r["train/loss"] for r in records})


@pytest.mark.parametrize("name", ["config.json", "environment.json"])
def test_a_full_disk_under_config_or_run_info_is_one_line(trained, tmp_path, monkeypatch, name):
  import builtins
  from jaxnet.core import metrics
  workdir = copy_run(trained, tmp_path)
  before = (workdir / name).read_bytes()

  def full_open(path, mode="r", *args, **kwargs):
    if os.path.basename(str(path)).startswith(name) and "w" in mode:
      raise OSError(errno.ENOSPC, "No space left on device")
    return builtins.open(path, mode, *args, **kwargs)
  monkeypatch.setattr(workdir_lib, "open", full_open, raising=False)
  monkeypatch.setattr(metrics, "open", full_open, raising=False)
  with pytest.raises(errors.UserError) as stopped:
    api.train(_digits("total_steps=25"), workdir)
  assert str(stopped.value) == (
      f"writing {workdir / name} FAILED (no space left on device); training stopped. The newest "
      f"intact checkpoint is step 20. Free space there, then rerun the same command to resume.")
  assert (workdir / name).read_bytes() == before  # config.json is replaced whole or not at all
  assert not list(workdir.glob("*.tmp-*"))


def test_a_second_sigterm_exits_at_once(monkeypatch, capsys):
  """However the loop is held up (a long save, a blocked write), a second SIGTERM ends the process."""
  from jaxnet.cli import process as runtime
  exits = []
  monkeypatch.setattr(os, "_exit", exits.append)
  with runtime.StopSignals() as signals:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
    assert signals.received == "SIGTERM" and not exits
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
  assert exits == [143]
  err = capsys.readouterr().err
  assert "a second SIGTERM exits at once" in err and "second SIGTERM: exiting now without saving" in err


def test_the_library_leaves_the_process_hooks_loggers_and_warnings_alone(tmp_path):
  """A notebook's api.train / api.restore / api.evaluate: only the command-line tools (the
  shell, jaxnet/cli) touch process-wide state, and only for their own run: hooks, log
  filters and levels, warning filters, signal handlers, environment variables, jax's config."""
  import logging
  import warnings
  from absl import flags
  def process_state():
    return (sys.excepthook, sys.unraisablehook, list(logging.getLogger().filters),
            list(logging.getLogger("absl").filters), list(logging.getLogger("asyncio").filters),
            [logging.getLogger(n).level for n in ("", "absl", "orbax", "huggingface_hub")],
            list(warnings.filters), signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM),
            {k: v for k, v in os.environ.items() if k.startswith(("XLA_", "JAX"))},
            jax.config.jax_compilation_cache_dir, flags.FLAGS.is_parsed())
  import sklearn.datasets  # noqa: F401 (its import adds warning filters of scipy's own)
  before = process_state()
  workdir = tmp_path / "w"
  api.train(_digits("total_steps=4", "checkpoint_every_steps=2"), workdir)
  model = api.restore(workdir)
  model.logits(np.zeros((1, *model.image_shape), np.uint8))
  api.evaluate(workdir)
  assert process_state() == before


_SHAPE_BUG_CONFIG = '''
import importlib.util
import flax.linen as nn
import ml_collections
import jax.numpy as jnp
from jaxnet.core import models

class ShapeBug(nn.Module):
  """A user's model with a shape bug, which jax reports as a ValueError."""
  num_classes: int = 10
  dtype: object = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = False):
    features = nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))
    return jnp.concatenate(jnp.split(features, 3, axis=1), axis=1)  # 10 does not split in 3

models.register("shape_bug")(ShapeBug)

def get_config():
  spec = importlib.util.spec_from_file_location("digits", {digits!r})
  digits = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(digits)
  config = digits.get_config()
  config.model = ml_collections.ConfigDict({"name": "shape_bug"})  # its options are its fields
  return config
'''


def test_only_jaxnet_errors_become_one_line(tmp_path, capsys):
  """jaxnet's own explanations are one line; a bug in a user's model (here a shape error,
  a ValueError from jax, inside training) keeps its traceback, which its author needs."""
  with pytest.raises(SystemExit) as exited:
    with process.one_line_errors():
      raise errors.InvalidValueError("config.optim.name='x': use sgd, lars or adamw")
  assert exited.value.code == 1
  assert capsys.readouterr().err.startswith("error: config.optim.name='x': use sgd, lars or adamw\n")
  assert issubclass(errors.InvalidValueError, ValueError)  # callers catching ValueError still do
  assert issubclass(errors.MissingFileError, FileNotFoundError)

  config = tmp_path / "shape_bug.py"
  config.write_text(_SHAPE_BUG_CONFIG.replace("{digits!r}", repr(os.path.join(REPO, "jaxnet", "configs", "digits.py"))))
  proc = run_main(tmp_path / "w", "total_steps=2", config=str(config), check=False)
  assert proc.returncode != 0
  assert "Traceback" in proc.stderr and "ValueError: array split does not result" in proc.stderr, proc.stderr[-3000:]
  assert not any(l.startswith("error:") for l in proc.stderr.splitlines()), proc.stderr[-3000:]


# --- checkpoints written before the redesign --------------------------------------------

def test_a_workdir_written_by_jaxnet_before_the_redesign_restores_and_resumes(tmp_path):
  """tests/data/workdir_ab264ba: a digits run of main ab264ba (the layout before jaxnet.core),
  stopped after its checkpoint at step 3 of 6. Rerunning its command resumes it, and the
  resumed steps 4-6 are the ones that run made (its metrics.jsonl, before the resume drops
  them): the checkpoint, its data position and its config.json all still read."""
  workdir = tmp_path / "w"
  shutil.copytree(os.path.join(REPO, "tests", "data", "workdir_ab264ba"), workdir)
  original = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  assert [r["step"] for r in original] == [3, 6]
  # Its config.json still loads, and its checkpoint evaluates and predicts.
  config = api.load_config(str(workdir))
  assert (config.model.name, config.model.zero_init_last_bn, config.bn_group_size) == ("resnet_tiny", False, 0)
  assert "flavour" not in config.model and "bn_group_size" not in config.model
  assert api.restore(workdir).step == 3
  assert api.evaluate(workdir)["eval/examples"] == 359
  result = api.train(_digits("batch_size=64", "total_steps=6", "checkpoint_every_steps=3", "log_every_steps=3",
                             "eval_every_steps=0"), workdir)
  resumed = [r for r in read_jsonl(str(workdir)) if "train/loss" in r]  # not the eval's own line
  assert [r["step"] for r in resumed] == [3, 6]
  # The record was made on another machine with jax 0.10: XLA:CPU's sums run in another order on
  # another CPU or XLA version (jax 0.12: 8e-5 relative at step 6, 2026-11-27). After 6 steps
  # many examples' top two logits nearly tie, so their top-1 may change sides (AMD EPYC,
  # 2026-11-27: 87 of 359 right against the record's 86 on jax 0.10, 83 on jax 0.12): the
  # eval's loss is the measure that carries over.
  np.testing.assert_allclose(resumed[-1]["train/loss"], original[-1]["train/loss"], rtol=5e-4)
  np.testing.assert_allclose(result["eval/loss"], original[-1]["eval/loss"], rtol=2e-3)
  assert abs(result["eval/top1"] - original[-1]["eval/top1"]) <= 4 / 359 + 1e-9
  assert ckpt.load_arrays(workdir)[1] == 6
  # Its later checkpoints keep the record-level position it resumed with.
  assert ckpt.position_elements(str(workdir), 6) == "records"


# --- fourth round (issue 36) -------------------------------------------------------------

def test_eval_refuses_a_config_that_changes_what_the_model_sees(trained, tmp_path):
  """--mode=eval with --config.image_size=32 measured another input and overwrote the run's
  eval with it. Now it is refused, naming the change; accepted, it is recorded apart."""
  workdir = copy_run(trained, tmp_path)
  metrics_before = (workdir / "metrics.jsonl").read_text()
  refused = run_main(workdir, *ARGS, "image_size=32", mode="eval", check=False)
  assert "differs from the one" in _assert_one_clear_line(refused)
  assert "image_size: 16 -> 32" in refused.stderr and "--accept_config_changes=image_size" in refused.stderr
  accepted = run_main(workdir, *ARGS, "image_size=32", mode="eval", flags=["--accept_config_changes=image_size"])
  assert "eval of checkpoint 20" in accepted.stdout
  assert (workdir / "metrics.jsonl").read_text() == metrics_before  # the run's own record
  record = json.loads((workdir / workdir_lib.EVALS_WITH_CHANGES_FILE).read_text().splitlines()[-1])
  assert record["step"] == 20 and record["changes"] == {"image_size": [16, 32]} and "eval/top1" in record
  # Keys that change nothing an eval measures (the eval batch, the run's length) need no accepting
  # (in this process, as the command line's eval: a Python start costs seconds).
  api.evaluate(str(workdir), _digits("data.eval_batch_size=64", "total_steps=40"))
  # An invalid config.json is one line in eval mode too.
  (workdir / "config.json").write_text("{not json")
  assert "is not a valid config" in _assert_one_clear_line(run_main(workdir, *ARGS, mode="eval", check=False))


def test_a_checkpoint_rotated_away_while_it_is_read_is_not_damaged(trained, tmp_path):
  """Eval beside a training run: the newest checkpoint can be deleted by rotation while it is
  read. The reader takes the then newest one, and never calls the rotated one damaged."""
  workdir = copy_run(trained, tmp_path)
  checkpoints = ckpt.Checkpoints(str(workdir), read_only=True)
  calls = []

  def read(step):
    calls.append(step)
    if len(calls) == 1:  # rotation deletes step 20 under the reader
      shutil.rmtree(workdir / "checkpoints" / str(step))
    return checkpoints.read(step)[0]
  try:
    _, step = checkpoints.read_newest(read)
  finally:
    checkpoints.close()
  assert calls == [20, 10] and step == 10
  assert not (workdir / ckpt.DAMAGED_DIR).exists()
  # A damaged one (still there) is reported as damaged.
  with pytest.raises(ckpt.DamagedCheckpointError):
    ckpt.Checkpoints(str(workdir), read_only=True).read_newest(
        lambda s: (_ for _ in ()).throw(ckpt.DamagedCheckpointError(s, "d", "bad bytes")))


def test_exports_are_written_whole_or_not_at_all(trained, tmp_path):
  """--out: a missing folder is made, a directory or a folder that takes no files is one line
  before any work, and a full disk leaves the previous export (and its .json) as it was."""
  out = tmp_path / "new" / "sub" / "model.jax"
  export_command.main([f"--workdir={trained}", f"--out={out}"])
  assert out.exists() and json.loads(open(str(out) + ".json").read())["workdir"] == "w"  # no machine path
  good = (out.read_bytes(), open(str(out) + ".json").read())
  for bad, expected in ((tmp_path, "is a directory"),):
    with pytest.raises(SystemExit):
      export_command.main([f"--workdir={trained}", f"--out={bad}"])
  with _tmpfs(tmp_path / "tiny", "16k") as mount:
    with pytest.raises(SystemExit) as stopped:
      export_command.main([f"--workdir={trained}", f"--out={mount / 'model.jax'}"])
    assert stopped.value.code == 1 and sorted(os.listdir(mount)) == []  # nothing half-written
  # Room for the good export, not for a second one beside it: the re-export fails.
  with _tmpfs(tmp_path / "small", f"{len(good[0]) * 3 // 2 // 1024 + 16}k") as mount:
    target = mount / "model.jax"
    shutil.copy(out, target)
    with open(str(target) + ".json", "w") as f:
      f.write(good[1])
    with pytest.raises(SystemExit):
      export_command.main([f"--workdir={trained}", f"--out={target}", "--platforms=cpu,cuda"])
    assert target.read_bytes() == good[0] and open(str(target) + ".json").read() == good[1]
    assert sorted(os.listdir(mount)) == ["model.jax", "model.jax.json"]
  with _tmpfs(tmp_path / "ro", "1m") as mount:
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    with pytest.raises(SystemExit):
      export_command.main([f"--workdir={trained}", f"--out={mount / 'model.jax'}"])


def test_export_names_a_missing_workdir_as_a_workdir(tmp_path, capsys):
  with pytest.raises(SystemExit):
    export_command.main([f"--workdir={tmp_path / 'nope'}", f"--out={tmp_path / 'm.jax'}"])
  assert f"workdir {tmp_path / 'nope'} not found" in capsys.readouterr().err


def test_a_failure_while_closing_after_a_first_error_adds_nothing(tmp_path, monkeypatch):
  """A full disk right after a checkpoint: the save fails, then orbax's close fails too. The
  save's one line is what is raised, with no second exception chained to it."""
  import orbax.checkpoint as ocp

  def full_disk(self, step, *args, **kwargs):  # save's signature (data_elements=...)
    raise self._save_failed(step, OSError(errno.ENOSPC, "No space left on device"))

  def close_fails(self):
    raise OSError(errno.ENOSPC, "No space left on device (async metadata)")
  monkeypatch.setattr(ckpt.Checkpoints, "save", full_disk)
  monkeypatch.setattr(ocp.CheckpointManager, "close", close_fails)
  with pytest.raises(ckpt.CheckpointSaveError, match=r"checkpoint at step 5 FAILED") as raised:
    api.train(_digits("total_steps=10", "checkpoint_every_steps=5"), tmp_path / "w")
  assert raised.value.__context__ is None  # nothing chained: the close's failure added nothing


def test_warnings_about_unreadable_images_name_the_file_through_jaxnets_logger(tmp_path, caplog):
  from jaxnet.core.data.imagefolder import ImageFolderSource
  from jaxnet.core.data.transforms import EvalDecodeCrop
  for split in ("train", "val"):
    os.makedirs(tmp_path / split / "a")
    PIL.Image.new("RGB", (20, 20)).save(tmp_path / split / "a" / "good.png")
    (tmp_path / split / "a" / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
  source = ImageFolderSource(str(tmp_path), "train")
  index = [i for i in range(len(source)) if source.path(i).endswith("bomb.png")][0]
  with caplog.at_level("WARNING"):
    out = EvalDecodeCrop(16).map(source[index])
  assert not out["mask"]
  [record] = [r for r in caplog.records if "unreadable" in r.getMessage()]
  assert record.name == "jaxnet" and "bomb.png" in record.getMessage()


def test_a_torch_export_onto_a_full_disk_is_one_line_and_keeps_the_old_file(trained, tmp_path, capsys):
  """--format=torch wrote through safetensors' own writer, whose full-disk error was a
  23-line traceback (issue 46)."""
  out = tmp_path / "model.safetensors"
  assert export_command.main([f"--workdir={trained}", "--format=torch", f"--out={out}"]) == 0
  good = out.read_bytes()
  capsys.readouterr()
  with _tmpfs(tmp_path / "small", f"{len(good) * 3 // 2 // 1024 + 8}k") as mount:
    target = mount / "model.safetensors"
    shutil.copy(out, target)
    with pytest.raises(SystemExit) as stopped:
      export_command.main([f"--workdir={trained}", "--format=torch", f"--out={target}"])
    err = capsys.readouterr().err
    assert stopped.value.code == 1 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(target) in errors[0] and "no space left on device" in errors[0], err
    assert target.read_bytes() == good and os.listdir(mount) == ["model.safetensors"]


def test_a_checkpoint_whose_deletion_is_under_way_is_rotated_not_damaged(trained, tmp_path, monkeypatch):
  """Rotation deletes a step directory file by file: a reader that meets it half-deleted (the
  directory still there) called it damaged, and a listing that met a vanishing directory was
  orbax's 40-line FileNotFoundError (issue 46)."""
  workdir = copy_run(trained, tmp_path)
  directory = workdir / "checkpoints"
  checkpoints = ckpt.Checkpoints(str(workdir), read_only=True)
  calls = []

  def read(step):
    calls.append(step)
    if len(calls) == 1:  # the run saves step 30, then rotation starts deleting step 20
      shutil.copytree(directory / "20", directory / "30")
      for entry in os.listdir(directory / "20"):
        path = directory / "20" / entry
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return checkpoints.read(step)[0]
  real = checkpoints.manager.all_steps
  listed = []

  def racing_listing(*args, **kwargs):  # the first listing meets a directory being deleted
    listed.append(1)
    if len(listed) == 1:
      raise FileNotFoundError(2, "No such file or directory", str(directory / "10"))
    return real(*args, **kwargs)
  monkeypatch.setattr(checkpoints.manager, "all_steps", racing_listing)
  try:
    _, step = checkpoints.read_newest(read)
    assert calls == [20, 30] and step == 30 and len(listed) > 1
    assert not (workdir / ckpt.DAMAGED_DIR).exists()
    # A step asked for by number that rotation deleted is said so, not called damaged.
    def rotated(step):
      shutil.rmtree(directory / str(step))
      raise FileNotFoundError(2, "No such file or directory", str(directory / str(step)))
    with pytest.raises(errors.MissingFileError) as e:
      checkpoints.read_newest(rotated, 10)
  finally:
    checkpoints.close()
  assert str(e.value) == (f"checkpoint 10 in {directory} was deleted while it was read: the training run "
                          f"writing this workdir rotated it away (keep_checkpoints), so it is not damaged. "
                          f"Its checkpoints now: steps [20, 30]; read one of those, or leave out the step "
                          f"to read the newest")


def test_a_data_position_follows_its_data_to_another_folder_and_nothing_else():
  """Grain checks a saved position against repr(source), which names the data's path: the
  same data in another folder (a moved or regenerated copy, checked by data_identity.json)
  resumes; a source that differs otherwise is handed to Grain as saved, for it to refuse.
  (tests/test_detection.py's workdir_6a228ef_retinanet test resumes such a run end to end.)"""

  class Loader:  # the part of Grain's DataLoaderIterator its restore handler uses
    def __init__(self, source):
      self.source, self.given = source, None

    def get_state(self):
      return json.dumps({"data_source": self.source, "sampler": "IndexSampler(seed=0)"}).encode()

    def set_state(self, state):
      self.given = json.loads(state)

    def start_prefetch(self):
      pass

  here = "CocoSource('/data/new/annotations/instances_train.json', n=48)"
  for saved, expected in (("CocoSource('/tmp/old/annotations/instances_train.json', n=48)", here),
                          ("CocoSource('/tmp/old/annotations/instances_train.json', n=47)", None),
                          ("ArraySource(n=48, shape=(8, 8, 3), classes=10)", None)):
    loader = Loader(here)
    grain_adapter.restore_target(loader).set_state(json.dumps({"data_source": saved, "last": 7}).encode())
    assert loader.given == {"data_source": expected or saved, "last": 7}
  # An iterator without Grain's string state (DALI's, a stand-in) is passed on untouched.
  dali = object()
  assert grain_adapter.restore_target(dali) is dali


def test_a_data_position_of_another_loader_names_data_loader(trained, tmp_path, monkeypatch):
  """A DALI run resumed with data.loader=grain: Grain's refusal named worker_count, not the
  loader that wrote the position (issue 46)."""
  workdir = copy_run(trained, tmp_path)
  checkpoints = ckpt.Checkpoints(str(workdir), read_only=True)

  def grains_refusal(*args, **kwargs):  # what Grain says of DALI's saved position
    raise KeyError("worker_count")
  monkeypatch.setattr(checkpoints.manager, "restore", grains_refusal)
  try:
    with pytest.raises(ckpt.CheckpointMismatchError) as e:
      checkpoints._restore_position(20, iterator=object(), saved_processes=None)
  finally:
    checkpoints.close()
  assert "Resume with the same data.loader (grain or dali: each saves its own kind of position)" in str(e.value)


# --- sixth round (issue 57) ------------------------------------------------------------

def test_a_missing_or_unreadable_data_identity_is_refused_never_rewritten_from_this_data(trained, tmp_path):
  """With data_identity.json deleted or torn, a resume or an eval took any data and the record
  was written again from it. Now each is one refusal naming the file and the fix; accepted, the
  resume records this data (and says so in config_history.jsonl)."""
  workdir = copy_run(trained, tmp_path)
  record = workdir / "data_identity.json"
  kept = record.read_text()
  for damage, said in ((lambda: record.unlink(), "is missing"), (lambda: record.write_text("{torn"), "is unreadable")):
    damage()
    for attempt in (lambda: api.train(_digits(), workdir), lambda: api.evaluate(workdir)):
      with pytest.raises(provenance.DataChangedError) as e:
        attempt()
      assert f"{record} {said}" in str(e.value) and "--accept_config_changes=data_identity" in str(e.value)
      assert not record.exists() or record.read_text() == "{torn"
  api.train(_digits(), workdir, accept_config_changes=("data_identity",))
  assert record.read_text() == kept
  history = [json.loads(line) for line in (workdir / workdir_lib.HISTORY_FILE).read_text().splitlines()]
  assert history[-1]["data_changes"] == {"data_identity.json": ["unreadable", "this run's data"]}


def test_an_eval_takes_no_lock_while_it_reads_and_records_only_where_no_training_holds_the_workdir(trained,
                                                                                                  tmp_path, caplog):
  """An eval held the workdir's lock while it ran: a training started beside it was refused as
  'in use by another training run'. Now the eval reads without the lock, takes it only for the
  moment it records, and records nothing (naming the holder) where a training holds it."""
  workdir = copy_run(trained, tmp_path)
  with workdir_lib.Workdir.open(str(workdir), workdir_lib.EVAL):
    assert workdir_lib.held_by(str(workdir)) is None
    with workdir_lib.Lock(str(workdir), workdir_lib.TRAIN):  # a training starts beside the eval
      pass
  before = (workdir / "metrics.jsonl").read_text()
  with workdir_lib.Lock(str(workdir), workdir_lib.TRAIN):
    assert workdir_lib.held_by(str(workdir)).startswith(f"another training run (host ")
    with caplog.at_level("WARNING", logger="jaxnet.report"):
      assert api.evaluate(workdir)["eval/examples"] == 359
  assert (workdir / "metrics.jsonl").read_text() == before
  warned = [r.getMessage() for r in caplog.records if "not recorded" in r.getMessage()]
  assert len(warned) == 1 and f"is held by another training run (host" in warned[0] and f"PID {os.getpid()}" in warned[0]
  written = os.stat(workdir / "metrics.jsonl").st_mtime_ns
  time.sleep(0.01)
  api.evaluate(workdir)  # free again: recorded (merged into step 20's line, as the same numbers)
  assert os.stat(workdir / "metrics.jsonl").st_mtime_ns != written
  # What holds it is named: an import is not called a training run.
  with workdir_lib.Lock(str(workdir), workdir_lib.IMPORT):
    with pytest.raises(workdir_lib.WorkdirLockedError, match=r"is in use by a weights import \(host .*PID"):
      workdir_lib.Lock(str(workdir)).__enter__()


def test_a_full_disk_when_the_lock_file_is_written_is_one_line(tmp_path):
  with _tmpfs(tmp_path / "full", "64k") as mount:
    workdir = mount / "w"
    workdir.mkdir()
    with contextlib.suppress(OSError), open(mount / "filler", "wb") as f:
      f.write(b"\0" * (1 << 20))
    with pytest.raises(errors.UserError) as e:
      workdir_lib.Lock(str(workdir)).__enter__()
    assert str(e.value).startswith(f"could not ") and "lock file" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("model,override,message", [
    ("convnext_mini", {"model.stochastic_depth": 1.5}, "model.stochastic_depth=1.5 must be in [0, 1)"),
    ("convnext_mini", {"model.stochastic_depth": -0.5}, "model.stochastic_depth=-0.5 must be in [0, 1)"),
    ("convnext_mini", {"model.widths": (16, 0)}, "model.widths=(16, 0) must be one whole number >= 1 per stage"),
    ("convnext_mini", {"image_size": 3}, "needs images of at least 8x8 pixels, got 3x3; raise config.image_size"),
    ("efficientnet_mini", {"model.dropout_rate": 1.0}, "model.dropout_rate=1.0 must be in [0, 1)"),
    ("efficientnet_mini", {"model.head_width": -4}, "model.head_width=-4 must be a whole number >= 0"),
    ("efficientnet_mini", {"model.bn_epsilon": -1.0}, "model.bn_epsilon=-1.0 must be > 0"),
    ("efficientnet_mini", {"model.bn_momentum": 2.0}, "model.bn_momentum=2.0 must be in [0, 1]"),
])
def test_model_options_out_of_range_are_one_line_and_leave_no_workdir(tmp_path, model, override, message):
  """ConvNeXt's stochastic_depth 1.5 or EfficientNet's dropout_rate 1.0 trained with exit 0; widths
  (16, 0) and head_width -4 were tracebacks, bn_epsilon -1 diverged and blamed the learning rate."""
  config = api.load_config(os.path.join(REPO, "configs/digits.py"), {"model.name": model, **override})
  workdir = tmp_path / "never"
  with pytest.raises(errors.UserError) as e:
    api.train(config, workdir)
  assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
  assert not workdir.exists()


def test_a_get_config_that_returns_no_config_is_one_line(tmp_path):
  path = tmp_path / "mine.py"
  path.write_text("def get_config():\n  return {'batch_size': 8}\n")
  with pytest.raises(config_io.ConfigFileError) as e:
    api.load_config(str(path))
  assert str(e.value) == (f"{path}: get_config() returned a dict, not an ml_collections.ConfigDict: return the "
                          f"config, as configs/digits.py does")


def test_predict_beside_a_training_reads_the_newer_checkpoint_when_the_newest_is_rotated_away(trained, tmp_path,
                                                                                             monkeypatch):
  """predict (load_arrays) racing rotation failed: orbax's metadata of a checkpoint being
  deleted raised a NOT_FOUND traceback, or the checkpoint was called damaged. Its metadata now
  reads as damage, and a reader of the newest checkpoint takes the one saved meanwhile."""
  workdir = copy_run(trained, tmp_path)
  directory = workdir / "checkpoints"
  saved_tree = ckpt.Checkpoints.saved_tree

  def rotating(self, step):
    if step == 20 and not (directory / "30").exists():  # a training saves 30 while 20 is read
      shutil.copytree(directory / "20", directory / "30")
      raise ckpt.DamagedCheckpointError(step, self.directory, "its metadata cannot be read (NOT_FOUND: _sharding)")
    return saved_tree(self, step)
  monkeypatch.setattr(ckpt.Checkpoints, "saved_tree", rotating)
  tree, step = ckpt.load_arrays(str(workdir))
  assert step == 30 and "params" in tree
  # Asked for by number, a checkpoint that does not read is still an error, never another step.
  shutil.rmtree(directory / "30")
  monkeypatch.setattr(ckpt.Checkpoints, "saved_tree", lambda self, step: (_ for _ in ()).throw(
      ckpt.DamagedCheckpointError(step, self.directory, "its metadata cannot be read")))
  with pytest.raises(ckpt.DamagedCheckpointError):
    ckpt.load_arrays(str(workdir), 20)


def test_the_gate_takes_another_data_dir_where_the_identity_is_unchanged_and_nothing_else(trained, tmp_path):
  """The fast check of the test below: data.dir is where the data is; the identity says whether
  it is the same. Accepting data.dir by name no longer takes other data with it."""
  workdir = copy_run(trained, tmp_path)
  config_dict = json.loads((workdir / "config.json").read_text())
  recorded = json.loads((workdir / "data_identity.json").read_text())

  class Source:
    def __init__(self, identity):
      self._identity = identity

    def identity(self):
      return self._identity

  def gate(identity, accept=()):
    moved = {**config_dict, "data": {**config_dict["data"], "dir": "/data/elsewhere"}}
    with workdir_lib.Workdir.open(str(workdir), workdir_lib.TRAIN) as g:
      g.check(moved, accept)
      g.check_data({"train": Source(identity)}, accept)
      return g
  same = gate(recorded["train"])
  assert list(same.changes) == ["data.dir"] and same.data_changes == {} and not same.data_change_accepted
  other = {**recorded["train"], "examples": recorded["train"]["examples"] + 1}
  for accept in ((), ("data.dir",)):
    with pytest.raises(provenance.DataChangedError, match="train.examples"):
      gate(other, accept)
  accepted = gate(other, ("data_identity",))
  assert accepted.data_change_accepted and list(accepted.data_changes) == ["train.examples"]


@pytest.mark.slow  # 30-80 s on 2 shared cores: four starts; the gate's test above is the fast one
def test_moved_data_resumes_unasked_and_accepted_other_data_resumes_from_the_start_of_its_order(tmp_path, caplog):
  """Moving the data folder needed --accept_config_changes=data.dir, and that also took a
  relabelled image; after a file was added, the advertised data_identity could not resume (the
  saved data position did not fit). Now the same data moved resumes unasked, data.dir accepted
  still refuses other data, and accepted other data resumes from the start of its order."""
  from jaxnet.tools.make_imagefolder import make_imagefolder
  root = make_imagefolder(str(tmp_path / "data"), classes=2, per_class=8, val_per_class=2, seed=0, verbose=False)

  def config(data_dir, steps):
    return api.load_config("configs/resnet.py:runlocal", {
        "model.name": "resnet_tiny", "image_size": 16, "batch_size": 8, "data.workers": 0,
        "data.source": "imagefolder", "data.dir": data_dir, "data.eval_split": "val", "log_every_steps": 2,
        "total_steps": steps, "checkpoint_every_steps": 2, "eval_every_steps": 0})
  workdir = tmp_path / "w"
  api.train(config(root, 2), workdir)
  moved = str(tmp_path / "moved")
  shutil.move(root, moved)
  with caplog.at_level("INFO", logger="jaxnet.report"):
    api.train(config(moved, 3), workdir)  # the same data elsewhere: no override
  assert any("the data moved (data.dir " in r.getMessage() for r in caplog.records)
  assert ckpt.load_arrays(str(workdir))[1] == 3
  history = [json.loads(line) for line in (workdir / workdir_lib.HISTORY_FILE).read_text().splitlines()]
  assert history[-1]["changes"]["data.dir"] == [root, moved]
  # A relabelled image: data.dir accepted by name is no licence for other data.
  classes = sorted(os.listdir(os.path.join(moved, "train")))
  first = sorted(os.listdir(os.path.join(moved, "train", classes[0])))[0]
  shutil.move(os.path.join(moved, "train", classes[0], first), os.path.join(moved, "train", classes[1], first))
  with pytest.raises(provenance.DataChangedError, match="train.listing_sha256"):
    api.train(config(moved, 4), workdir, accept_config_changes=("data.dir",))
  # Accepted: the saved position (8 files' order of 16) does not fit 16 files... it resumes all
  # the same, from the start of the new data's order, saying so.
  shutil.copy(os.path.join(moved, "train", classes[1], first), os.path.join(moved, "train", classes[1], "added.png"))
  caplog.clear()
  with caplog.at_level("INFO", logger="jaxnet.report"):
    api.train(config(moved, 4), workdir, accept_config_changes=("data_identity",))
  assert ckpt.load_arrays(str(workdir))[1] == 4
  said = [r.getMessage() for r in caplog.records]
  assert any("the data order starts again from its beginning" in m for m in said), said
