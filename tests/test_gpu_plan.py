"""gpu_plan, gpu_compile and hlo_analysis: the GPU program, compiled on this CPU.

The hlo_analysis tests read small HLO snippets (always run). The gpu_plan tests compile
jaxnet's real train step for H100 targets; they need the CUDA plugin wheels of this jaxlib on
the path (.ci/run installs them into a folder of their own and puts it on PYTHONPATH) and skip,
saying so, without them.
"""

import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

from jaxnet.tools import hlo as ha
from jaxnet.core.errors import UserError

# --- hlo_analysis on snippets -------------------------------------------------------

CONV_MODULE = """HloModule jit_f, is_scheduled=true

%fused_transpose (param_0.1: bf16[3,3,16,32]) -> bf16[32,3,3,16] {
  %param_0.1 = bf16[3,3,16,32]{3,2,1,0} parameter(0)
  ROOT %transpose.1 = bf16[32,3,3,16]{3,2,1,0} transpose(%param_0.1), dimensions={3,0,1,2}
}

%fused_nchw (param_0.2: bf16[64,32,32,32]) -> bf16[64,32,32,32] {
  %param_0.2 = bf16[64,32,32,32]{3,2,1,0} parameter(0)
  ROOT %transpose.2 = bf16[64,32,32,32]{3,2,1,0} transpose(%param_0.2), dimensions={0,3,1,2}
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%x, %y)
}

ENTRY %main.0_spmd (param: bf16[64,32,32,16], param.1: bf16[3,3,16,32]) -> (bf16[64,32,32,32], f32[32], f32[8]) {
  %param.1 = bf16[3,3,16,32]{3,2,1,0} parameter(1), sharding={replicated}
  %wrapped_transpose = bf16[32,3,3,16]{3,2,1,0} fusion(%param.1), kind=kInput, calls=%fused_transpose
  %param = bf16[64,32,32,16]{3,2,1,0} parameter(0), sharding={devices=[2,1,1,1]<=[2]}
  %cudnn-conv.1 = (bf16[64,32,32,32]{3,2,1,0}, u8[0]{0}) custom-call(%param, %wrapped_transpose), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convForward", backend_config={"cudnn_conv_backend_config":{"activation_mode":"kNone"}}
  %get-tuple-element.1 = bf16[64,32,32,32]{3,2,1,0} get-tuple-element(%cudnn-conv.1), index=0
  %nchw = bf16[64,32,32,32]{3,2,1,0} fusion(%get-tuple-element.1), kind=kLoop, calls=%fused_nchw
  %g = f32[32]{0} parameter(2)
  %s = f32[8]{0} parameter(3)
  %all-reduce-start = (f32[32]{0}, f32[8]{0}) all-reduce-start(%g, %s), channel_id=1, replica_groups={{0,1}}, to_apply=%add
  %all-reduce-done = (f32[32]{0}, f32[8]{0}) all-reduce-done(%all-reduce-start)
  %r0 = f32[32]{0} get-tuple-element(%all-reduce-done), index=0
  %r1 = f32[8]{0} get-tuple-element(%all-reduce-done), index=1
  ROOT %tuple = (bf16[64,32,32,32]{3,2,1,0}, f32[32]{0}, f32[8]{0}) tuple(%nchw, %r0, %r1)
}
"""


def test_convolutions_their_layout_and_flops():
  a = ha.analyse(CONV_MODULE, weight_elements={3 * 3 * 16 * 32}, min_activation_elements=64 * 100)
  assert a.convolutions == [{"kind": "forward", "layout": "NHWC", "dim_labels": "b01f_o01i->b01f",
                             "dtype": "bf16", "count": 1}]
  conv = next(k for k in a.kernels if k.kind == "conv")
  assert conv.flops == 2 * (64 * 32 * 32 * 32) * (3 * 3 * 16)
  # Its bytes: input + filter + result; the u8 scratch space is not HBM traffic worth counting.
  assert conv.bytes == 2 * (64 * 32 * 32 * 16 + 3 * 3 * 16 * 32 + 64 * 32 * 32 * 32)


def test_transposes_are_sized_against_weights_and_activations():
  a = ha.analyse(CONV_MODULE, weight_elements={3 * 3 * 16 * 32}, min_activation_elements=64 * 100)
  assert [(t["size"], t["inside"]) for t in a.transposes] == [("weight", "wrapped_transpose"),
                                                              ("activation", "nchw")]
  # The same transposes, nothing told about the weights: both count as activation-sized.
  assert ha.summary(ha.analyse(CONV_MODULE))["transposes"]["activation"] == 2


def test_kernels_and_combined_collectives():
  a = ha.analyse(CONV_MODULE)
  s = ha.summary(a)
  assert s["kernels"] == 3  # two fusions and the cuDNN call; views and collectives are not kernels
  assert s["fusions"] == 2
  assert s["collectives"] == {"all-reduce": {"count": 1, "bytes": 4 * 40, "elements": 40,
                                             "combined": 1, "exposed": 1}}
  assert a.collectives[0]["operands"] == ["f32[32]{0}", "f32[8]{0}"]


