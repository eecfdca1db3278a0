"""FSDP (config.mesh.fsdp): the state split over the devices trains like one device, holds
an eighth of the memory on each of 8, and its checkpoints restore onto other meshes.

Runs on the 8 forced host CPU devices (tests/conftest.py). The GPU program's collectives
(reduce-scatter, not all-reduce) are checked in tests/test_gpu_plan.py, which compiles
for H100s: XLA's CPU pipeline leaves a gradient as an all-reduce followed by a slice.
"""

import contextlib
import io
import json
import os
import shutil

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxnet import api

from jaxnet.core import sharding as fsdp

from jaxnet.core import sharding as parallel
from jaxnet.core import checkpoint as ckpt
from jaxnet.core import checkpoint as checkpoint_cleanup
from jaxnet.core.errors import InvalidValueError
from jaxnet.core.experiment import Experiment
from tests.test_parallel import make_config, rel_diff, run_steps

# ViT: no ReLU kinks or max-pool ties, so float summation order moves a step by ~1e-7
# and the bar below needs no allowance for chaos (tests/test_parallel.py explains it).
# SGD with momentum: Adam's first steps turn the rounding of ~0 gradients into whole
# updates (g / |g|), which would measure Adam, not the sharding.
VIT = {"model.name": "vit_mini", "mesh.fsdp_min_size": 256}
FSDP = {"mesh.fsdp": True}
REL_TOL = 1e-5


def test_the_rule_splits_the_largest_divisible_axis_and_leaves_small_tensors_whole():
  assert fsdp.spec((64, 96), 8, min_size=256) == P(None, "fsdp")
  assert fsdp.spec((96, 64), 8, min_size=256) == P("fsdp", None)
  assert fsdp.spec((3, 3, 36, 64), 8, min_size=256) == P(None, None, None, "fsdp")  # 36 % 8 != 0
  assert fsdp.spec((64, 64), 8, min_size=256) == P(None, "fsdp")  # a tie: the last axis
  assert fsdp.spec((96,), 8, min_size=256) == P()          # a bias: under min_size
  assert fsdp.spec((), 8, min_size=0) == P()               # a scalar
  assert fsdp.spec((27, 81), 8, min_size=256) == P()       # no axis divides by 8
  assert fsdp.spec((64, 96), 1, min_size=256) == P()       # one device per group: nothing to split


def test_mesh_shapes_and_the_one_line_errors():
  devices = jax.devices()[:8]
  assert dict(parallel.make_mesh(8, devices).shape) == {"data": 8, "fsdp": 1}
  assert dict(parallel.make_mesh(8, devices, fsdp=True).shape) == {"data": 1, "fsdp": 8}
  assert dict(parallel.make_mesh(8, devices, fsdp=True, fsdp_devices=4).shape) == {"data": 2, "fsdp": 4}
  with pytest.raises(InvalidValueError, match=r"mesh.fsdp_devices=3 does not divide the 8 devices"):
    parallel.make_mesh(8, devices, fsdp=True, fsdp_devices=3)
  with pytest.raises(InvalidValueError, match=r"mesh.fsdp_devices=4 applies to FSDP: add --config.mesh.fsdp=True"):
    parallel.make_mesh(8, devices, fsdp_devices=4)


def _shard_fraction(array) -> float:
  """What part of `array` one device holds."""
  return array.addressable_shards[0].data.size / array.size


@pytest.fixture(scope="module")
def one_device_vit():
  exp = Experiment(make_config(1, **VIT))
  init = jax.device_get(exp.init_state())
  loader = iter(exp.train_loader())
  batches = [next(loader) for _ in range(3)]
  _, states, losses = run_steps(exp, init, batches)
  return dict(init=init, batches=batches, states=states, losses=losses)


@pytest.mark.parametrize("fsdp_devices", [0, 4])
def test_fsdp_on_eight_devices_trains_like_one_device(one_device_vit, fsdp_devices):
  """3 SGD steps, FSDP over all 8 devices and over 2 groups of 4 (a 2-D mesh), from the same
  init and batches as 1 device: per-step loss, params and momentum within 1e-5."""
  exp = Experiment(make_config(8, **VIT, **FSDP, **{"mesh.fsdp_devices": fsdp_devices}))
  group = fsdp_devices or 8
  assert exp.fsdp_summary.sharded > 0 and exp.fsdp_summary.indivisible == 0
  qkv = exp.abstract_state.params["block0"]["attn"]["qkv"]["kernel"]
  assert qkv.sharding.spec == P(None, "fsdp")

  state = jax.device_put(one_device_vit["init"], exp.state_sharding)
  assert _shard_fraction(state.params["block0"]["attn"]["qkv"]["kernel"]) == 1 / group
  momentum = [x for x in jax.tree.leaves(state.opt_state) if x.shape == (32, 96)]
  assert momentum and all(_shard_fraction(x) == 1 / group for x in momentum)
  step = exp.train_step.lower(state, parallel.to_global(one_device_vit["batches"][0],
                                                        exp.batch_sharding)).compile()
  for i, (batch, one_state, one_loss) in enumerate(zip(one_device_vit["batches"], one_device_vit["states"],
                                                       one_device_vit["losses"])):
    state, metrics = step(state, parallel.to_global(batch, exp.batch_sharding))
    # The updated state stays split: the step's outputs keep the FSDP layout.
    assert _shard_fraction(state.params["block0"]["fc1"]["kernel"]) == 1 / group
    host = jax.device_get(state)
    diff = max(rel_diff(host.params, one_state.params), rel_diff(host.opt_state, one_state.opt_state))
    print(f"step {i + 1}: FSDP ({group} per group) vs 1 device: params+momentum {diff:.2e}")
    assert diff <= REL_TOL
    assert float(metrics["train/loss"]) == pytest.approx(one_loss, rel=REL_TOL)
  assert rel_diff(one_device_vit["states"][-1].params, one_device_vit["init"].params) > 1e-3  # moved


