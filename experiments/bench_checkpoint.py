"""What verified checkpoints cost: checksums + finiteness check, save, and verified restore.

  python experiments/bench_checkpoint.py [--model resnet50] [--repeats 3] [--dir /tmp/x]

Builds the model's full train state (params, BN statistics, SGD momentum, EMA copy:
~300 MB for ResNet-50), then times, on this machine's default jax device:
  inspect   the pass that checks all floats are finite and checksums every array (numpy on
            the host where the state is in host memory, a CPU's; one jitted pass on a GPU)
  save      Checkpoints.save + wait (synchronous write), which includes `inspect`
  restore   Checkpoints.restore, which reads, then recomputes and compares the checksums
Prints a table with the hardware and versions it ran on.
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="resnet50")
  parser.add_argument("--image-size", type=int, default=224)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
  args = parser.parse_args()

  import jax
  import numpy as np
  from jaxnet.core import checkpoint as ckpt
  from jaxnet.core import checkpoint as integrity
  from jaxnet.core import optim
  from jaxnet.core import sharding as parallel
  from jaxnet.core.config import base_config
  from jaxnet.core.models import create
  from jaxnet.core.state import init_state

  config = base_config()
  model = create(args.model, num_classes=1000)
  tx = optim.make_optimizer(config.optim, optim.learning_rate_schedule(config.optim, 256, 1000, 100))
  init = lambda: init_state(model, tx, (args.image_size, args.image_size, 3), 0, config.loss_scale)
  mesh = parallel.make_mesh(0)
  state = jax.jit(init, out_shardings=parallel.replicated(mesh))()
  state = jax.block_until_ready(state)
  megabytes = sum(x.nbytes for x in jax.tree.leaves(state)) / 1e6
  abstract = parallel.abstract(state, jax.tree.map(lambda x: x.sharding, state))

  def timed(fn):
    times = []
    for _ in range(args.repeats):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
    return benchlib.median(times)

  integrity.inspect(state)  # compile once
  inspect_s = timed(lambda: integrity.inspect(state))
  with tempfile.TemporaryDirectory(dir=args.dir) as workdir:
    checkpoints = ckpt.Checkpoints(workdir, keep=1, async_save=False)
    step = iter(range(1, 1000))

    def save():
      checkpoints.save(next(step), state, b"{}", {})
      checkpoints.wait()
    save_s = timed(save)
    latest = checkpoints.steps()[-1]
    checkpoints.restore(latest, abstract)  # compile once
    restore_s = timed(lambda: jax.block_until_ready(checkpoints.restore(latest, abstract)))
    checkpoints.close()

  print(benchlib.cpu_line())
  print("device:", jax.devices()[0].device_kind, f"({jax.default_backend()}, {jax.device_count()} devices)")
  print(benchlib.versions_line("orbax-checkpoint"))
  print(benchlib.date_line(), "|", benchlib.load_line())
  print(f"\n{args.model} train state: {megabytes:.0f} MB in {len(jax.tree.leaves(state))} arrays; "
        f"median of {args.repeats}\n")
  print("| what | seconds | MB/s |")
  print("| --- | ---: | ---: |")
  for name, seconds in (("inspect (finite check + checksums)", inspect_s),
                        ("save (inspect + write, synchronous)", save_s),
                        ("restore (read + verify checksums)", restore_s)):
    print(f"| {name} | {seconds:.3f} | {megabytes / seconds:,.0f} |")
  print(f"\nchecksums are {100 * inspect_s / save_s:.0f}% of a synchronous save "
        f"(async saves overlap the write with training; the inspect pass does not overlap)")
  return 0 if np.isfinite(save_s) else 1


if __name__ == "__main__":
  sys.exit(main())