def test_an_all_reduce_of_a_concatenation_is_combined():
  text = CONV_MODULE.replace("(%g, %s), channel_id", "(%cat), channel_id").replace(
      "  %all-reduce-start", "  %cat = f32[40]{0} fusion(%g, %s), kind=kLoop, calls=%fused_cat\n"
      "  %all-reduce-start").replace("%add (x", "%fused_cat (a: f32[32], b: f32[8]) -> f32[40] {\n"
      "  %a = f32[32]{0} parameter(0)\n  %b = f32[8]{0} parameter(1)\n"
      "  ROOT %c = f32[40]{0} concatenate(%a, %b), dimensions={0}\n}\n\n%add (x")
  c = ha.analyse(text).collectives
  assert [(x["elements"], x["combined"]) for x in c] == [(40, True)]


LOOP_MODULE = """HloModule jit_g

%fused_dot (p0: bf16[16,64], p1: bf16[64,32]) -> bf16[16,32] {
  %p0 = bf16[16,64]{1,0} parameter(0)
  %p1 = bf16[64,32]{1,0} parameter(1)
  ROOT %dot.1 = bf16[16,32]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (arg: (s32[], bf16[16,64], bf16[64,32])) -> (s32[], bf16[16,64], bf16[64,32]) {
  %arg = (s32[], bf16[16,64]{1,0}, bf16[64,32]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = bf16[16,64]{1,0} get-tuple-element(%arg), index=1
  %w = bf16[64,32]{1,0} get-tuple-element(%arg), index=2
  %gemm = bf16[16,32]{1,0} fusion(%x, %w), kind=kCustom, calls=%fused_dot, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %cublas = (bf16[16,32]{1,0}, s8[4194304]{0}) custom-call(%x, %w), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  ROOT %t = (s32[], bf16[16,64]{1,0}, bf16[64,32]{1,0}) tuple(%i, %x, %w)
}

%cond (arg.1: (s32[], bf16[16,64], bf16[64,32])) -> pred[] {
  %arg.1 = (s32[], bf16[16,64]{1,0}, bf16[64,32]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%arg.1), index=0
  %c = s32[] constant(4)
  ROOT %lt = pred[] compare(%i.1, %c), direction=LT
}

ENTRY %main (a: bf16[16,64], b: bf16[64,32]) -> (s32[], bf16[16,64], bf16[64,32]) {
  %a = bf16[16,64]{1,0} parameter(0)
  %b = bf16[64,32]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[16,64]{1,0}, bf16[64,32]{1,0}) tuple(%zero, %a, %b)
  ROOT %while = (s32[], bf16[16,64]{1,0}, bf16[64,32]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
}
"""


def test_while_body_counts_once_per_trip_and_gemm_flops():
  a = ha.analyse(LOOP_MODULE)
  s = ha.summary(a)
  assert s["gemms"] == {"triton": 4, "cublas": 4}
  assert s["flops"] == 8 * (2 * 16 * 32 * 64)
  assert s["kernels"] == 12  # per trip: two GEMMs and the loop condition's compare


LAYER_MODULE = """HloModule jit_train_step, is_scheduled=true

%fused_bn (p0: bf16[8,4,4,16]) -> f32[16] {
  %p0 = bf16[8,4,4,16]{3,2,1,0} parameter(0)
  %c = f32[8,4,4,16]{3,2,1,0} convert(%p0), metadata={op_name="jit(train_step)/transpose(jvp(ResNet))/stage2_block3/BatchNorm_1/convert_element_type"}
  %z = f32[] constant(0)
  ROOT %r = f32[16]{0} reduce(%c, %z), dimensions={0,1,2}, to_apply=%add, metadata={op_name="jit(train_step)/transpose(jvp(ResNet))/stage2_block3/BatchNorm_1/reduce_sum"}
}

%fused_update (p0: f32[16], p1: f32[16]) -> (f32[16], f32[16]) {
  %p0 = f32[16]{0} parameter(0)
  %p1 = f32[16]{0} parameter(1)
  %a = f32[16]{0} add(%p0, %p1), metadata={op_name="jit(train_step)/optimizer/add"}
  ROOT %t = (f32[16]{0}, f32[16]{0}) tuple(%a, %a)
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%x, %y)
}

ENTRY %main (x: bf16[8,4,4,16], w: bf16[16,3,3,16], p: f32[16]) -> (bf16[8,4,4,16], f32[16]) {
  %x = bf16[8,4,4,16]{3,2,1,0} parameter(0)
  %w = bf16[16,3,3,16]{3,2,1,0} parameter(1)
  %p = f32[16]{0} parameter(2)
  %conv = (bf16[8,4,4,16]{3,2,1,0}, u8[0]{0}) custom-call(%x, %w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convForward", metadata={op_name="jit(train_step)/jvp(ResNet)/stage2_block3/Conv_1/conv_general_dilated"}
  %y = bf16[8,4,4,16]{3,2,1,0} get-tuple-element(%conv), index=0
  %dgrad = (bf16[8,4,4,16]{3,2,1,0}, u8[0]{0}) custom-call(%y, %w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convForward", metadata={op_name="jit(train_step)/transpose(jvp(ResNet))/stage2_block3/Conv_1/conv_general_dilated"}
  %dx = bf16[8,4,4,16]{3,2,1,0} get-tuple-element(%dgrad), index=0
  %wgrad = (bf16[16,3,3,16]{3,2,1,0}, u8[0]{0}) custom-call(%x, %dx), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convBackwardFilter", metadata={op_name="jit(train_step)/transpose(jvp(ResNet))/stage2_block3/Conv_1/conv_general_dilated"}
  %bn = f32[16]{0} fusion(%dx), kind=kInput, calls=%fused_bn
  %update = (f32[16]{0}, f32[16]{0}) fusion(%p, %bn), kind=kLoop, calls=%fused_update, metadata={op_name="jit(train_step)/optimizer/add"}
  %new = f32[16]{0} get-tuple-element(%update), index=0
  %copy = f32[16]{0} copy(%new)
  ROOT %out = (bf16[8,4,4,16]{3,2,1,0}, f32[16]{0}) tuple(%dx, %copy)
}
"""


