"""Half-written and damaged checkpoints on disk: a failed save's temporary directories
removed, checkpoints that do not verify moved aside.

Plain file operations on WORKDIR/checkpoints, beside orbax's manager: `jaxnet.checkpoint`
decides when (and reloads its manager after a move).
"""

import glob
import os
import shutil
import time

DAMAGED_DIR = "checkpoints_damaged"


def remove_partials(directory: str, step: int, settle_sec: float = 0.0) -> None:
  """Removes a failed save's temporary directories of `step` in `directory`.

  The first failed write ends orbax's save, but tensorstore's writes of the other
  arrays may still land afterwards and recreate the directory. With `settle_sec`,
  keeps removing until it has stayed absent that long (at most 20 times as long).
  """
  pattern = os.path.join(directory, f"{step}.orbax-checkpoint-tmp*")
  deadline, absent_since = time.monotonic() + 20 * settle_sec, None
  while True:
    partials = glob.glob(pattern)
    for partial in partials:
      shutil.rmtree(partial, ignore_errors=True)
    now = time.monotonic()
    if partials or absent_since is None:
      absent_since = now
    if now - absent_since >= settle_sec or now > deadline:
      return
    time.sleep(settle_sec / 5)


def set_aside(workdir: str, directory: str, steps) -> None:
  """Moves the checkpoints `steps` from `directory` to WORKDIR/checkpoints_damaged/STEP-TIME
  (so a resumed run can save those steps again), saying where each went."""
  target = os.path.join(workdir, DAMAGED_DIR)
  os.makedirs(target, exist_ok=True)
  stamp = time.strftime("%Y%m%d-%H%M%S")
  for step in steps:
    destination = os.path.join(target, f"{step}-{stamp}")
    os.replace(os.path.join(directory, str(step)), destination)
    print(f"moved damaged checkpoint {step} to {destination}", flush=True)
