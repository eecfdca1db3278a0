"""Data parallelism: 8 devices train like 1, multi-process trains like one process.

Runs on the 8 forced host CPU devices that tests/conftest.py sets up
(XLA_FLAGS=--xla_force_host_platform_device_count=8, JAX_PLATFORMS=cpu).
Compiling is the expensive part on CPU, so the initial state is built once
(on one device) and every mesh starts from a copy of it, and each train step
is compiled once per mesh and reused.
"""

import json
import os
import pickle
import re
import socket
import subprocess
import sys
import time
import types

import jax
import numpy as np

from jaxnet.core import models
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # `configs` is a directory of the repo, not an installed package
  sys.path.insert(0, REPO)

from jaxnet.configs import digits  # noqa: E402
from jaxnet.core import checkpoint as ckpt  # noqa: E402
from jaxnet.core import experiment
from jaxnet.core import sharding as parallel
from jaxnet.cli import heartbeat as peers
from jaxnet.cli import process as runtime  # noqa: E402
from jaxnet.core import config as config_io  # noqa: E402
from jaxnet.core.data import pipeline  # noqa: E402
from jaxnet.core.train import RunControl  # noqa: E402

STEPS = 4
GLOBAL_BATCH = 16
# The bar for "same result on 1 and 8 devices": max relative difference.
REL_TOL = 1e-5

# Shared by the in-process runs and the multi-process CLI runs, so both train
# the same problem. A constant, non-warmed-up learning rate makes every step
# move the parameters noticeably (the digits recipe warms up from lr=0, which
# over 4 steps would leave the comparison dominated by the identical init).
OVERRIDES = {
    "batch_size": GLOBAL_BATCH,
    "total_steps": STEPS,
    "optim.schedule": "constant",
    "optim.warmup_epochs": 0.0,
    "optim.learning_rate": 0.05,
    "optim.base_batch_size": GLOBAL_BATCH,
    "data.workers": 0,
}


def make_config(num_devices: int, **extra):
  c = digits.get_config()
  extra = dict(extra)
  if "model.name" in extra:
    c = config_io.switch_model(c, extra.pop("model.name"))
  for key, value in {**OVERRIDES, **extra}.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  c.mesh.num_devices = num_devices
  return c


def rel_diff(a, b) -> float:
  """max over leaves of max|a-b| / max|b|: relative to each array's scale.

  (Element-wise relative error is meaningless for entries that are ~0.)
  """
  worst = 0.0
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    assert x.shape == y.shape
    worst = max(worst, float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30)))
  return worst


def run_steps(exp, init_host, batches, step=None):
  """Trains `exp` from a copy of `init_host` on the given host batches, with `step` (its
  train step compiled by an earlier call) or a step compiled now.

  Returns (compiled step, [host TrainState after each step], [losses]).
  """
  state = jax.device_put(init_host, exp.state_sharding)
  globals_ = [parallel.to_global(b, exp.batch_sharding) for b in batches]
  step = step or exp.train_step.lower(state, globals_[0]).compile()
  states, losses = [], []
  for batch in globals_:
    state, metrics = step(state, batch)
    states.append(jax.device_get(state))
    losses.append(float(metrics["train/loss"]))
  return step, states, losses


def chaos(exp, step, init, batches, states, losses):
  """Per step: how far moving the initial weights by one float32 ulp (up, and down) moves
  the trajectory `states`/`losses` -- (params+stats rel diffs, loss rel diffs), the larger
  of the two directions. Training is chaotic at ReLU kinks: two runs that differ only in
  summation order (devices, processes) may drift apart this far, and no farther.
  `step` is exp's compiled step (compiling it again would cost a compile, not change it).
  """
  worst, worst_loss = [0.0] * len(states), [0.0] * len(states)
  for direction in (np.inf, -np.inf):
    nudged = init.replace(params=jax.tree.map(lambda x: np.nextafter(x, np.float32(direction)),
                                              init.params))
    _, nudged_states, nudged_losses = run_steps(exp, nudged, batches, step)
    for i, (a, b, la, lb) in enumerate(zip(nudged_states, states, nudged_losses, losses)):
      worst[i] = max(worst[i], rel_diff(params_and_stats(a), params_and_stats(b)))
      worst_loss[i] = max(worst_loss[i], abs(la - lb) / abs(lb))
  return worst, worst_loss


def params_and_stats(state):
  return state.params, state.batch_stats


@pytest.fixture(scope="module")
def one_device():
  """The 1-device run; its initial state and batches seed every other run."""
  assert jax.device_count() >= 8, "tests/conftest.py must force 8 host devices"
  exp = experiment.Experiment(make_config(1))
  init_host = jax.device_get(exp.init_state())
  loader = iter(exp.train_loader())
  batches = [next(loader) for _ in range(STEPS)]
  step, states, losses = run_steps(exp, init_host, batches)
  return dict(exp=exp, init=init_host, batches=batches, step=step, states=states, losses=losses)