def test_each_kernel_is_named_by_its_layer_part_and_pass_from_the_hlo():
  """The per-layer table: a kernel's layer and pass from its op_name (the model's modules and
  jvp/transpose, the step's named scopes), its part from the HLO (a convolution's kind: a
  forward convolution in the backward pass is an input gradient), never from a kernel name."""
  a = ha.analyse(LAYER_MODULE)
  layers = {k.name: ha.layer_of(k) for k in a.kernels}
  assert layers == {"conv": ("stage2", "conv fwd", "forward"), "dgrad": ("stage2", "conv dgrad", "backward"),
                    "wgrad": ("stage2", "conv wgrad", "backward"),
                    "bn": ("stage2", "bn", "backward"),  # named by the instructions inside it
                    "update": ("optimizer", "fusion", "step"),
                    "copy": ("optimizer", "transpose", "step")}  # a copy XLA added: named by its operand
  rows = ha.layer_table(a, {"bf16": 1e12, "f32": 1e12}, 1e9)
  assert [(r["layer"], r["part"], r["pass"], r["kernels"]) for r in rows] == [
      ("stage2", "conv fwd", "forward", 1), ("stage2", "conv dgrad", "backward", 1),
      ("stage2", "conv wgrad", "backward", 1), ("stage2", "bn", "backward", 1),
      ("optimizer", "fusion", "step", 1), ("optimizer", "transpose", "step", 1)]
  bn = rows[3]  # memory-bound: its bytes at 1 GB/s
  assert bn["bytes"] == 8 * 4 * 4 * 16 * 2 + 16 * 4 and bn["ms"] == pytest.approx(bn["bytes"] / 1e9 * 1e3)
  # A device trace's events through their HLO instruction to the layer; the rest unmatched.
  events = [{"name": "sm90_xmma_wgrad", "dur": 7.0, "args": {"hlo_op": "wgrad"}},
            {"name": "cudnn_kernel_2", "dur": 1.0, "args": {"hlo_op": "wgrad"}},
            {"name": "loop_add_fusion", "dur": 2.0, "args": {"long_name": "%update = (f32[16]) fusion(...)"}},
            {"name": "memset", "dur": 0.5, "args": {}}]
  mapped = ha.map_trace(events, a)
  assert mapped["matched"] == 3 and mapped["events"] == 4
  assert mapped["rows"] == {("stage2", "conv wgrad", "backward"): 8.0, ("optimizer", "fusion", "step"): 2.0}
  assert mapped["unmatched"] == {"memset": 0.5}


def test_fused_attention_counts_its_two_matmuls_forward_and_twice_them_backward():
  """cuDNN's fused attention: softmax(q k^T) v, in jax's (batch, tokens, heads, head dim) layout,
  counted as 2 matmuls of 2*B*N*T*T*H FLOPs forward and twice that backward (was 0)."""
  q = "bf16[2,197,12,64]{3,2,1,0}"
  text = f"""HloModule jit_f, is_scheduled=true

ENTRY %main (q: {q.split('{')[0]}, k: {q.split('{')[0]}, v: {q.split('{')[0]}) -> {q.split('{')[0]} {{
  %q = {q} parameter(0)
  %k = {q} parameter(1)
  %v = {q} parameter(2)
  %fwd = ({q}, u8[0]{{0}}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax"
  %o = {q} get-tuple-element(%fwd), index=0
  %bwd = ({q}, {q}, {q}, u8[0]{{0}}) custom-call(%q, %k, %v, %o), custom_call_target="__cudnn$fmhaSoftmaxBackward"
  ROOT %dq = {q} get-tuple-element(%bwd), index=0
}}
"""
  a = ha.analyse(text)
  forward = 2 * 2 * 2 * 12 * 197 * 197 * 64
  assert [(k.kind, k.flops) for k in a.kernels] == [("attention", forward), ("attention", 2 * forward)]
  assert a.flops == 3 * forward


def test_no_entry_is_an_error():
  with pytest.raises(ValueError, match="no ENTRY"):
    ha.analyse("HloModule empty\n")


def test_missing_or_mismatched_plugin_names_the_fix(monkeypatch):
  from jaxnet.tools import gpu_plan as gpu_compile
  jaxlib = importlib.metadata.version("jaxlib")
  real = importlib.metadata.version

  def none(name):
    if name.startswith("jax-cuda"):
      raise importlib.metadata.PackageNotFoundError(name)
    return real(name)

  monkeypatch.setattr(importlib.metadata, "version", none)
  with pytest.raises(UserError, match=f"rerun with --install-plugin \\(it puts jax-cuda12-plugin=={jaxlib} "
                                      f"and jax-cuda12-pjrt=={jaxlib}"):
    gpu_compile.check_plugin()
  monkeypatch.setattr(importlib.metadata, "version",
                      lambda name: "0.0.1" if name.startswith("jax-cuda12") else none(name))
  with pytest.raises(UserError, match=f"does not match jaxlib {jaxlib}: rerun with --install-plugin"):
    gpu_compile.check_plugin()
  with pytest.raises(UserError, match="unknown --target=v200: use one of a100, h100, h200"):
    gpu_compile.target_text("v200")


