"""jaxnet/core/adapters: each behaviour of a library that jaxnet relies on beyond its API, pinned
on the versions installed (both CI legs), so that a release that changes one fails here, by
name, instead of making jaxnet misbehave. And the shell's use of them (jaxnet/cli/process.py:
the XLA flags, the filters of noise already reported)."""

import errno
import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from jaxnet.cli import process
from jaxnet.core.adapters import grain as grain_adapter
from jaxnet.core.adapters import orbax as orbax_adapter
from jaxnet.core.adapters import xla
from tests.helpers import REPO

YNN = xla.YNN_FUSION_OFF
FORCED_ON = "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce"  # what XLA fuses by default
NEEDED = xla.has_ynn_bug(xla.jaxlib_version())


# --- jax, jaxlib, XLA ------------------------------------------------------------------

def test_merge_keeps_every_user_flag_and_adds_the_rest():
  count = "--xla_force_host_platform_device_count=8"
  assert process.merge_flags("", [YNN]) == YNN
  # Another flag (tests/conftest.py's device count) does not stop the workaround...
  assert process.merge_flags(count, [YNN]) == f"{count} {YNN}"
  # ...but the user's own value of the same flag wins.
  assert process.merge_flags(f"{FORCED_ON} {count}", [YNN]) == f"{FORCED_ON} {count}"
  assert process.merge_flags(f" {YNN} ", [YNN]) == YNN
  # A flag whose name merely starts with another's is a different flag.
  assert (process.merge_flags("--xla_gpu_foo_bar=1", ["--xla_gpu_foo=2"])
          == "--xla_gpu_foo_bar=1 --xla_gpu_foo=2")


def test_affected_jaxlib_versions():
  assert xla.version_tuple("0.12.0.1") == (0, 12, 0, 1)
  assert xla.version_tuple("0.13.0.dev20260101") == (0, 13, 0)
  # Measured: 0.10.0, 0.10.2, 0.11.0, 0.11.1 right; 0.11.2, 0.12.0, 0.12.0.1 wrong. 0.13 and
  # later are not assumed to define the flag (an unknown flag aborts XLA).
  for version, bug in [((0, 10, 2), False), ((0, 11, 1), False), ((0, 11, 2), True),
                       ((0, 12, 0), True), ((0, 12, 0, 1), True), ((0, 13, 0), False), (None, False)]:
    assert xla.has_ynn_bug(version) == bug, version


def test_the_shell_adds_the_workaround_on_the_cpu_only_where_needed(monkeypatch):
  count = "--xla_force_host_platform_device_count=8"
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("XLA_FLAGS", count)
  process.apply_xla_flags()
  assert os.environ["XLA_FLAGS"] == (f"{count} {YNN}" if NEEDED else count)
  monkeypatch.setenv("XLA_FLAGS", FORCED_ON)
  process.apply_xla_flags()
  assert os.environ["XLA_FLAGS"] == FORCED_ON
  monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")  # a GPU run: the CPU workaround stays out
  monkeypatch.setenv("XLA_FLAGS", count)
  process.apply_xla_flags()
  assert YNN not in os.environ["XLA_FLAGS"]


def _docs_reproduction() -> str:
  text = open(os.path.join(REPO, "docs", "models.md")).read()
  section = text[text.index("### bf16 on the CPU"):]
  return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _reproduction_is_right(flags: str, shell_setup: bool) -> bool:
  """Runs the docs' reproduction in a fresh process with XLA_FLAGS=`flags`, after the command
  line's jaxnet.cli.process.setup() if asked."""
  code = ("from jaxnet.cli import process; process.setup()\n" if shell_setup else "") + _docs_reproduction()
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  verdict = re.search(r"jit matches eager: (True|False)", proc.stdout)
  assert verdict, proc.stdout
  return verdict.group(1) == "True"


def test_ynn_bug_range_is_where_this_jaxlib_computes_the_reproduction_wrong():
  version = xla.jaxlib_version()
  # The shell's setup makes it right on every jaxlib, even with other flags set (so the flag
  # exists wherever the range says so: an unknown flag would abort XLA).
  assert _reproduction_is_right("--xla_force_host_platform_device_count=2", shell_setup=True), (
      f"jaxnet.cli.process.setup() left the reproduction wrong on jaxlib {version}")
  # Without the workaround it is wrong exactly on the jaxlibs the workaround is for.
  wrong_without = not _reproduction_is_right("", shell_setup=False)
  assert wrong_without == NEEDED, (
      f"jaxlib {version} computes the reproduction right without the flag: XLA fixed it, narrow "
      f"YNN_BUG_VERSIONS in jaxnet/core/adapters/xla.py" if NEEDED else
      f"jaxlib {version} computes the reproduction wrong: widen YNN_BUG_VERSIONS in "
      f"jaxnet/core/adapters/xla.py")
  # The user's own setting of the flag wins over jaxnet's.
  assert _reproduction_is_right(FORCED_ON, shell_setup=True) == (not NEEDED)