@pytest.fixture(scope="module")
def eight_devices(one_device):
  exp = experiment.Experiment(make_config(8))
  assert exp.mesh.shape == {"data": 8, "fsdp": 1}
  step, states, losses = run_steps(exp, one_device["init"], one_device["batches"])
  return dict(exp=exp, step=step, states=states, losses=losses)


def test_eight_devices_train_like_one(one_device, eight_devices):
  """K steps on 8 devices end where K steps on 1 device end (same init, same batches).

  The two differ only in float32 summation order (one reduction over the batch
  vs 8 partial sums and an all-reduce), ~1e-6 relative per step. But training
  is chaotic at ReLU kinks: when a ReLU input lands within that rounding of 0,
  the runs take different sides of the kink and diverge for real (1e-6 -> 1e-2
  in a step) -- float arithmetic, not a parallelism bug, and whether it happens
  depends on library versions. So the bar at each step is the larger of 1e-5 and
  twice the divergence of 1-device runs whose initial weights were moved by one
  float32 ulp up or down (`chaos`): a missing or wrong all-reduce would differ by far
  more at the first step already. The per-step test below holds without this allowance.
  """
  init = one_device["init"]
  allowance, _ = chaos(one_device["exp"], one_device["step"], init, one_device["batches"], one_device["states"],
                       one_device["losses"])
  # Not vacuous: the steps moved the weights far beyond float32 rounding.
  kernels = lambda params: [p for p in jax.tree.leaves(params) if p.ndim > 1]
  moved = rel_diff(kernels(one_device["states"][-1].params), kernels(init.params))
  assert moved > 1e-3, moved

  for i, (one, eight) in enumerate(zip(one_device["states"], eight_devices["states"])):
    bar = max(REL_TOL, 2 * allowance[i])
    diff = rel_diff(params_and_stats(eight), params_and_stats(one))
    print(f"step {i + 1}: 1 vs 8 devices params+stats {diff:.2e}; 1 ulp of init moves them "
          f"{allowance[i]:.2e}")
    if i == 0:
      assert allowance[i] < REL_TOL  # one step cannot amplify an ulp past rounding
    assert diff <= bar


def test_each_step_on_eight_devices_matches_one_device(one_device, eight_devices):
  """From the same state, one 8-device step = one 1-device step, at every step.

  Errors do not compound here, so this pins the step itself: gradient averaging,
  BN statistics over the global batch, optimizer update. One caveat remains: a
  state with a ReLU input or a max-pool tie within rounding of its kink gives a
  gradient that jumps under any 1e-7 change. So the bar at each step is the larger
  of 1e-5 and twice what moving that state's weights by one ulp (up or down) does
  to the 1-device step; the first steps, far from any kink, hold to 1e-5.
  """
  exp8, step8 = eight_devices["exp"], eight_devices["step"]
  step1, exp1 = one_device["step"], one_device["exp"]
  before = [one_device["init"]] + one_device["states"][:-1]
  diff_of = lambda a, b: max(rel_diff(params_and_stats(a), params_and_stats(b)),
                             rel_diff(a.opt_state, b.opt_state))
  for i, (state, batch, after_1) in enumerate(zip(before, one_device["batches"], one_device["states"])):
    after_8, _ = step8(jax.device_put(state, exp8.state_sharding),
                       parallel.to_global(batch, exp8.batch_sharding))
    diff = diff_of(jax.device_get(after_8), after_1)
    allowance = 0.0
    for direction in (np.inf, -np.inf):
      nudged = state.replace(params=jax.tree.map(lambda x: np.nextafter(x, np.float32(direction)),
                                                 state.params))
      after_nudged, _ = step1(jax.device_put(nudged, exp1.state_sharding),
                              parallel.to_global(batch, exp1.batch_sharding))
      allowance = max(allowance, diff_of(jax.device_get(after_nudged), after_1))
    print(f"\nstep {i + 1}: 8 vs 1 devices {diff:.2e}; 1 ulp of the state moves it {allowance:.2e}")
    if i == 0:
      assert allowance < REL_TOL  # the initial state is far from any kink
    assert diff <= max(REL_TOL, 2 * allowance)


def _all_reduced_shapes(hlo: str) -> list[tuple[int, ...]]:
  shapes = []
  for line in hlo.splitlines():
    m = re.search(r"=\s*(.*?)\s+all-reduce(?:-start)?\(", line)
    if m:
      # Dims sorted: XLA may reduce a gradient transposed (the head's as [10,64]).
      shapes += [tuple(sorted(int(d) for d in dims.split(",") if d))
                 for dims in re.findall(r"[a-z]+\d*\[([\d,]*)\]", m.group(1))]
  return shapes