# --- gpu_plan: jaxnet's steps compiled for H100s ----------------------------------------

def _plugin_reason():
  from jaxnet.tools import gpu_plan as gpu_compile
  try:
    gpu_compile.check_plugin()
  except UserError as e:
    return str(e)
  return None


def _require_plugin():
  reason = _plugin_reason()
  if reason:
    print(f"\ngpu_plan tests skipped: {reason}")
    pytest.skip(reason)


def _resnet50(precision, per_gpu_batch, gpus):
  """ResNet-50's train step (the real one, via Experiment) compiled for `gpus` H100s."""
  from jaxnet.core import config as config_io
  from jaxnet.tools import gpu_plan as gpu_compile
  _require_plugin()
  _, text = gpu_compile.target_text("h100")
  devices = gpu_compile.topology_devices(text, gpus)
  config = gpu_compile.plan_config(config_io.load("configs/resnet50.py", {"precision": precision}),
                                per_gpu_batch, gpus)
  exp, train, _ = gpu_compile.build(config, devices, eval_step=False)
  analysis = gpu_compile.analyse_step(train, exp.abstract_state, per_gpu_batch)
  return exp, train, analysis, gpu_compile.device_memory(text)


def _check_resnet50(exp, train, analysis, device_memory, gpus):
  import jax
  import numpy as np
  s = ha.summary(analysis)
  # Every convolution is a cuDNN call, in NHWC: 53 forward convolutions, their 53 filter
  # gradients and 52 input gradients (the stem's input needs none), however cuDNN splits them.
  assert sum(s["convolutions"].values()) == 158
  assert s["conv_layouts"] == {"NHWC": 158}
  # No activation-sized transpose or copy anywhere in the step.
  assert analysis.transposes_of("activation") == []
  # The recipe's max pool is scatter-free: no select-and-scatter (nor any scatter) in the step.
  assert not re.search(r"\b(select-and-)?scatter\(", train.hlo)
  assert train.total < 0.75 * device_memory
  if gpus == 1:
    assert s["collectives"] == {}
    return
  # Gradients are all-reduced: as many values as there are parameters (XLA reduces each conv
  # gradient in the conv's dtype, before its cast to fp32), plus the BN batch statistics.
  params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(exp.abstract_state.params))
  bn_channels = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(exp.abstract_state.batch_stats))
  reduced = s["collectives"]["all-reduce"]["elements"]
  assert params <= reduced <= params + 2 * bn_channels, (params, bn_channels, reduced)
  assert set(s["collectives"]) == {"all-reduce"}
  # (The bound also means nothing of activation size is reduced: one ResNet-50 activation at
  # 256 images per GPU has more values than the slack.)


def test_resnet50_bf16_on_8_h100s_is_cudnn_nhwc_without_activation_transposes():
  _check_resnet50(*_resnet50("bf16", 256, 8), gpus=8)


@pytest.mark.slow
@pytest.mark.parametrize("precision,gpus", [("bf16", 1), ("fp16", 1), ("fp16", 8)])
def test_resnet50_on_h100s(precision, gpus):
  _check_resnet50(*_resnet50(precision, 256, gpus), gpus=gpus)


@pytest.mark.slow
def test_vit_b16_attention_lowering_is_named():
  from jaxnet.core import config as config_io
  from jaxnet.tools import gpu_plan
  _require_plugin()
  config = config_io.load("configs/vit.py:b16", {"batch_size": 256})
  r = gpu_plan.plan(config, target="h100", gpus=1)
  # Named: without the cuDNN library here, jax cannot trace cuDNN's fused attention, and the
  # step shows XLA's; the line says so (and that a GPU run uses the fused kernel).
  assert r["train"]["attention"] == {}
  assert r["attention"].startswith("XLA's (batched GEMMs around a softmax fusion): jax refused "
                                   "cuDNN's fused attention here: cuDNN not found")
  assert f"  attention: {r['attention']}" in gpu_plan.table(r)
  # XLA's attention moves q, k, v between (batch, tokens, heads) and (batch, heads, tokens)
  # around its batched GEMMs: activation-sized transposes that the fused kernel does not need.
  assert r["train"]["transposes"]["activation"] > 0


def test_command_line_prints_the_table_or_one_line():
  _require_plugin()
  cmd = [sys.executable, "-m", "jaxnet.cli.gpu_plan", "--config=configs/resnet50.py", "--gpus=2", "--hosts=2",
         "--config.model.name=resnet_tiny", "--config.image_size=32", "--config.batch_size=16",
         "--target=a100"]
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "on 2x NVIDIA A100-SXM4-80GB (2 host(s))" in out.stdout
  assert "collectives: all-reduce" in out.stdout
  bad = subprocess.run(cmd[:-1] + ["--target=v200"], capture_output=True, text=True, timeout=300)
  assert bad.returncode == 1
  # One error line (jax may log "Could not find cuda drivers" lines around it: not ours).
  errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and errors[0].startswith("error: unknown --target=v200: use one of")
  assert "Traceback" not in bad.stderr


