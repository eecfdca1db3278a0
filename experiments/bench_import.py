"""What a weights import costs: `python -m jaxnet.cli.weights import` of a real-size model, timed.

  python experiments/bench_import.py [--model convnext_tiny] [--classes 1000] [--repeats 1]
      [--repo DIR ...] [--dir /tmp/x]

Writes a .safetensors of the model under its family's PyTorch names (torchvision's), seeded
random values (nothing downloaded), then times the import command into a new workdir, as a
user runs it: a new process, with an empty XLA compilation cache (cold: what a first import
costs) and again with the cache it left (warm). `--classes` other than 1000 imports into a
model of that class count (the class layer freshly initialised). `--repo` times the command of
another checkout too (e.g. the code before a change), alternating with this one's so both see
the same load. Prints each time with the hardware, versions and load it ran under.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_weights(model: str, path: str) -> int:
  """A torchvision-named file of `model`'s 1000-class variables (seeded); returns its tensor count."""
  import jax
  import numpy as np
  from flax.traverse_util import flatten_dict
  from jaxnet.core import models
  from jaxnet.tools.weights import pretrained, tensor_files
  module = models.create(model, num_classes=1000)
  abstract = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), np.zeros((1, 224, 224, 3), np.float32),
                                                train=False))
  rng = np.random.default_rng(0)
  flat = {p: (rng.standard_normal(x.shape) * 0.02).astype(np.float32) for p, x in flatten_dict(abstract).items()}
  flat.update({p: np.abs(v) + 1 for p, v in flat.items() if p[0] == "batch_stats" and p[-1] == "var"})
  tensors = pretrained.names_of(model).to_torch(flat)
  tensor_files.write(path, tensors, {})
  return len(tensors)


def config_of(model: str) -> str:
  if model.startswith("convnext_"):
    return f"convnext:{model.removeprefix('convnext_')}"
  if model == "resnet50":
    return "resnet50"
  raise SystemExit(f"bench_import times convnext_* and resnet50 (a recipe each), not {model}")


def timed_import(repo: str, weights: str, config: str, classes: int, workdir: str, cache: str) -> float:
  command = [sys.executable, "-m", "jaxnet.cli.weights", "import", f"--from={weights}", f"--config={config}",
             f"--workdir={workdir}", "--config.data.source=synthetic", f"--config.data.num_classes={classes}"]
  start = time.perf_counter()
  subprocess.run(command, cwd=repo, check=True, capture_output=True,
                 env={**os.environ, "JAXNET_COMPILATION_CACHE": cache})
  return time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="convnext_tiny")
  parser.add_argument("--classes", type=int, default=1000)
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--repo", action="append", default=[], help="another checkout to time as well")
  parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
  args = parser.parse_args()
  repos = [HERE] + [os.path.abspath(r) for r in args.repo]
  with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
    weights = os.path.join(tmp, f"{args.model}.safetensors")
    count = write_weights(args.model, weights)
    times = {(r, kind): [] for r in repos for kind in ("cold", "warm")}
    loads = []
    for n in range(args.repeats):
      for i, repo in enumerate(repos):
        cache = os.path.join(tmp, f"cache{i}-{n}")
        for kind in ("cold", "warm"):
          loads.append(os.getloadavg()[0])
          workdir = os.path.join(tmp, f"w{i}-{n}-{kind}")
          times[(repo, kind)].append(timed_import(repo, weights, config_of(args.model), args.classes, workdir, cache))
  print(benchlib.cpu_line())
  print(benchlib.versions_line("orbax-checkpoint"))
  print(benchlib.date_line(), f"| load average (1 min) {min(loads):.1f}-{max(loads):.1f} during the imports")
  print(f"\n{args.model}: {count} tensors into a {args.classes}-class model, {args.repeats} import(s) each")
  print(f"{'checkout':<40} {'cold cache (s)':>15} {'warm cache (s)':>15}")
  for repo in repos:
    print(f"{repo:<40} {benchlib.median(times[(repo, 'cold')]):>15.1f} {benchlib.median(times[(repo, 'warm')]):>15.1f}")


if __name__ == "__main__":
  main()