# Anything that would stop the device and talk to the host mid-step.
_HOST_ROUND_TRIP = re.compile(r"\b(infeed|outfeed|send|recv|send-done|recv-done)\(")
_PY_CALLBACK = re.compile(r'custom_call_target="[^"]*(callback|python|host)[^"]*"', re.I)


def _host_round_trips(hlo: str) -> list[str]:
  return [line.strip()[:160] for line in hlo.splitlines()
          if _HOST_ROUND_TRIP.search(line) or _PY_CALLBACK.search(line)]


def test_compiled_step_all_reduces_gradients_and_stays_on_device(one_device, eight_devices):
  hlo8 = eight_devices["step"].as_text()
  reduced = _all_reduced_shapes(hlo8)
  assert reduced, "no all-reduce in the 8-device train step"
  # Every conv/dense kernel gradient is all-reduced (kernels are ~all the weights).
  kernels = [tuple(sorted(p.shape)) for p in jax.tree.leaves(one_device["init"].params) if p.ndim > 1]
  for shape in set(kernels):
    assert reduced.count(shape) >= kernels.count(shape), (shape, sorted(set(reduced)))
  num_params = sum(p.size for p in jax.tree.leaves(one_device["init"].params))
  assert sum(int(np.prod(s)) for s in reduced) >= num_params

  assert _host_round_trips(hlo8) == []
  # The 1-device step needs no collective at all: the check above is about sharding.
  assert _all_reduced_shapes(one_device["step"].as_text()) == []


def test_host_round_trip_detector_flags_callbacks():
  # The "no host round-trip" assertion above is only meaningful if it can fire.
  f = jax.jit(lambda x: jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct((3,), np.float32), x))
  assert _host_round_trips(f.lower(np.ones(3, np.float32)).compile().as_text())


def test_indivisible_batch_is_an_error_naming_both_numbers():
  with pytest.raises(ValueError, match=r"batch_size=12 does not divide evenly over 8 devices"):
    experiment.Experiment(make_config(8, batch_size=12))
  with pytest.raises(ValueError, match=r"eval_batch_size=20 does not divide evenly over 8 devices"):
    experiment.Experiment(make_config(8, **{"data.eval_batch_size": 20}))


def test_bn_group_size_validation():
  mesh8 = parallel.make_mesh(8)
  assert parallel.bn_num_groups(0, mesh8) == 1
  assert parallel.bn_num_groups(8, mesh8) == 1
  assert parallel.bn_num_groups(2, mesh8) == 4
  for bad in (3, 16):
    with pytest.raises(ValueError, match=rf"bn_group_size={bad} does not divide the 8 devices"):
      parallel.bn_num_groups(bad, mesh8)
  with pytest.raises(ValueError, match=r"bn_group_size=3"):
    experiment.Experiment(make_config(8, **{"bn_group_size": 3}))


def test_bn_groups_of_four_devices(one_device, eight_devices):
  exp = experiment.Experiment(make_config(8, **{"bn_group_size": 4}))
  assert exp.model.bn_num_groups == 2
  step, states, losses = run_steps(exp, one_device["init"], one_device["batches"][:2])
  assert np.all(np.isfinite(losses))

  # The first BN layer sees the same input in both runs at step 1 (the stem
  # conv of the initial weights on batch 0), so the batch statistics it used
  # are known exactly. With 2 groups the variance is the mean of the variances
  # within examples 0-7 (devices 0-3) and 8-15 (devices 4-7); with 1 group it
  # is the variance of all 16. They are read back from the running statistics:
  # running = momentum * initial (mean 0, var 1) + (1 - momentum) * batch.
  c = exp.config
  x = (one_device["batches"][0]["image"].astype(np.float64) / 255 - c.data.mean[0]) / c.data.std[0]
  kernel = np.asarray(one_device["init"].params["stem_conv"]["kernel"], np.float64)  # 3x3 SAME
  xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  h, w = x.shape[1:3]
  conv = sum(np.einsum("nhwi,io->nhwo", xp[:, i:i + h, j:j + w], kernel[i, j])
             for i in range(3) for j in range(3))
  m = models.options(c.model.name)["bn_momentum"]  # the model's default: the test sets none

  def expected(groups):
    g = conv.reshape(groups, -1, conv.shape[-1])
    return g.mean(1).mean(0), g.var(1).mean(0)

  for groups, state in ((2, states[0]), (1, eight_devices["states"][0])):
    mean, var = expected(groups)
    ra = state.batch_stats["stem_bn"]
    batch_mean, batch_var = ra["mean"] / (1 - m), (ra["var"] - m) / (1 - m)
    # 1e-4: reading the batch statistic back from a float32 running average
    # costs a digit (it is ~1/10 of the average).
    np.testing.assert_allclose(batch_mean, mean, rtol=1e-4, atol=1e-6, err_msg=f"{groups} groups")
    np.testing.assert_allclose(batch_var, var, rtol=1e-4, err_msg=f"{groups} groups")
  # ...and the two expectations differ by well over that tolerance (> 10x).
  assert np.max(np.abs(expected(2)[1] / expected(1)[1] - 1)) > 1e-3
  assert losses[0] != pytest.approx(eight_devices["losses"][0], rel=1e-4)

  # Statistics reductions run within groups of 4 consecutive devices, which
  # the global-BN step does not have. (XLA prints such groups as a [2,4] view
  # of the devices reduced over its minor axis, jax 0.12's XLA as the minor
  # size-4 sub-axis "(2)4" of the data axis; older versions list them.)
  groups_of_4 = re.compile(r"replica_groups=(mesh\['axis_0'=2,'axis_1'=4[^\]]*\]\s*\{'axis_1'\}"
                           r"|mesh\['data'=8[^\]]*\]\s*\{'data':\(2\)4\}"
                           r"|\{\{0,1,2,3\},\{4,5,6,7\}\}|\[2,4\]<=\[8\])")
  assert groups_of_4.search(step.as_text())
  assert not groups_of_4.search(eight_devices["step"].as_text())