def test_fsdp_keeps_batch_norm_statistics_over_the_global_batch():
  """ResNet (BN): one step under FSDP = one step on 1 device, params and BN statistics."""
  one = Experiment(make_config(1, **{"mesh.fsdp_min_size": 256}))
  init = jax.device_get(one.init_state())
  batch = next(iter(one.train_loader()))
  _, (after_one,), _ = run_steps(one, init, [batch])
  eight = Experiment(make_config(8, **FSDP, **{"mesh.fsdp_min_size": 256}))
  assert eight.fsdp_summary.sharded > 0
  _, (after_eight,), _ = run_steps(eight, init, [batch])
  assert rel_diff(after_eight.batch_stats, after_one.batch_stats) <= REL_TOL
  assert rel_diff(after_eight.params, after_one.params) <= REL_TOL
  assert rel_diff(after_one.batch_stats, init.batch_stats) > 1e-3  # the statistics moved


@pytest.mark.parametrize("model", ["vit_mini", "resnet_tiny"])
def test_bf16_params_are_cast_before_the_gather_and_train_as_data_parallel_does(model):
  """bf16: the kernels the model only uses cast to bf16 are gathered (and their gradients
  reduce-scattered) in bf16; LayerNorm, BN and the fp32 head stay fp32. One step equals data
  parallelism's on 8 devices, which casts the same values after its (absent) gather.
  (ResNet: its BN statistics are an input of the traced model too.)"""
  bf16 = {**VIT, "model.name": model, "precision": "bf16"}
  sharded = Experiment(make_config(8, **bf16, **FSDP))
  cast = sharded.fsdp_gather.cast
  if model == "vit_mini":
    assert cast["block0"]["fc1"]["kernel"] == np.dtype("bfloat16")
    assert cast["patch_embed"]["kernel"] == np.dtype("bfloat16")
    assert cast["block0"]["norm1"]["scale"] is None and cast["head"]["kernel"] is None
  else:
    assert cast["stage1_block1"]["Conv_0"]["kernel"] == np.dtype("bfloat16")
    assert cast["stage1_block1"]["BatchNorm_0"]["scale"] is None
  replicated = Experiment(make_config(8, **bf16))
  init = jax.device_get(replicated.init_state())
  batch = next(iter(replicated.train_loader()))
  _, (after_dp,), (loss_dp,) = run_steps(replicated, init, [batch])
  _, (after_fsdp,), (loss_fsdp,) = run_steps(sharded, init, [batch])
  assert rel_diff(after_fsdp.params, after_dp.params) <= REL_TOL
  assert loss_fsdp == pytest.approx(loss_dp, rel=REL_TOL)
  assert rel_diff(after_dp.params, init.params) > 1e-4


def _argument_bytes(exp) -> int:
  batch = {"image": jax.ShapeDtypeStruct((16,) + exp.image_shape, np.uint8, sharding=exp.batch_sharding),
           "label": jax.ShapeDtypeStruct((16,), np.int32, sharding=exp.batch_sharding),
           "mask": jax.ShapeDtypeStruct((16,), np.bool_, sharding=exp.batch_sharding),
           "corrupt": jax.ShapeDtypeStruct((16,), np.int32, sharding=exp.batch_sharding)}
  return exp.train_step.lower(exp.abstract_state, batch).compile().memory_analysis().argument_size_in_bytes


def test_each_device_holds_an_eighth_of_the_params_and_optimizer_state():
  """XLA's memory analysis of the compiled step (per device): ViT-Ti/16 with AdamW, FSDP
  over 8 devices against data parallelism on 8. The state dominates the arguments (the
  batch is 12 KiB per device), so their ratio is the state's."""
  vit_ti = {"model.name": "vit_ti16", "image_size": 32, "optim.name": "adamw",
            "mesh.fsdp_min_size": 4096}
  replicated = Experiment(make_config(8, **vit_ti))
  sharded = Experiment(make_config(8, **vit_ti, **FSDP))
  ratio = _argument_bytes(sharded) / _argument_bytes(replicated)
  summary = sharded.fsdp_summary
  print(f"\n{summary.line()}\nmeasured: arguments per device {ratio:.4f} of data parallelism's")
  assert 1 / 8 <= ratio <= 0.135
  assert summary.bytes_per_device / summary.total_bytes == pytest.approx(ratio, abs=0.005)