def test_largest_batch_doubles_then_bisects(monkeypatch):
  """The search, with a fake compile: 1 GiB per image per GPU for the train step (half for the
  eval step), plus what a run keeps beside it (2 prefetched batches, a 3% margin of the pool)."""
  from jaxnet.tools import gpu_plan as gpu_compile
  compiled = []

  def fake_build(config, devices, eval_step=True):
    per_gpu = config.batch_size // len(devices)
    compiled.append(per_gpu)
    step = lambda gib: gpu_compile.Compiled("", int(gib * 2**30), 0, 0, 0, 0)
    return None, step(per_gpu), step(per_gpu / 2) if eval_step else None

  monkeypatch.setattr(gpu_compile, "build", fake_build)
  from jaxnet.core import config as config_io
  config = config_io.load("configs/resnet50.py", {})
  usable = 21.5 * 2**30  # 20 images: 20 GiB + 0.65 GiB of margin + 6 MB of batches fit; 21 do not
  found = gpu_compile.largest_batch(config, devices=[0, 1], usable=usable, start=4)
  assert (found["per_gpu_batch"], found["does_not_fit"]) == (20, 22)
  search, final = compiled[:-1], compiled[-1]
  assert search[:4] == [4, 8, 16, 32]  # doubling until it does not fit, then bisecting
  assert len(search) == len(set(search)) <= 8 and final == 20  # the answer, with its eval step
  batches = 2 * 20 * (224 * 224 * 3 + 9)
  assert found["prefetch_bytes"] == batches
  assert found["headroom_bytes"] == pytest.approx(usable - 20 * 2**30 - batches - 0.03 * usable)
  compiled.clear()
  too_big = gpu_compile.largest_batch(config, devices=[0, 1], usable=2.5 * 2**30, start=64)
  assert (too_big["per_gpu_batch"], too_big["does_not_fit"]) == (2, 3)
  assert compiled[:-1] == [64, 32, 16, 8, 4, 2, 3]  # halving until it fits, then between 2 and 4


def test_the_search_says_what_it_compiles_before_each_compile(monkeypatch):
  """--find-max-batch takes minutes: its first line announces the search, and each try is
  named before its compile starts (with the fake compile of the test above)."""
  from jaxnet.tools import gpu_plan as gpu_compile
  events = []

  def fake_build(config, devices, eval_step=True):
    per_gpu = config.batch_size // len(devices)
    events.append(f"compile {per_gpu}")
    step = lambda gib: gpu_compile.Compiled("", int(gib * 2**30), 0, 0, 0, 0)
    return None, step(per_gpu), step(per_gpu / 2) if eval_step else None

  monkeypatch.setattr(gpu_compile, "build", fake_build)
  from jaxnet.core import config as config_io
  config = config_io.load("configs/resnet50.py", {})
  gpu_compile.largest_batch(config, devices=[0, 1], usable=10.5 * 2**30, start=4, log=events.append)
  assert events[0].startswith("finding the largest per-GPU batch that fits: one train-step compile per try")
  compiles = [i for i, e in enumerate(events) if e.startswith("compile ")]
  for i in compiles[:-1]:
    assert events[i - 1] == f"  per-GPU batch {events[i].split()[1]}: compiling ..."
    assert events[i + 1].startswith(f"  per-GPU batch {events[i].split()[1]}: step ")
  assert events[compiles[-1] - 1] == "  per-GPU batch 10 fits: compiling its eval step too ..."