# --- multi-process -------------------------------------------------------------


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start_two_processes(workdir, name: str, *flags, env=None):
  """Two `jaxnet.main` processes (via tests/_multihost_worker.py) x 2 CPU devices on WORKDIR."""
  port = _free_port()
  flags = [f"--config.{k}={v}" for k, v in OVERRIDES.items()] + [
      "--config.log_every_steps=1", "--config.eval_every_steps=0",
      "--config.checkpoint_every_steps=0", "--config.data.eval_batch_size=360",
      "--config.distributed.enabled=true", f"--config.distributed.coordinator_address=127.0.0.1:{port}",
      "--config.distributed.num_processes=2", *flags]
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
         "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO, **(env or {})}
  logs = [workdir.parent / f"{name}_process{i}.log" for i in range(2)]
  procs = []
  for i, log in enumerate(logs):
    with open(log, "w") as f:  # a file, not a pipe: nothing blocks while no one reads
      procs.append(subprocess.Popen(
          [sys.executable, os.path.join(REPO, "tests", "_multihost_worker.py"),
           "--config=configs/digits.py", f"--workdir={workdir}", *flags,
           f"--config.distributed.process_id={i}"],
          cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT))
  return dict(procs=procs, workdir=workdir, logs=logs)


def _wait(run, timeout=400) -> list[str]:
  """Waits for both processes; returns their output. Stops both if either fails or hangs."""
  try:
    for p in run["procs"]:
      p.wait(timeout=timeout)
  finally:
    for p in run["procs"]:
      if p.poll() is None:
        p.kill()
        p.wait()
  outputs = [log.read_text() for log in run["logs"]]
  for i, (p, out) in enumerate(zip(run["procs"], outputs)):
    assert p.returncode == 0, f"process {i} exited {p.returncode}:\n{out[-4000:]}"
  return outputs


@pytest.fixture(scope="module", autouse=True)
def _start_multihost_run_first(request):
  """Starts the two worker processes as soon as this module's tests start, if a selected
  test needs them: compiling dominates the multi-process tests, and started first, the
  workers compile while the in-process tests of this module run."""
  if any(item.module is request.module and "multihost_run" in item.fixturenames
         for item in request.session.items):
    request.getfixturevalue("multihost_run")


@pytest.fixture(scope="module")
def multihost_run(tmp_path_factory):
  """The two processes' first run (STEPS steps); stopped at the end if no test waited for it."""
  run = _start_two_processes(tmp_path_factory.mktemp("multihost") / "run", "first")
  yield run
  for p in run["procs"]:
    if p.poll() is None:
      p.kill()
      p.wait()


@pytest.fixture(scope="module")
def two_process_reference(shared_runs, request):
  """One process x 4 devices fed, at each step, the batches the two processes read.

  Each process of a multi-host run reads its own shard of the dataset (grain
  ShardOptions: process i of n) and contributes its half of every global
  batch; a single process reads the unsharded stream, i.e. different examples
  in each batch. So step k's global batch here is process 0's k-th shard batch
  followed by process 1's (the device order of the global array). Same seed,
  same initial state, same examples: the runs must agree to float rounding.

  Made once per session (tests/test_launch.py compares its launched runs with it too): each
  state's params and BN statistics, the losses and the ulp allowances, on disk.
  """
  made = shared_runs.made("two-process-reference",
                          lambda out: _make_two_process_reference(out, request.getfixturevalue("one_device")))
  with open(made / "reference.pkl", "rb") as f:
    reference = pickle.load(f)
  return dict(reference, exp=experiment.Experiment(make_config(4)))


