"""A jax.profiler trace of a few training steps, for TensorBoard's profile plugin.

`config.profile_steps = (first, last)` traces steps first..last (1-based,
inclusive) into WORKDIR/tensorboard/plugins/profile/, each step annotated with
`jax.profiler.StepTraceAnnotation`, so the profile plugin shows per-step times.
View it with `tensorboard --logdir WORKDIR/tensorboard` (Profile tab; needs the
`tensorboard-plugin-profile` package). Steps before `first` are left out, so
compilation and warm-up do not fill the trace.
"""

import contextlib
import os

import jax


class StepProfiler:
  def __init__(self, steps, logdir: str, enabled: bool = True):
    self.first, self.last = (tuple(steps) + (0, 0))[:2] if steps else (0, 0)
    self.logdir, self.enabled = logdir, enabled and bool(steps)
    self._tracing = False

  @contextlib.contextmanager
  def step(self, step: int, state_to_wait_for=None):
    """Wraps the call that runs `step` (1-based); yields a list to put the new state in."""
    if not self.enabled or not self.first <= step <= self.last:
      yield []
      return
    if not self._tracing:
      os.makedirs(self.logdir, exist_ok=True)
      jax.profiler.start_trace(self.logdir)
      self._tracing = True
    out = []
    with jax.profiler.StepTraceAnnotation("train", step_num=step):
      yield out
      jax.block_until_ready(out)  # the step's device work belongs inside its annotation
    if step == self.last:
      self.stop()
      print(f"profile of steps {self.first}-{self.last} written to {self.logdir}/plugins/profile "
            f"(tensorboard --logdir {self.logdir}, Profile tab)", flush=True)

  def stop(self) -> None:
    if self._tracing:
      jax.profiler.stop_trace()
      self._tracing = False