# --- checkpoints across meshes ------------------------------------------------------------

RUN = {**VIT, "checkpoint_every_steps": 2, "log_every_steps": 1, "data.eval_batch_size": 16}


def _train(workdir, num_devices, total_steps, **mesh) -> dict:
  """Trains (or resumes) in `workdir`; {step: train loss} of its metrics.jsonl."""
  api.train(make_config(num_devices, **RUN, **mesh, total_steps=total_steps), str(workdir))
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["step"]: r["train/loss"] for r in map(json.loads, f) if "train/loss" in r}


@pytest.fixture(scope="module")
def fsdp8_run(tmp_path_factory):
  """6 steps of FSDP on 8 devices, checkpointed at 2, 4 and 6: (workdir, {step: train loss},
  what the run printed). The tests below write into copies of it."""
  workdir = tmp_path_factory.mktemp("fsdp8") / "w"
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    losses = _train(workdir, 8, 6, **FSDP)
  return workdir, losses, printed.getvalue()


def test_a_checkpoint_restores_exactly_onto_other_meshes_and_resumes_there(tmp_path, fsdp8_run):
  """Saved by FSDP on 8 devices (each shard written by its owner), step 4 restores bit for bit
  onto 8 (FSDP), 4, 1 and a 2x2 FSDP mesh; a run resumed on 4 devices without FSDP continues
  the loss curve of the run on the mesh that wrote it (same batches: the data iterator's
  position means the same on any mesh)."""
  first, same_mesh, out = fsdp8_run  # read only
  # The run says what FSDP did, once, after its first line.
  assert out.count("FSDP over 8 devices: ") == 1 and "tensors sharded" in out, out
  raw = ckpt.Checkpoints(str(first), read_only=True).read(4)[0]  # numpy, as saved

  reference = None
  for devices, mesh in [(8, FSDP), (4, {}), (1, {}), (4, {**FSDP, "mesh.fsdp_devices": 2})]:
    exp = Experiment(make_config(devices, **RUN, **mesh), need_train_data=False)
    restored = ckpt.Checkpoints(str(first), read_only=True).restore(4, exp.abstract_state)
    kernel = restored.params["block0"]["fc1"]["kernel"]
    assert _shard_fraction(kernel) == (1 / (mesh.get("mesh.fsdp_devices") or devices) if mesh else 1)
    restored = jax.device_get(restored)
    reference = reference or restored
    assert int(restored.step) == 4
    for a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(raw["params"]), strict=True):
      np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(reference), strict=True):
      np.testing.assert_array_equal(a, b)

  # Resumed from step 4 on 4 devices without FSDP, it continues the FSDP run's own steps 5-6
  # (which an exact resume on its own mesh repeats: tests/test_train.py).
  moved = shutil.copytree(first, tmp_path / "dp4")
  shutil.rmtree(moved / "checkpoints" / "6")
  other_mesh = _train(moved, 4, 6)
  print(f"\nloss of steps 5-6, FSDP on 8 vs resumed at 4 with data parallel on 4: "
        f"{[same_mesh[s] for s in (5, 6)]} vs {[other_mesh[s] for s in (5, 6)]}")
  for s in (5, 6):
    assert other_mesh[s] == pytest.approx(same_mesh[s], rel=REL_TOL)
  # Different batches would move the loss by far more than the bar: the steps see new digits.
  assert abs(same_mesh[5] - same_mesh[6]) > 100 * REL_TOL * same_mesh[5]


def test_a_data_position_saved_by_other_processes_is_refused_not_set_aside(tmp_path, fsdp8_run):
  """Each process saves its position in its own shard of the data: a resume with another
  process count is refused in one line, and the (intact) checkpoint stays where it is."""
  workdir = shutil.copytree(fsdp8_run[0], tmp_path / "run")
  record = workdir / "checkpoints" / "6" / ckpt.CHECKSUMS / "metadata"  # orbax's JSON item file
  saved = json.loads(record.read_text())
  assert saved["process_count"] == 1
  record.write_text(json.dumps({**saved, "process_count": 2}))  # as 2 processes would
  with pytest.raises(ckpt.CheckpointMismatchError,
                     match=r"saved by 2 process\(es\).*this run has 1\. Resume with 2 process"):
    _train(workdir, 8, 8, **FSDP)
  assert (workdir / "checkpoints" / "6").is_dir() and not (workdir / ckpt.DAMAGED_DIR).exists()