def _make_two_process_reference(out, one_device):
  exp = experiment.Experiment(make_config(4))
  shard_iters = [iter(pipeline.train_loader(
      exp.train_source, global_batch_size=GLOBAL_BATCH, image_size=exp.config.image_size,
      seed=exp.config.seed, workers=0, process_index=i, process_count=2)) for i in range(2)]
  batches = []
  for _ in range(PREEMPTED_AT):
    halves = [next(it) for it in shard_iters]
    batches.append({k: np.concatenate([h[k] for h in halves]) for k in halves[0]})
  # (Why the emulation is needed: the unsharded stream starts with other examples.)
  assert not np.array_equal(batches[0]["image"], one_device["batches"][0]["image"])
  step, states, losses = run_steps(exp, one_device["init"], batches)
  allowance, loss_allowance = chaos(exp, step, one_device["init"], batches, states, losses)
  out.mkdir(parents=True)
  with open(out / "reference.pkl", "wb") as f:
    pickle.dump(dict(states=[types.SimpleNamespace(params=s.params, batch_stats=s.batch_stats) for s in states],
                     losses=losses, chaos=allowance, loss_chaos=loss_allowance), f)


def _replicas(workdir, step):
  """Each process's own copy of the state at `step` (tests/_multihost_worker.py); both must be equal."""
  replicas = [dict(np.load(workdir / f"replica_{step}_process{i}.npz")) for i in range(2)]
  assert replicas[0].keys() == replicas[1].keys()
  for key in replicas[0]:
    # Bit for bit: the all-reduce gives every device the same sum.
    np.testing.assert_array_equal(replicas[0][key], replicas[1][key], err_msg=key)
  return replicas[0]


def _rel_diff_to_reference(replica, state) -> float:
  """rel_diff of a replica's params and BN statistics against a reference TrainState."""
  multi = {k: v for k, v in replica.items() if k.startswith((".params", ".batch_stats"))}
  ref = {jax.tree_util.keystr(path): leaf for path, leaf in
         jax.tree_util.tree_flatten_with_path(params_and_stats(state))[0]}
  ref = {k.replace("[0]", ".params", 1).replace("[1]", ".batch_stats", 1): v for k, v in ref.items()}
  assert sorted(multi) == sorted(ref)
  return rel_diff([multi[k] for k in sorted(ref)], [ref[k] for k in sorted(ref)])


def _check_against_reference(workdir, ref, step: int) -> list[dict]:
  """Both processes' state at `step` is the reference's, and metrics.jsonl logged steps
  1..step once each with the reference's losses (the same examples). Returns its records."""
  diff = _rel_diff_to_reference(_replicas(workdir, step), ref["states"][step - 1])
  print(f"\n2 processes x 2 devices vs 1 process x 4 devices at step {step}: rel diff {diff:.2e} "
        f"(1 ulp of init moves the reference {ref['chaos'][step - 1]:.2e})")
  assert diff <= max(REL_TOL, 2 * ref["chaos"][step - 1])
  lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines() if l]
  train_lines = [l for l in lines if "train/loss" in l]
  assert [l["step"] for l in train_lines] == list(range(1, step + 1))
  for line, loss, chaos in zip(train_lines, ref["losses"], ref["loss_chaos"]):
    assert line["train/loss"] == pytest.approx(loss, rel=max(REL_TOL, 2 * chaos)), line["step"]
  return lines


def test_two_processes_train_like_one(multihost_run, two_process_reference):
  """Two processes x 2 CPU devices (gloo collectives) vs one process x 4 devices on the same examples.

  The workers run the real CLI (`jaxnet.main`, via tests/_multihost_worker.py,
  which also records each process's own copy of the final state).
  """
  workdir, ref = multihost_run["workdir"], two_process_reference
  outputs = _wait(multihost_run)
  assert "training resnet_tiny" in outputs[0] and "final: step" in outputs[0]
  assert "final: step" not in outputs[1]  # only process 0 reports

  # Both processes hold the reference's state; only process 0 wrote metrics.
  lines = _check_against_reference(workdir, ref, STEPS)
  eval_lines = [l for l in lines if "eval/top1" in l]
  assert len(eval_lines) == 1
  assert eval_lines[0]["eval/examples"] == len(ref["exp"].eval_source)  # both shards, every example once
  assert len(list((workdir / "tensorboard").glob("events*"))) == 1
  assert json.loads((workdir / "environment.json").read_text())["process_count"] == 2
  # Only process 0 computed the data's identity, of both splits (tests/_multihost_worker.py).
  assert (workdir / "identity_calls_process0").read_text().count("\n") == 2
  assert not (workdir / "identity_calls_process1").exists()

  # The checkpoint the two processes wrote together restores in this single process.
  checkpoints = ckpt.Checkpoints(str(workdir), read_only=True)
  restored, step = checkpoints.restore_newest(ref["exp"].abstract_state)
  checkpoints.close()
  assert step == STEPS and int(restored.step) == STEPS
  ref_params, ref_stats = params_and_stats(ref["states"][STEPS - 1])
  assert rel_diff(jax.device_get(restored.params), ref_params) <= REL_TOL
  assert rel_diff(jax.device_get(restored.batch_stats), ref_stats) <= REL_TOL


