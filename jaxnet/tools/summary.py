"""Model cost report: parameters, FLOPs (from XLA's cost analysis) and activation memory.

  python -m jaxnet.cli.summary resnet50 [--image-size 224] [--batch-size 32] \
      [--num-classes 1000] [--precision fp32] [--channels 3] [--no-train-step]

Nothing model-sized is allocated: shapes come from `jax.eval_shape`, and XLA
compiles against abstract arguments. Numbers:

  parameters       trainable params (BN running statistics listed separately)
  forward FLOPs    `cost_analysis()["flops"]` of the compiled inference forward
                   (train=False) at batch 1. XLA counts a multiply-add as 2 FLOPs
                   (checked at run time on a matmul and printed); MACs = FLOPs / 2
                   for the convolutions and the dense layer that dominate.
                   XLA counts only kernel taps that land inside the input: the
                   multiply-adds with zero padding are left out, so this is
                   below the textbook count.
  conv+dense MACs  the textbook count, from the jaxpr: whole kernel windows at
                   every output position (padding taps included), as
                   torchvision/fvcore report (resnet50 at 224: ~4.1 G).
  saved for bwd    bytes of the residuals `jax.vjp` keeps from the train=True
                   forward for the backward pass, at the given batch: the
                   activation memory as JAX's autodiff defines it (before XLA
                   fuses or rematerialises anything). Exact, from shapes only:
                   the batch-dependent part of the vjp closure, found as
                   residuals(2B) - residuals(B) so params and their casts drop out.
  train-step temp  `memory_analysis().temp_size_in_bytes` of the compiled train
                   step (steps.make_train_step with the model's task's loss and batch, SGD): XLA's peak scratch for
                   forward + backward + update on *this* backend, excluding the
                   arguments (params, optimizer state, batch) and outputs.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ml_collections import ConfigDict

from jaxnet.core import config as config_lib
from jaxnet.core import models, steps, tasks
from jaxnet.core.state import get_policy
from jaxnet.core.state import init_state


def _count(tree) -> int:
  return sum(int(math.prod(x.shape)) for x in jax.tree.leaves(tree))


def _nbytes(tree) -> int:
  return sum(int(math.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _flops(compiled) -> float:
  cost = compiled.cost_analysis()
  # Older jax returned a list with one dict per computation.
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  return float(cost["flops"])


def flops_per_multiply_add() -> float:
  """What XLA's cost analysis charges for one multiply-add, measured on a matmul."""
  k, n = 64, 32
  a = jax.ShapeDtypeStruct((1, k), jnp.float32)
  b = jax.ShapeDtypeStruct((k, n), jnp.float32)
  return _flops(jax.jit(jnp.dot).lower(a, b).compile()) / (k * n)


def _sub_jaxprs(params):
  for v in params.values():
    for item in (v if isinstance(v, (list, tuple)) else (v,)):
      if hasattr(item, "eqns"):
        yield item
      elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
        yield item.jaxpr


def _jaxpr_macs(jaxpr) -> int:
  total = 0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "conv_general_dilated":
      # Every output element takes a full kernel window of multiply-adds,
      # padding taps included (the torchvision/fvcore convention).
      lhs, rhs = (v.aval.shape for v in eqn.invars)
      dn = eqn.params["dimension_numbers"]
      out = eqn.outvars[0].aval.shape
      rhs_in = rhs[dn.rhs_spec[1]]
      window = math.prod(rhs[d] for d in dn.rhs_spec[2:])
      total += math.prod(out) * rhs_in * window
    elif name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)
    for sub in _sub_jaxprs(eqn.params):
      total += _jaxpr_macs(sub)
  return total


def conventional_macs(fn, *args) -> int:
  """Multiply-adds of the convolutions and matmuls in `fn`, counting whole kernel
  windows at every output position (padding included), as torchvision/fvcore do."""
  return _jaxpr_macs(jax.make_jaxpr(fn)(*args).jaxpr)


def saved_for_backward_bytes(model, params, batch_stats, batch_shape, dtype) -> int:
  """Bytes of activations `jax.vjp` keeps from a train=True forward for the backward pass.

  The vjp closure also holds batch-independent leaves (the params, their
  compute-dtype casts, per-channel BN statistics). Evaluating it at batch B and
  2B and subtracting keeps exactly the part that scales with the batch: the
  activations. Shapes only (jax.eval_shape): nothing is computed or allocated.
  """
  def residual_bytes(batch):
    x = jax.ShapeDtypeStruct((batch,) + tuple(batch_shape[1:]), dtype)

    def residuals(p, bs, x):
      def f(p):
        return model.apply({"params": p, "batch_stats": bs}, x, train=True, mutable=["batch_stats"],
                           rngs={"dropout": jax.random.PRNGKey(0)})[0]
      return jax.vjp(f, p)[1]
    return _nbytes(jax.eval_shape(residuals, params, batch_stats, x))
  return residual_bytes(2 * batch_shape[0]) - residual_bytes(batch_shape[0])


