"""Write tests/data/workdir_<rev>_retinanet: a detection workdir made by the checked-out jaxnet,
for tests/test_detection.py's test_a_detection_workdir_written_by_an_earlier_jaxnet_*, which
restores, evaluates, resumes and predicts with it on every later commit (an old workdir must
stay readable, as tests/data/workdir_ab264ba holds for a classifier).

    cd REPO && python tests/make_workdir_fixture.py   # a clean checkout; about a minute on 2 cores

What it trains: configs/retinanet.py:shapes on the generated shapes data (make_shapes with
TRAIN_IMAGES, VAL_IMAGES and SEED below; the test regenerates the same folder from them) for
STEPS steps on 8 simulated CPU devices, with the model made as small as its options allow
(OVERRIDES), so that its one checkpoint is small enough to commit. It keeps that one
checkpoint and the run's records (config.json, classes.json, metrics.jsonl with the final
eval, environment.json, data_identity.json, config_file.py); the lock is left out.

The name carries the commit the workdir was written at (`git rev-parse --short HEAD`): a
checkout with uncommitted changes is refused, since such a workdir was made by no commit.
"""

import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

# The data: the test regenerates it with these (make_shapes is deterministic in its seed).
TRAIN_IMAGES, VAL_IMAGES, SEED = 48, 16, 0
STEPS = 30
# The smallest model the shapes recipe's options make (a width-4 backbone, a 16-channel
# pyramid, one head convolution): its checkpoint (parameters and AdamW's two moments) is the
# fixture's bulk. 64-pixel images keep the test's eval and resume quick. The learning rate is
# ten times the recipe's, so that STEPS steps lift some scores past the detection threshold
# (0.05; the recipe's rate left none after 12 steps: mAP 0, which would check nothing).
OVERRIDES = ("model.width=4", "optim.learning_rate=0.02", "model.fpn_channels=16", "model.head_convs=1", "image_size=64",
             "batch_size=16", f"total_steps={STEPS}", f"checkpoint_every_steps={STEPS}", "keep_checkpoints=1",
             "log_every_steps=4", "eval_every_steps=0", "data.eval_batch_size=8")
CONFIG = "configs/retinanet.py:shapes"
# The run's records worth keeping (anything else it wrote, e.g. the lock, is left out).
KEEP = ("checkpoints", "config.json", "classes.json", "metrics.jsonl", "environment.json",
        "data_identity.json", "config_file.py")


def main() -> int:
  from jaxnet.tools.make_shapes import make_shapes
  git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
  if git("status", "--porcelain", "--untracked-files=no"):
    print("error: the checkout has uncommitted changes: commit them (the fixture is named after its commit)",
          file=sys.stderr)
    return 1
  out = os.path.join(REPO, "tests", "data", f"workdir_{git('rev-parse', '--short', 'HEAD')}_retinanet")
  if os.path.exists(out):
    print(f"error: {out} exists: remove it to write it again", file=sys.stderr)
    return 1
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()}
  with tempfile.TemporaryDirectory() as tmp:
    data = make_shapes(os.path.join(tmp, "shapes"), TRAIN_IMAGES, VAL_IMAGES, seed=SEED, verbose=False)
    workdir = os.path.join(tmp, "w")
    subprocess.run([sys.executable, "-m", "jaxnet.main", f"--config={CONFIG}", f"--workdir={workdir}",
                    f"--config.data.dir={data}", *[f"--config.{o}" for o in OVERRIDES]],
                   cwd=REPO, env=env, check=True)
    os.makedirs(out)
    for name in KEEP:
      path = os.path.join(workdir, name)
      (shutil.copytree if os.path.isdir(path) else shutil.copy)(path, os.path.join(out, name))
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