@pytest.mark.slow
def test_two_processes_train_with_fsdp_like_one(tmp_path, two_process_reference):
  """FSDP over the 2 processes x 2 devices (each process holds and writes its own shards)
  trains like one process x 4 devices without FSDP on the same examples (`-m slow`: ~1 min)."""
  run = _start_two_processes(tmp_path / "run", "fsdp", "--config.mesh.fsdp=True",
                             "--config.mesh.fsdp_min_size=256")
  outputs = _wait(run)
  assert "FSDP over 4 devices" in outputs[0] and "final: step" in outputs[0]
  ref = two_process_reference
  checkpoints = ckpt.Checkpoints(str(run["workdir"]), read_only=True)
  restored, step = checkpoints.restore_newest(ref["exp"].abstract_state)
  checkpoints.close()
  assert step == STEPS
  diff = rel_diff(params_and_stats(jax.device_get(restored)), params_and_stats(ref["states"][STEPS - 1]))
  print(f"\nFSDP on 2 processes x 2 devices vs 1 process x 4 devices at step {STEPS}: {diff:.2e}")
  assert diff <= max(REL_TOL, 2 * ref["chaos"][STEPS - 1])


# The run above, resumed with total_steps=RESUMED_STEPS: process 1 alone gets SIGTERM
# after step PREEMPTED_AT, and both processes must stop there.
RESUMED_STEPS, PREEMPTED_AT = 10, 7


@pytest.fixture(scope="module")
def multihost_preempted(multihost_run):
  _wait(multihost_run)
  run = _start_two_processes(multihost_run["workdir"], "preempted", f"--config.total_steps={RESUMED_STEPS}",
                             env={"JAXNET_TEST_SIGTERM": f"1:{PREEMPTED_AT}"})
  return dict(workdir=run["workdir"], outputs=_wait(run, timeout=180))


def test_sigterm_to_one_process_stops_both_at_the_same_step(multihost_preempted):
  workdir, outputs = multihost_preempted["workdir"], multihost_preempted["outputs"]
  assert "SIGTERM received" in outputs[1] and "SIGTERM received" not in outputs[0]
  for out in outputs:  # process 0 stops too, at the same step: the collective save needs both
    assert f"preempted: checkpoint saved at step {PREEMPTED_AT};" in out, out[-3000:]
    assert "final: step" not in out
  assert (workdir / "checkpoints" / str(PREEMPTED_AT)).is_dir()
  assert not (workdir / "checkpoints" / str(RESUMED_STEPS)).exists()


def test_resumed_two_process_run_continues_exactly(multihost_preempted, two_process_reference):
  """Resumed from step STEPS, the run goes on as an uninterrupted one would: every process's
  data iterator continues from its own saved position, the state from the checkpoint."""
  workdir, ref = multihost_preempted["workdir"], two_process_reference
  for out in multihost_preempted["outputs"]:
    assert f"resumed from checkpoint at step {STEPS}" in out
  _check_against_reference(workdir, ref, PREEMPTED_AT)


