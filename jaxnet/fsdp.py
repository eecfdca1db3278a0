"""Which train-state tensors are sharded, and along which axis, under FSDP.

Data parallelism keeps a full copy of the params, the optimizer state and the EMA on
every device. With `config.mesh.fsdp` each large tensor is instead split along one of
its axes over the mesh's `fsdp` axis (ZeRO-3): a device holds 1/fsdp of it. Nothing
else changes in the step: jax.jit sees the shardings, and XLA all-gathers a weight
where the forward and backward passes use it and reduce-scatters its gradient (each
device sums only the slice it updates), in place of data parallelism's all-reduce.

The rule, per tensor of the params, BN statistics, optimizer state and EMA:
- a scalar, or fewer than `min_size` elements (biases, norms, BN statistics): replicated;
  gathering them would cost more latency than their memory is worth;
- else split along its largest axis that `fsdp` divides (ties: the last such axis);
- no axis divides: replicated, and counted, so a summary can say what was left whole.
A parameter and its optimizer moments have one shape, so they get one sharding.

In the step (`Gather`), the params are gathered whole where the model uses them, and each
gradient is constrained back to its param's sharding. A param the model only ever casts to
the compute dtype (bf16 kernels) is cast before it is gathered: half the all-gather traffic,
and its gradient is reduce-scattered in that dtype, as data parallelism all-reduces it. (Cast
after the gather, XLA all-reduces the bf16 gradient and converts it before slicing, a
pattern its GPU compiler does not turn into a reduce-scatter.) Without these constraints
XLA's sharding propagation may split the activations along a weight's sharded axis instead
(model parallelism, with all-to-alls), not FSDP.
"""

import dataclasses
import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxnet.parallel import FSDP_AXIS

# The TrainState fields that hold per-parameter tensors; the rest (step, rng, loss
# scale) are scalars or tiny and stay replicated.
SHARDED_FIELDS = ("params", "batch_stats", "opt_state", "ema_params")


def spec(shape: tuple[int, ...], fsdp: int, min_size: int) -> P:
  """The PartitionSpec of one tensor (see the module docstring)."""
  if fsdp == 1 or not shape or math.prod(shape) < min_size:
    return P()
  divisible = [axis for axis, n in enumerate(shape) if n % fsdp == 0]
  if not divisible:
    return P()
  axis = max(divisible, key=lambda a: (shape[a], a))
  return P(*[FSDP_AXIS if a == axis else None for a in range(len(shape))])


@dataclasses.dataclass(frozen=True)
class Summary:
  """What the sharding rule did to a state: for the run's first lines and for tests."""
  fsdp: int                       # devices each sharded tensor is split over
  sharded: int                    # tensors split
  small: int                      # tensors under min_size, replicated
  indivisible: int                # tensors over min_size that no axis of fsdp divides, replicated
  total_bytes: int                # the whole state
  bytes_per_device: int           # what one device holds of it

  def line(self) -> str:
    gib = lambda n: f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"
    text = (f"FSDP over {self.fsdp} devices: {self.sharded} tensors sharded, {self.small} small ones "
            f"replicated; train state {gib(self.bytes_per_device)} per device of {gib(self.total_bytes)}")
    if self.indivisible:
      text += (f"; {self.indivisible} large tensor(s) replicated because no axis divides by "
               f"{self.fsdp}")
    return text


def state_shardings(abstract_state, mesh: Mesh, enabled: bool, min_size: int):
  """NamedShardings for every leaf of `abstract_state` (a TrainState of ShapeDtypeStructs)."""
  fsdp = mesh.shape[FSDP_AXIS] if enabled else 1
  replicated = NamedSharding(mesh, P())
  by_field = {}
  for field in dataclasses.fields(abstract_state):
    value = getattr(abstract_state, field.name)
    if field.name in SHARDED_FIELDS:
      by_field[field.name] = jax.tree.map(
          lambda x: NamedSharding(mesh, spec(x.shape, fsdp, min_size)), value)
    else:
      by_field[field.name] = jax.tree.map(lambda _: replicated, value)
  return abstract_state.replace(**by_field)


@dataclasses.dataclass(frozen=True)
class Gather:
  """FSDP inside the step: `params(p)` whole on every device, `grads(g)` split as the params."""
  sharding: object                # the params' NamedShardings
  cast: object                    # per param: the dtype to cast to before gathering, or None

  def params(self, params):
    def whole(p, s, dtype):
      if dtype is not None:  # cast the shard (pinned, or XLA gathers fp32 and casts after)
        p = jax.lax.with_sharding_constraint(p.astype(dtype), s)
      return jax.lax.with_sharding_constraint(p, NamedSharding(s.mesh, P()))
    return jax.tree.map(whole, params, self.sharding, self.cast)

  def grads(self, grads):
    return jax.lax.with_sharding_constraint(grads, self.sharding)


def cast_on_use(apply, abstract_params, compute_dtype, *other_args):
  """Per param: `compute_dtype` when `apply(params, *other_args)` (the model) only ever uses
  it cast to that dtype, else None. Read from the traced program (jaxpr), so it holds for any
  model: casting such a param earlier changes no value. `other_args` (e.g. BN statistics)
  are traced too, as abstract values."""
  leaves, treedef = jax.tree.flatten(abstract_params)
  if np.dtype(compute_dtype) == np.float32:
    return jax.tree.unflatten(treedef, [None] * len(leaves))
  jaxpr = jax.make_jaxpr(lambda ls, *rest: apply(jax.tree.unflatten(treedef, ls), *rest))(
      leaves, *other_args).jaxpr
  param_vars = jaxpr.invars[:len(leaves)]  # the params' leaves come first
  uses = {v: [] for v in param_vars}
  for eqn in jaxpr.eqns:
    for v in eqn.invars:
      if not hasattr(v, "val") and v in uses:  # a Var, not a Literal
        uses[v].append(eqn)
  cast = lambda eqns: bool(eqns) and all(
      e.primitive.name == "convert_element_type" and e.params["new_dtype"] == compute_dtype for e in eqns)
  return jax.tree.unflatten(treedef, [compute_dtype if cast(uses[v]) else None for v in param_vars])


def summarize(abstract_state, shardings, min_size: int) -> Summary:
  counts = dict(sharded=0, small=0, indivisible=0)
  total = per_device = 0
  for x, s in zip(jax.tree.leaves(abstract_state), jax.tree.leaves(shardings), strict=True):
    nbytes = math.prod(x.shape) * np.dtype(x.dtype).itemsize
    split = math.prod(s.mesh.shape[a] for a in s.spec if a is not None)
    total += nbytes
    per_device += nbytes // split
    if split > 1:
      counts["sharded"] += 1
    elif not x.shape or math.prod(x.shape) < min_size:
      counts["small"] += 1
    else:
      counts["indivisible"] += 1
  fsdp = jax.tree.leaves(shardings)[0].mesh.shape[FSDP_AXIS]
  return Summary(fsdp=fsdp, total_bytes=total, bytes_per_device=per_device, **counts)
