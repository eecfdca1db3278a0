"""Evaluation: the eval step (`steps.make_eval_step`, metric sums of one batch)
summed over the whole eval set, during training and for `--mode=eval`.

The sums, not means, add up across batches, so the padded last batch and its
masked examples count exactly once: eval/top1 is correct over the exact eval set.
"""

import math
import sys

import jax
import jax.numpy as jnp

from jaxnet import checkpoint as ckpt
from jaxnet import config_io, runtime, xla_flags
from jaxnet.errors import NonFiniteError
from jaxnet.experiment import Experiment
from jaxnet.metrics import MetricWriter, RunWriteError
from jaxnet.state import TrainState
from jaxnet.weights import pretrained


class NonFiniteEvalError(NonFiniteError):
  """An evaluation whose loss is inf/NaN: its numbers are wrong, so it is an error, never a metric."""


def evaluate(exp: Experiment, state: TrainState) -> dict:
  """eval/loss, eval/top1, eval/top5 (means over the eval set) and eval/examples."""
  sums = None
  for batch in exp.eval_batches():
    if sums is None:
      runtime.compile_then_sync(exp.eval_step, (state, batch), "eval_step compiled")
    out = exp.eval_step(state, batch)
    sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
  sums = jax.device_get(sums)
  count = max(float(sums["count"]), 1.0)
  metrics = {"eval/loss": float(sums["loss"]) / count, "eval/top1": float(sums["top1"]) / count,
             "eval/top5": float(sums["top5"]) / count, "eval/examples": int(sums["count"])}
  if not math.isfinite(metrics["eval/loss"]):
    precision, platform = exp.config.precision, exp.mesh.devices.flat[0].platform
    raise NonFiniteEvalError(
        f"eval/loss is {metrics['eval/loss']} (precision {precision}, backend {platform}, "
        f"{metrics['eval/examples']} examples): the evaluation is wrong and was not recorded. "
        f"{xla_flags.ynn_hint(precision, platform)}Weights that are inf/NaN do this too, and so "
        f"do fp16 activations beyond 65504: compare with config.precision=fp32.")
  return metrics


def evaluate_checkpoint(config, workdir: str, step: int | None = None) -> dict:
  """`--mode=eval`: evaluates the latest (or given) checkpoint of WORKDIR and records eval metrics.

  Reads the workdir only, apart from appending to metrics.jsonl (skipped with a
  warning where the workdir is read-only). A damaged checkpoint is an error.
  """
  config_io.validate(config)
  checkpoints = ckpt.Checkpoints(workdir, read_only=True)
  config = pretrained.with_recorded_preprocessing(config, workdir)  # reads no weights
  try:
    step = checkpoints.resolve_step(step)
    exp = Experiment(config, need_train_data=False)
    if exp.process_index == 0 and exp.data_note:
      print(exp.data_note, flush=True)
    state = checkpoints.restore(step, exp.abstract_state)
  finally:
    checkpoints.close()
  metrics = evaluate(exp, state)
  if exp.process_index == 0:
    print(f"eval of checkpoint {step}: top-1 {metrics['eval/top1']:.4f}  top-5 "
          f"{metrics['eval/top5']:.4f}  loss {metrics['eval/loss']:.4f}  "
          f"({metrics['eval/examples']} examples)", flush=True)
    writer = None
    try:
      writer = MetricWriter(workdir)
      writer.write(step, metrics)
      writer.close()
    except RunWriteError as e:  # a read-only workdir, a full disk: the numbers are printed above
      if writer is not None:
        writer.close()  # quietly: the failure is reported here
      print(f"warning: could not record the eval metrics in {workdir}/metrics.jsonl "
            f"({e.cause})", file=sys.stderr, flush=True)
  return metrics