@pytest.mark.slow  # ~95 s on 2 cores: two runs of two processes; the fast check is the one below
def test_a_dead_process_is_named_in_one_line_and_the_rerun_resumes(tmp_path):
  """kill -9 of process 1: process 0 ends with one jaxnet line (which process, the step, the
  newest intact checkpoint), not jax's C++ abort, and a rerun of both resumes from there."""
  workdir = tmp_path / "run"
  timeout = "--config.distributed.heartbeat_timeout_sec=8"
  run = _start_two_processes(workdir, "lost", "--config.total_steps=100000",
                             "--config.checkpoint_every_steps=3", timeout)
  survivor, victim = run["procs"]
  try:
    deadline = time.time() + 400
    while not (workdir / "checkpoints" / "3").is_dir():
      assert survivor.poll() is None and victim.poll() is None, run["logs"][0].read_text()[-3000:]
      assert time.time() < deadline, "no checkpoint after 400 s"
      time.sleep(0.2)
    victim.kill()  # SIGKILL: no handler runs
    killed_at = time.time()
    survivor.wait(timeout=120)
    noticed_after = time.time() - killed_at
  finally:
    for p in run["procs"]:
      if p.poll() is None:
        p.kill()
        p.wait()
  out = run["logs"][0].read_text()
  assert survivor.returncode == 1, out[-3000:]
  for noise in ("Traceback", "Check failure", "Fatal Python error", "Terminating process"):
    assert noise not in out, out[-3000:]
  last = out.strip().splitlines()[-1]
  match = re.fullmatch(r"error: process 1 of 2 stopped answering \(no heartbeat for 8 s\) at step (\d+)"
                       r"(?: \(its last heartbeat was at step \d+\))?\. "
                       r"The newest intact checkpoint is step (\d+)\. Rerun all processes to resume\.", last)
  assert match, out[-3000:]
  step, intact = int(match[1]), int(match[2])
  assert 3 <= intact <= step and intact % 3 == 0
  # The step named is the last one the survivor printed, not an earlier one.
  printed = [int(m) for m in re.findall(r"^step\s+(\d+)/", out, re.M)]
  assert not printed or step >= printed[-1], (step, printed)
  assert (workdir / "checkpoints" / str(intact)).is_dir()
  print(f"\nprocess 1 killed; process 0 named it {noticed_after:.1f} s later")
  assert noticed_after < 8 + 30  # the configured timeout, not jax's (16 s) abort or a hang

  resumed = _start_two_processes(workdir, "rerun", f"--config.total_steps={intact + 1}", timeout)
  outputs = _wait(resumed)
  for out in outputs:
    assert f"resumed from checkpoint at step {intact}" in out, out[-3000:]
  assert f"final: step {intact + 1}" in outputs[0]
  assert (workdir / "checkpoints" / str(intact + 1)).is_dir()


class _KeyValueStore:
  """Stands in for jax's distributed client: the calls peers.PeerWatch makes."""

  def __init__(self):
    self.values, self.down = {}, False

  def key_value_set(self, key, value, allow_overwrite=False):
    if self.down:
      raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")
    self.values[key] = value

  def key_value_dir_get(self, prefix):
    if self.down:
      raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")
    return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]


def test_peer_watch_names_the_process_that_stopped_answering():
  """Process 0 of 3 watching: process 2 leaves on purpose (done), process 1 beats, then stops.
  Only process 1 is reported, once its heartbeat has not moved for the timeout."""
  store, reports = _KeyValueStore(), []
  run = RunControl(step=8, checkpoint_sentence=lambda: "The newest intact checkpoint is step 6.")
  watch = peers.PeerWatch(1.0, run, exit_on_loss=lambda message: reports.append((message, time.monotonic())))
  watch.start(store, 0, 3)
  prefix = watch._prefix
  store.key_value_set(prefix + "2", peers.DONE)
  started = time.monotonic()
  for beat in range(15):  # 1.5 s of beats: longer than the timeout, yet nobody is missing
    store.key_value_set(prefix + "1", f"{beat}:7")
    time.sleep(0.1)
  assert reports == []
  stopped = time.monotonic()
  while not reports and time.monotonic() - stopped < 5:
    time.sleep(0.05)
  watch.__exit__(None, None, None)
  message, noticed = reports[0]
  # The last beat was read at most one interval (0.2 s) before `stopped`.
  assert 0.8 <= noticed - stopped < 3.0 and noticed - started > 2.3
  # The step this process reached, as it printed it, and where the lost one last was.
  assert message == ("process 1 of 3 stopped answering (no heartbeat for 1 s) at step 8 (its last "
                     "heartbeat was at step 7). The newest intact checkpoint is step 6. Rerun all "
                     "processes to resume.")
  assert store.values[prefix + "0"] == peers.DONE  # its peers will not miss it

  # A failed collective (jax's runtime error) waits for the watcher's verdict (gloo fails
  # before any heartbeat is missed); any other error is raised at once.
  waited = time.monotonic()
  watch.wait_for_verdict(TypeError("unsupported operand type(s)"))
  assert time.monotonic() - waited < 0.1
  watch.wait_for_verdict(jax.errors.JaxRuntimeError("UNKNOWN: Gloo AllReduce failed: Connection closed by peer"))
  assert time.monotonic() - waited >= 1.0

  # The coordination service (in process 0) gone: process 0 is the one that stopped answering.
  store, reports = _KeyValueStore(), []
  watch = peers.PeerWatch(1.0, RunControl(), exit_on_loss=reports.append)
  watch.start(store, 1, 2)
  store.key_value_set(watch._prefix + "0", "1:None")
  time.sleep(0.3)
  store.down = True
  deadline = time.monotonic() + 10
  while not reports and time.monotonic() < deadline:
    time.sleep(0.05)
  watch.__exit__(None, None, None)
  assert reports[0].startswith("process 0 of 2 stopped answering (no heartbeat for 1 s) before "
                               "training started. There is no intact checkpoint")