def test_nan_hint_names_the_flag_only_when_it_can_be_the_cause(monkeypatch):
  monkeypatch.setattr(xla, "jaxlib_version", lambda: (0, 12, 0, 1))
  monkeypatch.setenv("XLA_FLAGS", FORCED_ON)
  hint = xla.ynn_hint("bf16", "cpu")
  assert "YNNPACK" in hint and f"XLA_FLAGS={YNN} " in hint
  assert xla.ynn_hint("fp16", "cpu") == xla.ynn_hint("bf16", "gpu") == ""
  monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {YNN}")
  assert xla.ynn_hint("bf16", "cpu") == ""  # the workaround was on: something else
  monkeypatch.setattr(xla, "jaxlib_version", lambda: (0, 10, 2))
  monkeypatch.setenv("XLA_FLAGS", "")
  assert xla.ynn_hint("bf16", "cpu") == ""


def test_jax_distributed_client_is_where_the_heartbeat_looks_for_it():
  """jax has no public accessor for its distributed client; the private global state must
  still exist (None without jax.distributed; tests/test_parallel.py's two-process runs use a
  live one)."""
  assert xla.distributed_client() is None


def test_a_failed_collective_is_a_jax_runtime_error():
  import jax
  assert issubclass(jax.errors.JaxRuntimeError, Exception)
  assert xla.is_runtime_failure(jax.errors.JaxRuntimeError("UNAVAILABLE: gloo"))
  assert not xla.is_runtime_failure(ValueError("a shape bug"))


# --- grain ---------------------------------------------------------------------------

_WORKERS_WITHOUT_PARSED_FLAGS = '''
import numpy as np, grain.python as grain
class S:
  def __len__(self): return 8
  def __getitem__(self, i): return {"x": np.full((2,), i, np.int32)}
if __name__ == "__main__":
  loader = grain.DataLoader(data_source=S(), operations=[grain.Batch(4)], worker_count=1,
      sampler=grain.IndexSampler(8, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0))
  print(sum(len(b["x"]) for b in loader))
'''


def test_grain_workers_need_parsed_absl_flags(tmp_path):
  """Why ensure_absl_flags_parsed exists: when this fails, Grain no longer needs it; delete it."""
  script = tmp_path / "workers.py"
  script.write_text(_WORKERS_WITHOUT_PARSED_FLAGS)
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode != 0 and "UnparsedFlagAccessError" in proc.stderr, proc.stdout
  script.write_text(_WORKERS_WITHOUT_PARSED_FLAGS.replace(
      'if __name__ == "__main__":\n', 'if __name__ == "__main__":\n'
      '  from jaxnet.core.adapters import grain as a; a.ensure_absl_flags_parsed()\n'))
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                        cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO})
  assert proc.returncode == 0 and proc.stdout.strip() == "8", proc.stderr[-2000:]


def test_grain_iterators_close_and_unlink_through_the_names_the_adapter_uses():
  import grain.python as grain
  assert hasattr(grain.SharedMemoryArray, "_del_thread_pool")  # the deleter wait_for_unlinks joins
  source = [{"x": np.full((2,), i, np.int32)} for i in range(8)]
  loader = grain.DataLoader(data_source=source, operations=[grain.Batch(4)], worker_count=0,
                            sampler=grain.IndexSampler(8, grain.NoSharding(), shuffle=False,
                                                       num_epochs=1, seed=0))
  iterator = iter(loader)
  next(iterator)
  assert callable(getattr(iterator, "close", None) or getattr(iterator._iterator, "close"))
  grain_adapter.close_iterator(iterator, workers=0)
  grain_adapter.close_iterator(iterator, workers=0)  # idempotent