@pytest.mark.parametrize("scatter_free", [False, True])
def test_fp16_max_pool_gradient_stays_sharded_over_8_h100s(scatter_free):
  """models.max_pool in fp16: its gradient is not partitioned by all-gathering the batch
  (jax's, through fp32; the scatter-free one in fp16 itself), and the scatter-free one has
  no scatter."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P

  from jaxnet.tools import gpu_plan as gpu_compile

  from jaxnet.core import models
  _require_plugin()
  _, text = gpu_compile.target_text("h100")
  mesh = jax.sharding.Mesh(gpu_compile.topology_devices(text, 8), ("data",))
  x = jax.ShapeDtypeStruct((64, 32, 32, 16), jnp.float16, sharding=NamedSharding(mesh, P("data")))
  pool = lambda x: models.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)), scatter_free=scatter_free)
  loss = lambda x: jnp.sum(pool(x).astype(jnp.float32) ** 2)
  hlo = jax.jit(jax.grad(loss)).lower(x).compile().as_text()
  assert ha.summary(ha.analyse(hlo))["collectives"] == {}
  assert bool(re.search(r"\b(select-and-)?scatter\(", hlo)) != scatter_free


def test_a_run_s_xla_flags_are_compile_options_unless_xla_flags_sets_them(monkeypatch):
  from jaxnet.tools import gpu_plan as gpu_compile
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  assert gpu_compile.run_options() == {"xla_gpu_enable_latency_hiding_scheduler": True,
                                    "xla_gpu_all_reduce_combine_threshold_bytes": 134217728}
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_latency_hiding_scheduler=false")
  assert gpu_compile.run_options() == {"xla_gpu_all_reduce_combine_threshold_bytes": 134217728}


def _vit_mini_on_8_h100s(**mesh):
  from jaxnet.core import config as config_io
  from jaxnet.tools import gpu_plan as gpu_compile
  _require_plugin()
  _, text = gpu_compile.target_text("h100")
  config = gpu_compile.plan_config(config_io.load("configs/vit.py:s16", {
      "model.name": "vit_mini", "image_size": 16, "data.num_classes": 10, "mesh.fsdp_min_size": 256,
      **mesh}), 8, 8)
  exp, train, _ = gpu_compile.build(config, gpu_compile.topology_devices(text, 8), eval_step=False)
  return exp, ha.summary(gpu_compile.analyse_step(train, exp.abstract_state, 8))["collectives"]


def test_fsdp_reduce_scatters_the_gradients_of_sharded_params_on_8_h100s():
  """Under FSDP the gradients of the split params are reduce-scattered, not all-reduced: the
  all-reduces carry only the replicated (small) params' gradients and scalars; data
  parallelism all-reduces every gradient. No all-to-all: the activations are not resharded.
  The bf16 model's kernels are gathered in bf16 (2 bytes an element), not as fp32 shards."""
  import math

  import jax
  dp, dp_collectives = _vit_mini_on_8_h100s()
  fsdp, collectives = _vit_mini_on_8_h100s(**{"mesh.fsdp": True})
  sizes = lambda tree: [math.prod(x.shape) for x in jax.tree.leaves(tree)]
  params = sum(sizes(dp.abstract_state.params))
  split = sum(n for n, s in zip(sizes(fsdp.abstract_state.params),
                                jax.tree.leaves(fsdp.state_sharding.params)) if any(s.spec))
  assert split > params / 2
  print(f"\nvit_mini params {params}, split {split}; collectives DP {dp_collectives}, FSDP {collectives}")
  assert dp_collectives["all-reduce"]["elements"] >= params
  assert "reduce-scatter" not in dp_collectives
  assert collectives["reduce-scatter"]["elements"] >= split
  assert collectives["all-reduce"]["elements"] < params - split + 1000  # small grads and scalars
  assert collectives["all-gather"]["count"] >= 1
  assert collectives["all-gather"]["bytes"] <= 2.2 * collectives["all-gather"]["elements"]
  assert "all-to-all" not in collectives


def test_bad_targets_dump_folders_and_device_counts_are_one_line_before_compiling(tmp_path):
  """Each is a UserError (one line from the command line) raised before any compiling."""
  from jaxnet.core import config as config_lib
  from jaxnet.tools import gpu_plan
  broken = tmp_path / "broken.txtpb"
  broken.write_text("gpu_device_info { threads_per_block_limit: 1024 }\n")
  with pytest.raises(UserError, match=r"is no GPU description jaxnet can read \(no device_memory_size or "
                                      r"memory_bandwidth\)"):
    gpu_plan.target_text(str(broken))
  _, text = gpu_plan.target_text("h100")
  for gpus, hosts, message in ((0, 1, "--gpus=0 --hosts=1: give at least 1 of each"),
                               (3, 2, "--gpus=3 does not split over --hosts=2")):
    with pytest.raises(UserError, match=message):
      gpu_plan.topology_devices(text, gpus, hosts)
  not_a_folder = tmp_path / "file"
  not_a_folder.write_text("")
  config = config_lib.load("configs/digits.py")
  with pytest.raises(UserError, match="does not take files"):
    gpu_plan.plan(config, dump=str(not_a_folder / "hlo"))


def test_the_plan_stands_in_synthetic_images_with_the_recipes_channels():
  """The quick-start recipe (grayscale digits) was refused: the plan's synthetic images had 3
  channels whatever the recipe's normalisation said."""
  from jaxnet.core import config as config_lib
  from jaxnet.core import tasks
  from jaxnet.tools import gpu_plan
  config = gpu_plan.plan_config(config_lib.load("configs/digits.py"))
  assert tasks.for_model(config.model.name).make_source(config, "train")[0]["image"].shape == (16, 16, 1)