@pytest.mark.parametrize("num_records,processes,global_batch", [(359, 2, 16), (10, 3, 6), (2, 4, 4)])
def test_multi_process_eval_sees_every_example_once(num_records, processes, global_batch):
  from jaxnet.core.data import sources
  images = np.zeros((num_records, 2, 2, 1), np.uint8)
  source = sources.ArraySource(images, np.arange(num_records), num_classes=num_records)
  per_process = [list(pipeline.eval_batches(
      source, global_batch_size=global_batch, image_size=2, process_index=i,
      process_count=processes)) for i in range(processes)]
  # Every process yields the same number of equal-size batches (each global batch needs all)...
  assert len({len(batches) for batches in per_process}) == 1
  assert {len(b["label"]) for batches in per_process for b in batches} == {global_batch // processes}
  # ...and the unmasked examples are the dataset, each exactly once.
  seen = np.concatenate([b["label"][b["mask"]] for batches in per_process for b in batches])
  np.testing.assert_array_equal(np.sort(seen), np.arange(num_records))


# --- jax.distributed settings (no processes started) ------------------------------


@pytest.fixture
def recorded_initialize(monkeypatch):
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  for var in [v for v in os.environ if v.startswith(("SLURM_", "JAX_COORDINATOR"))] + [
      "CUDA_VISIBLE_DEVICES"]:
    monkeypatch.delenv(var, raising=False)
  return calls


def _dist(**kw):
  c = make_config(1).distributed
  for k, v in kw.items():
    c[k] = v
  return c


def test_initialize_distributed_modes(recorded_initialize, monkeypatch):
  runtime.initialize_distributed(_dist())  # auto, nothing set: single process
  runtime.initialize_distributed(_dist(enabled="false", coordinator_address="h:1"))
  assert recorded_initialize == []
  runtime.initialize_distributed(_dist(coordinator_address="h:1", num_processes=2, process_id=1))
  assert recorded_initialize[-1] == dict(coordinator_address="h:1", num_processes=2, process_id=1,
                                         heartbeat_timeout_seconds=200)
  # Slurm with several tasks, one per GPU: jax's own detection (no arguments).
  monkeypatch.setenv("SLURM_NTASKS", "16")
  for k, v in dict(SLURM_JOB_ID="7", SLURM_LOCALID="3", SLURM_STEP_NUM_TASKS="16",
                   SLURM_STEP_NUM_NODES="2", CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7").items():
    monkeypatch.setenv(k, v)
  runtime.initialize_distributed(_dist(heartbeat_timeout_sec=30))
  assert recorded_initialize[-1] == {"heartbeat_timeout_seconds": 60}
  assert jax.config.jax_cpu_collectives_implementation == "gloo"


def test_slurm_one_process_per_node_gets_every_gpu(recorded_initialize, monkeypatch):
  # jax's Slurm detection would give each process only GPU SLURM_LOCALID (=0).
  for k, v in dict(SLURM_JOB_ID="7", SLURM_LOCALID="0", SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2",
                   SLURM_STEP_NUM_NODES="2", CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7").items():
    monkeypatch.setenv(k, v)
  runtime.initialize_distributed(_dist())
  assert recorded_initialize[-1] == {"local_device_ids": list(range(8)), "heartbeat_timeout_seconds": 200}
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
  monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
  assert runtime.slurm_process_per_node_device_ids() == [0, 1, 2, 3]
  # An explicit setting wins.
  runtime.initialize_distributed(_dist(local_device_ids="1,2"))
  assert recorded_initialize[-1] == {"local_device_ids": [1, 2], "heartbeat_timeout_seconds": 200}


def test_gpu_xla_flag_defaults_are_overridable_and_never_on_cpu(monkeypatch):
  import importlib.util
  gpu_plugin = lambda name: object() if name.startswith("jax_cuda") else None
  monkeypatch.setattr(importlib.util, "find_spec", gpu_plugin)
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_all_reduce_combine_threshold_bytes=1024")
  runtime.apply_xla_flags()
  flags = os.environ["XLA_FLAGS"].split()
  assert "--xla_gpu_enable_latency_hiding_scheduler=true" in flags
  # The user's value wins over the default.
  assert [f for f in flags if "combine_threshold" in f] == ["--xla_gpu_all_reduce_combine_threshold_bytes=1024"]

  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  runtime.apply_xla_flags()
  assert "xla_gpu" not in os.environ["XLA_FLAGS"]
  monkeypatch.delenv("JAX_PLATFORMS")
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # no CUDA plugin
  runtime.apply_xla_flags()
  assert "xla_gpu" not in os.environ["XLA_FLAGS"]