@pytest.mark.parametrize("workers", [0, 2])
def test_grains_data_position_is_the_format_the_adapter_reads_and_writes(workers):
  """The adapter reads and writes Grain 0.2's DataLoader position: its fields, and where its
  workers stand (worker i gives the sampler's indices i, i + W, ...). Written for this count at
  the index Grain has reached, it is what Grain wrote."""
  import grain.python as grain
  grain_adapter.ensure_absl_flags_parsed()
  loader = grain.DataLoader(data_source=[{"x": np.int32(i)} for i in range(16)], worker_count=workers,
                            sampler=grain.IndexSampler(16, grain.NoSharding(), shuffle=False,
                                                       num_epochs=1, seed=0))
  iterator = iter(loader)
  start = json.loads(iterator.get_state())
  assert [int(next(iterator)["x"]) for _ in range(3)] == [0, 1, 2]
  state = json.loads(iterator.get_state())
  grain_adapter.close_iterator(iterator, workers)
  assert set(state) == {"version", "last_seen_indices", "last_worker_index", "worker_count", "sampler", "data_source"}
  assert grain_adapter.worker_count_of(state) == workers
  assert [grain_adapter.next_index(start), grain_adapter.next_index(state)] == [0, 3]
  assert grain_adapter.position_at(state, 3, workers) == state
  assert grain_adapter.position_at(state, 0, workers) == start
  with pytest.raises(ValueError, match="version 3"):
    grain_adapter.next_index({**state, "version": 3})


def test_a_workers_kept_segment_is_handed_over_through_grains_protocol_and_reused_once_unlinked(monkeypatch):
  """SharedBatchArrays relies on grain 0.2's hand-over: a worker passes a metadata leaf on as
  it is (copy_to_shm), the consumer maps it by name and, once its array is gone, closes and
  unlinks that name (open_from_shm, the deleter). A batch still held is never written."""
  import multiprocessing
  from grain._src.python.ipc import shared_memory_array as shm_array
  if not os.path.isdir("/dev/shm"):
    pytest.skip("no /dev/shm")
  assert not grain_adapter.can_hand_over()  # the consumer's own process stacks its own arrays
  monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
  assert grain_adapter.can_hand_over()  # a worker process, with grain's metadata where pinned
  shm_array.SharedMemoryArray.enable_async_del(1)  # as a DataLoader with workers does
  arrays = grain_adapter.SharedBatchArrays()

  def ours():  # the names this test's arrays made in /dev/shm: kept segments, and hand-overs named after them
    return {n for n in os.listdir("/dev/shm") if any(n.startswith(shm.name) for shm in arrays._segments)}
  sent = arrays.stack([np.full((3, 2), i, np.uint8) for i in range(4)])
  assert shm_array.copy_to_shm(sent) is sent  # the worker sends it as it is
  held = shm_array.open_from_shm(sent)  # the consumer's batch
  assert held.shape == (4, 3, 2) and held[3].tolist() == [[3, 3]] * 3
  second = shm_array.open_from_shm(arrays.stack([np.zeros((3, 2), np.uint8)] * 4))
  assert held[3].tolist() == [[3, 3]] * 3, "a batch still held was written"
  kept = ours()
  assert len(kept) == 4  # two kept segments, each handed over under a name of its own
  del second
  grain_adapter.wait_for_unlinks()
  third = shm_array.open_from_shm(arrays.stack([np.ones((3, 2), np.uint8)] * 4))
  assert third.sum() == 24 and held[3].tolist() == [[3, 3]] * 3
  assert len(ours() - kept) == 1  # the freed segment's new name only
  del held, third
  grain_adapter.wait_for_unlinks()
  assert np.asarray(arrays.stack(["a", "b"])).dtype.kind == "U"  # not numbers: an array, as np.stack
  arrays.close()  # what a worker process's exit runs: its kept segments unlinked
  assert not ours()


# --- orbax and tensorstore -----------------------------------------------------------

def test_orbax_keeps_a_json_item_in_the_file_the_adapter_reads(tmp_path):
  import orbax.checkpoint as ocp
  manager = ocp.CheckpointManager(str(tmp_path), item_names=("config",),
                                  item_handlers={"config": ocp.JsonCheckpointHandler()})
  manager.save(3, args=ocp.args.Composite(config=ocp.args.JsonSave({"seed": 7})))
  manager.wait_until_finished()
  manager.close()
  assert orbax_adapter.read_json_item(str(tmp_path / "3"), "config") == {"seed": 7}


def test_save_errors_name_their_cause():
  cause = orbax_adapter.save_failure_cause
  assert cause(OSError(errno.ENOSPC, "x")) == "no space left on device"
  assert cause(ValueError("RESOURCE_EXHAUSTED: Failed writing")) == "no space left on device"
  assert cause(OSError(errno.EACCES, "x")) == "permission denied"
  wrapped = RuntimeError("save failed")
  wrapped.__cause__ = OSError(errno.EROFS, "x")
  assert cause(wrapped) == "read-only file system"
  assert "already exists" in cause(ValueError("Destination /w/checkpoints/8 already exists"))
  assert orbax_adapter.first_line(ValueError("bad\nmore")) == "bad"


