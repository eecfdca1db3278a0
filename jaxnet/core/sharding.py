"""Shardings: data parallelism and FSDP with `jax.jit` over a device mesh, and the few
cross-process waits a multi-process run needs.

The mesh is 2-D, (data, fsdp): the batch is split over all its devices, and
the train state is replicated over `data` and, with config.mesh.fsdp, split over
`fsdp` (jaxnet/core/sharding.py). Without FSDP the mesh is (devices, 1): every device
holds the whole state, and XLA, seeing that the loss averages over a sharded
batch, inserts the gradient all-reduce itself (NCCL on GPUs), overlapping it
with the backward pass. FSDP over all devices is (1, devices); over groups of k
devices (e.g. one host's, on NVLink) it is (devices / k, k): the state is split
within a group and replicated across groups.

In a multi-host run (jax.distributed, started by the command line: jaxnet/cli/process.py)
every process sees all devices of all hosts and feeds its own share of each global batch;
`to_global` assembles the pieces into one global array.

FSDP: data parallelism keeps a full copy of the params, the optimizer state and the EMA on
every device. With `config.mesh.fsdp` each large tensor is instead split along one of
its axes over the mesh's `fsdp` axis (ZeRO-3): a device holds 1/fsdp of it. Nothing
else changes in the step: jax.jit sees the shardings, and XLA all-gathers a weight
where the forward and backward passes use it and reduce-scatters its gradient (each
device sums only the slice it updates), in place of data parallelism's all-reduce.

The rule, per tensor of the params, BN statistics, optimizer state and EMA (`spec`):
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

from jaxnet.core.errors import InvalidValueError

DATA_AXIS = "data"
FSDP_AXIS = "fsdp"
BATCH_AXES = (DATA_AXIS, FSDP_AXIS)  # the batch is split over every device of the mesh


def make_mesh(num_devices: int = 0, devices=None, fsdp: bool = False, fsdp_devices: int = 0) -> Mesh:
  """A (data, fsdp) mesh over all devices, or the first `num_devices` of them.

  fsdp off: (devices, 1); on: (devices / fsdp_devices, fsdp_devices), where
  fsdp_devices 0 means all of them. `devices` replaces jax.devices(): e.g. the
  devices of a GPU topology that jaxnet/tools/gpu_plan.py compiles for from a machine
  without GPUs.
  """
  devices = list(jax.devices() if devices is None else devices)
  if num_devices:
    if num_devices > len(devices):
      raise InvalidValueError(f"asked for {num_devices} devices, only {len(devices)} available")
    devices = devices[:num_devices]
  if fsdp_devices and not fsdp:
    raise InvalidValueError(f"mesh.fsdp_devices={fsdp_devices} applies to FSDP: add --config.mesh.fsdp=True, "
                            f"or leave mesh.fsdp_devices at 0")
  group = (fsdp_devices or len(devices)) if fsdp else 1
  if group < 0 or len(devices) % group:
    raise InvalidValueError(f"mesh.fsdp_devices={fsdp_devices} does not divide the {len(devices)} devices; "
                            f"use a divisor of {len(devices)}, or 0 to shard over all of them")
  # Row-major: a group is consecutive devices, which jax orders host by host.
  return Mesh(np.asarray(devices).reshape(-1, group), (DATA_AXIS, FSDP_AXIS))


def batch_devices(mesh: Mesh) -> int:
  """How many devices the batch is split over: all of the mesh's."""
  return mesh.devices.size


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def check_batch_sizes(mesh: Mesh, batch_size: int, grad_accum_steps: int = 1,
                      eval_batch_size: int = 0) -> None:
  """Raises InvalidValueError unless every batch the run splits over the mesh's devices splits
  evenly: the global batch, each of its `grad_accum_steps` micro-batches, the eval batch."""
  devices = batch_devices(mesh)
  if batch_size % grad_accum_steps:
    raise InvalidValueError(f"batch_size={batch_size} must be a multiple of "
                            f"grad_accum_steps={grad_accum_steps}")
  for key, n in (("batch_size", batch_size),
                 ("batch_size / grad_accum_steps", batch_size // grad_accum_steps),
                 ("data.eval_batch_size", eval_batch_size)):
    if n % devices:
      fix = "data.eval_batch_size" if key.startswith("data.") else "batch_size"
      raise InvalidValueError(f"{key}={n} does not divide evenly over {devices} devices; "
                              f"set --config.{fix} to a multiple of "
                              f"{devices * (grad_accum_steps if fix == 'batch_size' else 1)}")


def bn_num_groups(bn_group_size: int, mesh: Mesh) -> int:
  """`config.bn_group_size` (devices per BN group, the config's unit) -> the model's
  `bn_num_groups` (chunks of the global batch, what BatchNorm splits by); 0 = one group."""
  devices = batch_devices(mesh)
  if not bn_group_size:
    return 1
  # A group larger than the mesh (e.g. a 16-device recipe run on 8) cannot be
  # formed; silently falling back to global statistics would change the recipe.
  if bn_group_size < 0 or devices % bn_group_size:
    raise InvalidValueError(f"bn_group_size={bn_group_size} does not divide the {devices} devices "
                            f"of the mesh; use a divisor of {devices}, or 0 for statistics over the "
                            f"global batch")
  return devices // bn_group_size


def abstract(tree, shardings):
  """ShapeDtypeStructs with shardings: e.g. a restore target that allocates nothing."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def to_global(local_batch: dict, sharding: NamedSharding) -> dict:
  """This process's numpy batch -> global jax.Arrays sharded over the mesh's devices."""
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}


# --- FSDP --------------------------------------------------------------------------------

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
    if self.fsdp == 1:
      return (f"FSDP is on, but over 1 device it splits nothing: the whole train state "
              f"({gib(self.total_bytes)}) is on the device, as without FSDP")
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


# --- several processes ------------------------------------------------------------

def sync_processes(name: str, timeout_s: int = 3600) -> None:
  """Blocks until every process has reached this point (a no-op in one process).

  A barrier of jax.distributed's coordination service (through orbax's), not a device
  collective: it waits as long as `timeout_s`, whereas jax's CPU (gloo) collectives give
  up when the processes reach their first all-reduce more than ~30 s apart (e.g. because
  one of them compiled the step slower). Naming the processes is what makes orbax use
  the coordination service; without them it would run a device collective.
  """
  if jax.process_count() == 1:
    return
  from orbax.checkpoint import multihost
  sync_processes.count = getattr(sync_processes, "count", 0) + 1  # a barrier name must not repeat
  multihost.sync_global_processes(f"jaxnet_{sync_processes.count}_{name}", timeout=timeout_s,
                                  processes=set(range(jax.process_count())))


def any_process(flag: bool) -> bool:
  """Whether `flag` is true in any process (every process must call this at the same point)."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils
  return bool(np.any(multihost_utils.process_allgather(np.array(bool(flag)))))


def compile_then_sync(jitted, args, name: str) -> None:
  """Multi-process runs: compile `jitted` for `args` now, then wait for every process.

  The first execution of a step is the processes' first collective; jax's CPU (gloo)
  collectives fail if the processes arrive more than ~30 s apart, as a slower compile on
  one host makes them. Compiled here, the call that follows hits jit's cache.
  """
  if jax.process_count() > 1:
    jitted.lower(*args).compile()
    sync_processes(name)
