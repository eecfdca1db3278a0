"""Is a train state whole and finite? Checksums of every array, and the non-finite checks.

A checkpoint carries a checksum of each array, computed on the device at save time in
the same jitted pass that checks the state is finite; a restore recomputes them. The
run's loss and gradient norm are checked at log steps and saves (no host sync per step).
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxnet.errors import DIVERGED_HINT, NonFiniteError, UserError

CHECKSUM_ALGORITHM = "jaxnet-fmix32-sum-v1"


class DamagedCheckpointError(UserError):
  """A checkpoint failed verification, could not be read, or is incomplete."""

  def __init__(self, step, directory, reason):
    self.step, self.reason = step, reason
    super().__init__(f"checkpoint {step} in {directory} is damaged: {reason}")


def leaf_name(path) -> str:
  """'params/stem_conv/kernel' for a pytree path, whether the node is a dict or a dataclass."""
  parts = []
  for key in path:
    for attr in ("key", "name", "idx"):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
    else:
      parts.append(str(key))
  return "/".join(parts)


def _words(x):
  """The array's bits as uint32 words (16- and 8-bit types widened), flattened."""
  x = jnp.asarray(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32).ravel()
  bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
  return jax.lax.bitcast_convert_type(x, bits).astype(jnp.uint32).ravel()


def _fmix32(h):
  # MurmurHash3's finalizer: every input bit affects every output bit.
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _checksum(x):
  # A sum (mod 2**32) of position-salted hashes: any changed word changes the
  # sum except with probability 2**-32, and the sum is order-free, so XLA can
  # compute it as one parallel reduction.
  words = _words(x)
  salt = jnp.arange(words.size, dtype=jnp.uint32) * jnp.uint32(0x9E3779B9)
  return jnp.sum(_fmix32(words ^ salt), dtype=jnp.uint32)


@jax.jit
def _inspect(tree):
  leaves = jax.tree.leaves(tree)
  finite = [jnp.all(jnp.isfinite(x)) for x in leaves if jnp.issubdtype(x.dtype, jnp.inexact)]
  all_finite = jnp.all(jnp.stack(finite)) if finite else jnp.bool_(True)
  return all_finite, jnp.stack([_checksum(x) for x in leaves])


def inspect(tree) -> tuple[bool, dict, list[str]]:
  """(all floats finite, {leaf name: checksum}, names of non-finite leaves) of a pytree."""
  paths = [leaf_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
  all_finite, sums = jax.device_get(_inspect(tree))
  checksums = {name: f"{int(s):08x}" for name, s in zip(paths, sums)}
  bad = []
  if not all_finite:  # rare: worth a second pass to say where
    bad = [leaf_name(p) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
           if jnp.issubdtype(x.dtype, jnp.inexact) and not bool(jnp.all(jnp.isfinite(x)))]
  return bool(all_finite), checksums, bad


def verify(tree, saved: dict, step, directory) -> None:
  """Raises DamagedCheckpointError unless `tree`'s checksums equal those saved with it."""
  if saved.get("algorithm") != CHECKSUM_ALGORITHM:
    raise DamagedCheckpointError(step, directory, f"unknown checksum algorithm {saved.get('algorithm')!r}")
  _, actual, _ = inspect(tree)
  expected = saved["leaves"]
  wrong = sorted(k for k in set(actual) | set(expected) if actual.get(k) != expected.get(k))
  if wrong:
    more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
    raise DamagedCheckpointError(step, directory, f"checksum mismatch in {', '.join(wrong[:3])}{more}")


def check_finite_state(state, step: int, intact_sentence: str) -> dict:
  """{leaf name: checksum} of `state`; NonFiniteError (naming the leaves) if any float is not finite."""
  finite, checksums, bad = inspect(state)
  if not finite:
    raise NonFiniteError(
        f"training diverged: the train state at step {step} has non-finite values "
        f"({', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}); it was not saved. "
        f"{intact_sentence} {DIVERGED_HINT}")
  return checksums


def check_finite_metrics(history: list[dict], last_step: int, intact_sentence: str, fp16: bool) -> None:
  """Stops the run at the first step of `history` whose loss or gradient norm is not finite.

  The values stay on the device until here (a log step or a save), so the check
  costs no host sync per step. fp16 runs skip steps with non-finite gradients by
  design (loss scaling), so only their loss is checked.
  """
  if not history:
    return
  values = jax.device_get([(m["train/loss"], m["train/grad_norm"]) for m in history])
  for i, (loss, grad_norm) in enumerate(values):
    if np.isfinite(loss) and (fp16 or np.isfinite(grad_norm)):
      continue
    step = last_step - len(history) + 1 + i
    raise NonFiniteError(
        f"training diverged at step {step}, the first step with a non-finite loss or gradient "
        f"(train/loss {float(loss)}, grad_norm {float(grad_norm)}); training stopped and nothing "
        f"from step {step} on was saved. "
        f"{intact_sentence} {DIVERGED_HINT}")