def test_the_plugin_stays_out_of_other_jax_programs(tmp_path):
  """The plan finds the plugin in its cache folder (JAXNET_CUDA_PLUGIN_DIR here), with nothing
  on PYTHONPATH; a CPU training run beside it never loads it: no plugin error, no traceback."""
  _require_plugin()
  import os
  import jax_plugins
  from tests.helpers import REPO
  plugin_dir = os.path.dirname(list(jax_plugins.__path__)[0])
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env["JAXNET_CUDA_PLUGIN_DIR"] = plugin_dir
  plan = subprocess.run([sys.executable, "-m", "jaxnet.cli.gpu_plan", "--config=configs/digits.py",
                         "--gpus=1", "--target=a100"], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=600)
  assert plan.returncode == 0, plan.stderr[-2000:]
  assert "resnet_tiny fp32 16px" in plan.stdout  # the quick-start recipe plans too (grayscale)
  run = subprocess.run([sys.executable, "-m", "jaxnet.main", "--config=configs/digits.py",
                        f"--workdir={tmp_path / 'w'}", "--config.total_steps=2"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  assert "Traceback" not in run.stderr and "plugin" not in run.stderr.lower(), run.stderr[-2000:]


def test_mixup_with_micro_batches_moves_no_images_between_8_h100s():
  """ViT with mixup and 2 micro-batches on 8 H100s: the roll over the whole batch became 6
  all-to-alls (92 MiB per GPU per step for ViT-H/14); pairing within each GPU's share has none."""
  from jaxnet.core import config as config_io
  from jaxnet.tools import gpu_plan as gpu_compile
  _require_plugin()
  _, text = gpu_compile.target_text("h100")
  devices = gpu_compile.topology_devices(text, 8)
  config = gpu_compile.plan_config(config_io.load("configs/vit.py:s16", {
      "model.name": "vit_mini", "image_size": 32, "grad_accum_steps": 2}), 8, 8)
  _, train, _ = gpu_compile.build(config, devices, eval_step=False)
  ops = {c["op"] for c in ha.analyse(train.hlo).collectives}
  assert not ops & {"all-to-all", "collective-permute", "all-gather"}, ops


OVERLAP_MODULE = """HloModule jit_f, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%x, %y)
}

%fused_mul (p0: f32[64]) -> f32[64] {
  %p0 = f32[64]{0} parameter(0)
  ROOT %m = f32[64]{0} multiply(%p0, %p0)
}

ENTRY %main (a: f32[32], b: f32[64], c: f32[16]) -> (f32[32], f32[64], f32[16]) {
  %a = f32[32]{0} parameter(0)
  %b = f32[64]{0} parameter(1)
  %c = f32[16]{0} parameter(2)
  %ar-start = f32[32]{0} all-reduce-start(%a), channel_id=1, replica_groups={{0,1}}, to_apply=%add
  %work = f32[64]{0} fusion(%b), kind=kLoop, calls=%fused_mul
  %ar-done = f32[32]{0} all-reduce-done(%ar-start)
  %ar2-start = f32[16]{0} all-reduce-start(%c), channel_id=2, replica_groups={{0,1}}, to_apply=%add
  %ar2-done = f32[16]{0} all-reduce-done(%ar2-start)
  ROOT %t = (f32[32]{0}, f32[64]{0}, f32[16]{0}) tuple(%ar-done, %work, %ar2-done)
}
"""


def test_a_collective_is_exposed_unless_compute_is_scheduled_between_its_start_and_done():
  analysis = ha.analyse(OVERLAP_MODULE)
  assert [c["overlapped"] for c in analysis.collectives] == [True, False]
  s = ha.summary(analysis)
  assert s["collectives"]["all-reduce"]["exposed"] == 1 and s["exposed_collectives"] == 1
  assert ha.summary(ha.analyse(CONV_MODULE))["exposed_collectives"] == 1  # nothing between


def test_fsdp_weight_shards_are_weight_sized_not_activations():
  """Under FSDP a transpose of a weight's shard (f32[1280,160] of ViT-H/14's [1280,1280]) is a
  weight's, not an activation's: the plan counted 513 such as activation-sized."""
  import math
  from jaxnet.configs import digits
  from jaxnet.core import config as config_lib
  from jaxnet.core import experiment
  from jaxnet.tools import gpu_plan
  c = config_lib.switch_model(digits.get_config(), "vit_mini")
  c.mesh.fsdp, c.mesh.fsdp_min_size, c.batch_size = True, 1024, 16
  exp = experiment.Experiment(c)
  sizes = gpu_plan.weight_elements(exp.abstract_state)
  import jax
  split = [x for x in jax.tree.leaves(exp.abstract_state.params) if not x.sharding.is_fully_replicated]
  assert split, "vit_mini under FSDP splits some params"
  for x in split:
    whole, shard = math.prod(x.shape), math.prod(x.sharding.shard_shape(x.shape))
    assert whole in sizes and shard in sizes and shard < whole


def test_retinanet_on_8_h100s_is_cudnn_nhwc_without_activation_transposes():
  """configs/retinanet.py (ResNet-50-FPN, bf16) at 512 px, 4 images per GPU: every convolution a
  cuDNN NHWC call, no activation-sized transpose (the pyramid's upsampling is a broadcast,
  whose gradient is a sum, not a scatter), the gradients all-reduced."""
  from jaxnet.core import config as config_io
  from jaxnet.tools import gpu_plan
  _require_plugin()
  config = config_io.load("configs/retinanet.py", {"image_size": 512, "batch_size": 32})
  r = gpu_plan.plan(config, target="h100", gpus=8)
  train = r["train"]
  assert r["model"] == "retinanet_resnet50" and r["per_gpu_batch"] == 4
  assert set(train["conv_layouts"]) == {"NHWC"}
  # 111 convolutions a step: the backbone's 53, the pyramid's 8, and the heads' 2 x 5 at each of
  # the 5 levels; each with its filter gradient.
  assert train["convolutions"]["backward-filter"] == 111
  assert train["transposes"]["activation"] == 0
  assert set(train["collectives"]) == {"all-reduce"}


@pytest.mark.slow  # ~1.5 min on 2 cores: fcn_resnet50's train and eval steps compiled for 8 GPUs
def test_segmentation_at_512_on_8_h100s_says_the_memory_per_gpu():
  """configs/fcn.py (fcn_resnet50 with its auxiliary head, bf16) on 512-pixel crops, 4 images per
  GPU, VOC's 21 classes (data.num_classes, which the synthetic stand-in takes): the plan compiles on synthetic images and masks, every convolution
  (the dilated ones too) a cuDNN NHWC call, and prints the memory per GPU (2.43 GiB measured
  2026-11-29 with jaxlib 0.10.2)."""
  from jaxnet.core import config as config_io
  from jaxnet.tools import gpu_plan
  _require_plugin()
  config = config_io.load("configs/fcn.py", {"image_size": 512, "batch_size": 32})
  r = gpu_plan.plan(config, target="h100", gpus=8)
  assert r["model"] == "fcn_resnet50" and r["per_gpu_batch"] == 4
  assert set(r["train"]["conv_layouts"]) == {"NHWC"}
  memory = r["memory"]
  assert 1 * 2**30 < memory["total"] < memory["usable"] and memory["fits"]
  assert 0 < memory["eval_total"] < memory["total"]
  lines = gpu_plan.table(r).splitlines()
  assert lines[0].startswith("fcn_resnet50 bf16 512px, batch 32 (4/GPU) on 8x NVIDIA H100")
  assert lines[2] == "memory per GPU (train step):" and "fits" in lines[4]


def _fake_wheels(folder, version):
  for name in ("jax-cuda12-plugin", "jax-cuda12-pjrt"):
    info = os.path.join(folder, f"{name.replace('-', '_')}-{version}.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
      f.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_install_plugin_replaces_a_folder_of_another_jaxlibs_plugin(tmp_path, monkeypatch):
  """gpu_plan advised --install-plugin for a mismatched plugin in its folder, and
  --install-plugin skipped the folder because it existed: the same error came back."""
  from jaxnet.cli import gpu_plan as command
  from jaxnet.tools import gpu_plan as gpu_compile
  jaxlib = importlib.metadata.version("jaxlib")
  folder = str(tmp_path / "cuda-plugin" / jaxlib)
  monkeypatch.setenv("JAXNET_CUDA_PLUGIN_DIR", folder)
  monkeypatch.setattr(sys, "path", list(sys.path))
  _fake_wheels(folder, "0.0.1")
  assert gpu_compile.folder_plugin_versions(folder) == {"jax-cuda12-plugin": "0.0.1", "jax-cuda12-pjrt": "0.0.1"}
  pip_runs = []

  def pip(argv, **kwargs):  # pip install --target STAGING: this jaxlib's wheels there
    pip_runs.append(argv)
    _fake_wheels(argv[argv.index("--target") + 1], jaxlib)
    return subprocess.CompletedProcess(argv, 0)

  monkeypatch.setattr(command.subprocess, "run", pip)
  command.prepare_plugin(install=False)
  assert pip_runs == [] and not gpu_compile.folder_matches(folder)
  command.prepare_plugin(install=True)
  assert len(pip_runs) == 1 and gpu_compile.folder_matches(folder)
  assert gpu_compile.folder_plugin_versions(folder) == {"jax-cuda12-plugin": jaxlib, "jax-cuda12-pjrt": jaxlib}
  assert sorted(os.listdir(tmp_path / "cuda-plugin")) == [jaxlib]  # nothing left beside it
  command.prepare_plugin(install=True)  # a matching folder is kept
  assert len(pip_runs) == 1


@pytest.mark.slow  # ~3 min on the shared 2-core VM (two GPU compiles); tests/test_launch.py checks the flags on the CPU
def test_the_h100_cluster_profile_compiles_and_is_reported_beside_the_defaults():
  """distributed.cluster_profile=h100: every flag of the profile reaches XLA's GPU compiler as
  a compile option (an XLA without one refuses it), and the plan says what changed."""
  from jaxnet.core import config as config_io
  from jaxnet.core.adapters import xla
  from jaxnet.tools import gpu_plan as gpu_compile
  _require_plugin()
  _, text = gpu_compile.target_text("h100")
  devices = gpu_compile.topology_devices(text, 8)
  config = gpu_compile.plan_config(config_io.load("configs/vit.py:s16", {
      "model.name": "vit_mini", "image_size": 16, "data.num_classes": 10, "mesh.fsdp_min_size": 256,
      "mesh.fsdp": True, "distributed.cluster_profile": "h100"}), 8, 8)
  exp, train, _ = gpu_compile.build(config, devices, eval_step=False)
  assert train.options == gpu_compile.run_options("h100")
  assert {xla.flag_name(f) for f in xla.CLUSTER_PROFILES["h100"]["xla_flags"]} <= set(train.options)
  changes = gpu_compile.profile_changes(config, devices, train, gpu_compile.analyse_step(train, exp.abstract_state, 8))
  print(f"\nvit_mini FSDP on 8 H100s, the h100 profile beside the defaults: {changes}")
  # The latency-hiding scheduler is on in both; the rest is the profile's own.
  assert "xla_gpu_enable_latency_hiding_scheduler" not in changes["options"]
  assert changes["options"]["xla_gpu_all_gather_combine_threshold_bytes"] == 8589934592
  assert changes["environment"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
  assert {"all-gather", "reduce-scatter", "all-reduce"} <= set(changes["collectives"])
  assert all(before >= 1 and after >= 1 for before, after, _, _ in changes["collectives"].values())
  lines = gpu_compile.profile_lines(changes)
  assert any(l.startswith("distributed.cluster_profile=h100 (above) beside the defaults: options ") for l in lines)
  assert any(re.fullmatch(r"  reduce-scatter: x\d+ -> x\d+, exposed \d+ -> \d+", l) for l in lines)
