"""The heartbeat of a multi-process run: notice a process that stopped answering, and say so
in one line.

jax's coordination service notices a dead process by its missing heartbeats, but
then terminates every other process from C++ (a check-failure stack, "Fatal
Python error: Aborted") without a word a user can act on; and with the CPU's
gloo collectives the survivors first fail at their next all-reduce, and then
wait in jax's shutdown for that same abort. So jaxnet keeps its own, shorter
heartbeat: a thread in each process writes a counter (and its step) to the
coordination service's key-value store and reads the others'. A process whose
counter has not moved for `timeout_s` is reported, with the step and the newest
intact checkpoint, and this process exits at once (status 1): a process whose
collective partner is gone cannot go on, and exiting skips jax's shutdown,
which would abort. jax's own heartbeat timeout is set to twice `timeout_s`
(process.initialize_distributed) so that this check always reports first.

The watcher counts heartbeats, not steps: a process that is busy (compiling, a
long eval, a slow save) still answers. Its thread only talks to the key-value
store, so it keeps running while the main thread waits in a collective.

Limit: when process 0, which hosts jax's coordination service, is the one that
dies, jax terminates the others from C++ the moment their connection to it
closes, before any Python code can run (jax's hook for this,
`missed_heartbeat_callback`, fails with std::bad_cast in jax 0.10 to 0.12).
"""

import os
import sys
import threading
import time

from jaxnet.core.adapters import xla

DONE = "done"  # a process that left training on purpose: not missing
_generation = [0]  # one key space per training call, so a notebook may train twice


def jax_heartbeat_timeout(timeout_s: float) -> int:
  """jax's heartbeat timeout for jaxnet's `timeout_s`: long enough that jaxnet reports first."""
  return max(2, int(2 * timeout_s))


class PeerWatch:
  """A context manager around training. `run` (a jaxnet.core.train.RunControl, or anything
  with `step` and `checkpoint_sentence()`) says where the loop is, for the message. With one
  process it watches nothing."""

  def __init__(self, timeout_s: float, run, exit_on_loss=None):
    self.timeout_s = float(timeout_s)
    self.interval_s = max(0.2, min(self.timeout_s / 10, 5.0))
    self.run = run
    self._exit = exit_on_loss or _print_and_exit
    self._client = None
    self._stopped = threading.Event()
    self._threads = []

  # -- life cycle ---------------------------------------------------------------

  def __enter__(self):
    import jax
    if jax.process_count() == 1 or self.timeout_s <= 0:
      return self
    client = xla.distributed_client()
    if client is not None:
      self.start(client, jax.process_index(), jax.process_count())
    return self

  def start(self, client, process_index: int, process_count: int) -> None:
    """Starts the two threads, with jax's distributed client (or a stand-in, in tests)."""
    self._client = client
    _generation[0] += 1
    self._me, self._count = process_index, process_count
    self._prefix = f"jaxnet/peers/{_generation[0]}/"
    now = time.monotonic()
    self._values = {}                                    # process -> its last value
    self._changed = {p: now for p in range(self._count)}  # process -> when it last moved
    self._reached_service = now
    self._threads = [threading.Thread(target=self._beat, name="jaxnet-peers-beat", daemon=True),
                     threading.Thread(target=self._check, name="jaxnet-peers-check", daemon=True)]
    for t in self._threads:
      t.start()

  def __exit__(self, *exc):
    if self._client is None:
      return
    self._stopped.set()
    try:
      self._client.key_value_set(self._prefix + str(self._me), DONE, allow_overwrite=True)
    except Exception:  # the service is gone: nobody is left to tell
      pass

  @property
  def active(self) -> bool:
    return self._client is not None

  def wait_for_verdict(self, error: BaseException) -> None:
    """After `error` in the main thread: if it looks like a collective whose partner is gone,
    gives the watcher time to name the process that stopped answering (it then exits).
    Returns at once for other errors, and after the wait if no process was missing."""
    if self.active and xla.is_runtime_failure(error):
      time.sleep(self.timeout_s + 3 * self.interval_s)

  # -- the two threads ----------------------------------------------------------

  def _beat(self):
    """Writes this process's counter and reads everyone's, every interval."""
    beat = 0
    while not self._stopped.is_set():
      beat += 1
      try:
        self._client.key_value_set(self._prefix + str(self._me), f"{beat}:{self.run.step}",
                                   allow_overwrite=True)
        entries = self._client.key_value_dir_get(self._prefix)
      except Exception:  # the coordination service did not answer: _check decides
        self._stopped.wait(self.interval_s)
        continue
      now = time.monotonic()
      self._reached_service = now
      for key, value in entries:
        process = int(key.rsplit("/", 1)[-1])
        if self._values.get(process) != value:
          self._values[process], self._changed[process] = value, now
      self._stopped.wait(self.interval_s)

  def _check(self):
    """Reports the first process whose counter has not moved for timeout_s."""
    while not self._stopped.wait(self.interval_s):
      now = time.monotonic()
      if now - self._reached_service > self.timeout_s:
        lost = 0  # the service lives in process 0
      else:
        late = [p for p in range(self._count) if p != self._me and self._values.get(p) != DONE
                and now - self._changed[p] > self.timeout_s]
        if not late:
          continue
        lost = late[0]
      if not self._stopped.is_set():
        self._exit(self.message(lost))  # os._exit, outside tests
      return

  def message(self, lost: int) -> str:
    # The step this process reached (what it printed last), and the lost one's last word.
    value = self._values.get(lost, "")
    their_step = value.split(":", 1)[1] if ":" in value else "None"
    step = self.run.step
    where = f"at step {step}" if step is not None else "before training started"
    if their_step not in ("None", str(step)):
      where += f" (its last heartbeat was at step {their_step})"
    return (f"process {lost} of {self._count} stopped answering (no heartbeat for "
            f"{self.timeout_s:g} s) {where}. {self.run.checkpoint_sentence()} "
            f"Rerun all processes to resume.")


def _print_and_exit(message: str) -> None:
  # Exits from the watcher thread: the main thread may be blocked in a collective
  # that will never complete, and a normal exit would run jax's shutdown, which aborts.
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(1)