def summarize(name: str, *, image_size: int = 224, batch_size: int = 32, num_classes: int = 1000,
              channels: int = 3, precision_name: str = "fp32", train_step: bool = True) -> dict:
  policy = get_policy(precision_name)
  model = models.create(name, num_classes=num_classes, dtype=policy.compute_dtype)
  image = (image_size, image_size, channels)
  variables = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1,) + image, jnp.float32), train=False))
  params, batch_stats = variables["params"], variables.get("batch_stats", {})
  out = {"model": name, "image_size": image_size, "batch_size": batch_size, "channels": channels,
         "num_classes": num_classes, "precision": precision_name,
         "params": _count(params), "param_bytes": _nbytes(params),
         "bn_stats": _count(batch_stats)}

  # Forward FLOPs per image: inference forward at batch 1.
  def forward(v, x):
    return model.apply(v, x, train=False)
  x1 = jax.ShapeDtypeStruct((1,) + image, policy.compute_dtype)
  out["forward_flops"] = _flops(jax.jit(forward).lower(variables, x1).compile())
  out["flops_per_fma"] = flops_per_multiply_add()
  out["conventional_macs"] = conventional_macs(forward, variables, x1)

  out["saved_for_backward_bytes"] = saved_for_backward_bytes(
      model, params, batch_stats, (batch_size,) + image, policy.compute_dtype)

  if train_step:
    tx = optax.sgd(0.1, momentum=0.9)
    config = config_lib.base_config()
    config.model.name, config.image_size = name, image_size
    task = tasks.for_model(name)
    step = steps.make_train_step(model, tx, lambda s: 0.1, policy, task.loss(model, config, num_classes),
                                 steps.StepOptions((0.5,) * channels, (0.25,) * channels))
    ls = ConfigDict({"initial_scale": 2.0**15, "growth_interval": 2000})
    state = jax.eval_shape(lambda: init_state(model, tx, image, 0, ls))
    fields = {"image": (image, "uint8"), "mask": ((), "bool"), "corrupt": ((), "int32"),
              **task.batch_fields(config)}  # the batch the task's loss reads
    batch = {k: jax.ShapeDtypeStruct((batch_size, *shape), dtype) for k, (shape, dtype) in fields.items()}
    compiled = jax.jit(step).lower(state, batch).compile()
    mem = compiled.memory_analysis()
    out["train_step_temp_bytes"] = int(mem.temp_size_in_bytes) if mem is not None else None
    out["train_step_flops_per_image"] = _flops(compiled) / batch_size
    out["backend"] = jax.default_backend()
  return out


def _fmt_bytes(n) -> str:
  if n is None:
    return "n/a"
  for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= size:
      return f"{n / size:.2f} {unit}"
  return f"{n} B"


def format_table(s: dict) -> str:
  fma = s["flops_per_fma"]
  rows = [
      ("model", f"{s['model']}  ({s['precision']}, {s['num_classes']} classes)"),
      ("input", f"{s['image_size']}x{s['image_size']}x{s['channels']} NHWC, batch {s['batch_size']}"),
      ("parameters", f"{s['params']:,}  ({_fmt_bytes(s['param_bytes'])} fp32)"),
      ("BN running stats", f"{s['bn_stats']:,}"),
      ("forward FLOPs / image", f"{s['forward_flops'] / 1e9:.3f} G  "
                                f"(/{fma:g} = {s['forward_flops'] / fma / 1e9:.3f} G multiply-adds; "
                                f"XLA counts 1 FMA = {fma:g} FLOPs)"),
      ("conv+dense MACs / image", f"{s['conventional_macs'] / 1e9:.3f} G  (whole kernel windows incl. "
                                  f"padding taps, the torchvision/fvcore convention)"),
      (f"saved for backward, batch {s['batch_size']}",
       f"{_fmt_bytes(s['saved_for_backward_bytes'])}  (jax.vjp residuals, train=True forward)"),
  ]
  if "train_step_temp_bytes" in s:
    rows += [
        ("train-step FLOPs / image", f"{s['train_step_flops_per_image'] / 1e9:.3f} G  "
                                     f"(fwd + bwd + SGD update)"),
        (f"train-step temp, batch {s['batch_size']}",
         f"{_fmt_bytes(s['train_step_temp_bytes'])}  (compiled memory_analysis, {s['backend']} backend)"),
    ]
  width = max(len(k) for k, _ in rows)
  return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