def test_a_full_disk_reads_as_one_under_tensorstore(tmp_path):
  """tensorstore reports ENOSPC as text (RESOURCE_EXHAUSTED), without an errno: the words
  save_failure_cause looks for, on a real full disk (a small tmpfs), with the partial
  directory orbax leaves named by PARTIAL_SAVE_GLOB."""
  import shutil
  import orbax.checkpoint as ocp
  if shutil.which("mount") is None or os.geteuid() != 0:
    pytest.skip("mounting a small tmpfs needs root and mount(8)")
  mount = tmp_path / "small"
  mount.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                    capture_output=True).returncode != 0:
    pytest.skip("cannot mount a tmpfs here")
  try:
    manager = ocp.CheckpointManager(str(mount / "c"), item_names=("state",),
                                    options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False))
    noise = np.random.default_rng(0).random((1 << 20,), np.float32)  # 4 MiB that do not compress
    with pytest.raises(Exception) as failure:
      manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave({"w": noise})))
      manager.wait_until_finished()
    assert orbax_adapter.save_failure_cause(failure.value) == "no space left on device", failure.value
    assert orbax_adapter.partial_saves(str(mount / "c"), 1), os.listdir(mount / "c")
    manager.close()
  finally:
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_reported_failures_leave_no_orbax_tracebacks_behind():
  """What the shell's filters drop: the leftovers of a failure jaxnet has already reported in
  one line (the other arrays' reads of a damaged checkpoint, writes after a failed save).
  Whether they appear at all depends on when Python collects them, so the CLI tests cannot
  always see them; the predicates are checked here directly."""
  read_error = Exception(f"{orbax_adapter.READ_ERROR}: (slice(0, 16, 1),). "
                         "See full TensorStore details: ...")
  assert orbax_adapter.is_reported_exception(type(read_error), read_error)
  assert orbax_adapter.is_reported_exception(RuntimeError, RuntimeError("Event loop is closed"))
  assert not orbax_adapter.is_reported_exception(ValueError, ValueError("a bug of ours"))
  record = lambda name, message: logging.LogRecord(name, logging.ERROR, __file__, 1, message, (), None)
  assert orbax_adapter.is_reported_noise(record(
      "asyncio", f"_GatheringFuture exception was never retrieved\n"
                 f"future: <... exception=Exception({str(read_error)!r})>"))
  assert not orbax_adapter.is_reported_noise(record("asyncio", "Task exception was never retrieved: KeyError('x')"))


def test_the_state_handler_writes_small_replicated_arrays_without_compiling_and_restores_them(tmp_path, caplog):
  """orbax's StandardCheckpointHandler with our array handler put under it (its private `_impl`):
  a replicated train state is saved without one compiled slice per replica (hundreds of compiles
  at a process's first save), and restores to the same arrays, through the handler and through
  orbax's own."""
  import jax
  import orbax.checkpoint as ocp
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state = {f"w{i}": jax.device_put(np.full((3, 3, 4 + i, 8), i, np.float32), replicated) for i in range(6)}
  state["step"] = 7
  handler = orbax_adapter.state_handler()
  assert isinstance(handler._impl, ocp.PyTreeCheckpointHandler)
  manager = ocp.CheckpointManager(str(tmp_path / "c"), item_handlers={"state": handler},
                                  options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False))
  with jax.log_compiles(True), caplog.at_level(logging.DEBUG):
    manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
  compiles = [r.getMessage() for r in caplog.records if "ompil" in r.getMessage()]
  assert not compiles, compiles[:3]
  target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=replicated) if k != "step" else v
            for k, v in state.items()}
  for handlers in ({"state": orbax_adapter.state_handler()}, {"state": ocp.StandardCheckpointHandler()}):
    restored = ocp.CheckpointManager(str(tmp_path / "c"), item_handlers=handlers).restore(
        1, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))["state"]
    assert restored["step"] == 7
    for k in state:
      if k != "step":
        np.testing.assert_array_equal(np.asarray(restored[k]), np.asarray(state[k]))
  # Orbax's own default slices the same state, one compiled op per slice (what the handler avoids).
  caplog.clear()
  default = ocp.CheckpointManager(str(tmp_path / "d"), item_handlers={"state": ocp.StandardCheckpointHandler()},
                                  options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False))
  with jax.log_compiles(True), caplog.at_level(logging.DEBUG):
    default.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
  assert any("ompil" in r.getMessage() for r in caplog.records)
