"""A bundle others can load (docs/reproducibility.md): one checkpoint of a workdir with the
records that say what it is and how it was made, laid out as a workdir, so `api.restore`,
`--mode=eval`, `predict`, `export` and `verify` take it as they take the workdir:

  BUNDLE/checkpoints/STEP/   the checkpoint (orbax: arrays, JSON; per-array checksums)
  BUNDLE/config.json, classes.json, environment.json, data_identity.json, code.diff,
         config_file.py, preprocessing.json, init_weights.json, config_history.jsonl
         (those the workdir has)
  BUNDLE/metrics.jsonl       the run's records up to STEP
  BUNDLE/MODEL_CARD.md       what it is, how it was trained, its numbers, how to load it
  BUNDLE/bundle.json         the sha256 of every file above, checked when it is loaded

Nothing in a bundle is executed when it is loaded: the config comes from config.json
(config_file.py is a record, never run), and no file is a pickle.
"""

import json
import os
import shutil
import uuid

from jaxnet.core import checkpoint as ckpt
from jaxnet.core import config as config_lib
from jaxnet.core import provenance
from jaxnet.core import workdir as workdir_lib
from jaxnet.core.errors import InvalidValueError, UserError
from jaxnet.core.metrics import read_jsonl

MANIFEST, CARD = workdir_lib.BUNDLE_FILES
FORMAT = "jaxnet-bundle"
RECORDS = ("config.json", "classes.json", "environment.json", provenance.DATA_IDENTITY_FILE,
           provenance.CODE_DIFF_FILE, provenance.CONFIG_TEXT_FILE, "preprocessing.json",
           provenance.INIT_WEIGHTS_FILE, workdir_lib.HISTORY_FILE)


class BundleError(InvalidValueError):
  pass


def _files(folder: str) -> list[str]:
  """Every file under `folder`, relative to it, sorted."""
  found = []
  for parent, _, names in os.walk(folder):
    found += [os.path.relpath(os.path.join(parent, n), folder) for n in names]
  return sorted(found)


def write_bundle(workdir: str, out: str, step: int | None = None) -> dict:
  """Writes the bundle of WORKDIR's checkpoint `step` (default: the newest) to the new
  folder `out` (whole or not at all); returns its manifest. The checkpoint is read and its
  checksums checked first: a damaged one is refused, not bundled."""
  if not os.path.isfile(os.path.join(workdir, "config.json")):
    raise UserError(f"{workdir} is not a trained jaxnet workdir (no config.json): give the --workdir of a training run")
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise UserError(f"{out} exists and is not an empty folder: a bundle is written into a new folder")
  step = ckpt.load_arrays(workdir, step)[1]  # verified: every array's checksum
  parent = os.path.dirname(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  # Not mkdtemp's 0700: a bundle is made to be shared, so its folder gets the umask's mode, as
  # the files in it do.
  staging = os.path.join(parent, f".bundle-{uuid.uuid4().hex[:12]}")
  os.mkdir(staging)
  try:
    shutil.copytree(os.path.join(workdir, ckpt.CHECKPOINTS_DIR, str(step)),
                    os.path.join(staging, ckpt.CHECKPOINTS_DIR, str(step)))
    for name in RECORDS:
      if os.path.isfile(os.path.join(workdir, name)):
        shutil.copy2(os.path.join(workdir, name), os.path.join(staging, name))
    # An import has no records yet: its weights were trained elsewhere.
    logged = os.path.isfile(os.path.join(workdir, "metrics.jsonl"))
    records = [r for r in read_jsonl(workdir) if r["step"] <= step] if logged else []
    with open(os.path.join(staging, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in records)
    with open(os.path.join(staging, CARD), "w") as f:
      f.write(model_card(staging, step, records, os.path.basename(os.path.abspath(out))))
    manifest = {"format": FORMAT, "version": 1, "step": step,
                "files": {name: provenance.file_sha256(os.path.join(staging, name)) for name in _files(staging)}}
    with open(os.path.join(staging, MANIFEST), "w") as f:
      json.dump(manifest, f, indent=2)
    if os.path.isdir(out):
      os.rmdir(out)
    os.rename(staging, out)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  return manifest


def is_bundle(path: str) -> bool:
  """A bundle has its manifest; one whose manifest was deleted still has its model card."""
  return any(os.path.isfile(os.path.join(path, name)) for name in (MANIFEST, CARD))


def check_bundle(path: str) -> dict | None:
  """The manifest of the bundle at `path` (None for a workdir that is no bundle), the bundle
  being exactly what it lists: each file there with its sha256, and no other (another run's
  checkpoint copied in, an eval's records). Anything else is one line naming it; nothing
  reads or writes a bundle that does not pass."""
  if not is_bundle(path):
    return None
  where = os.path.join(path, MANIFEST)
  if not os.path.isfile(where):
    raise BundleError(f"{path} has a {CARD} but no {MANIFEST}: a bundle without its manifest cannot be "
                      f"checked. Get the bundle again")
  try:
    with open(where) as f:
      manifest = json.load(f)
    files, step = manifest["files"], manifest["step"]
    if not isinstance(files, dict) or not files or not isinstance(step, int):
      raise ValueError("its file list is empty" if isinstance(files, dict) else "no file list")
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise BundleError(f"{where} is not a bundle's manifest ({e}): get the bundle again") from None
  for name, sha in files.items():
    full = os.path.join(path, name)
    if os.path.isabs(name) or os.path.normpath(name).startswith(".."):
      raise BundleError(f"{where} names {name!r}, outside the bundle: get the bundle again")
    if not os.path.isfile(full):
      raise BundleError(f"{full} is missing from the bundle: get the bundle again")
    if provenance.file_sha256(full) != sha:
      raise BundleError(f"{full} is not the file the bundle was made with (its sha256 differs): get the bundle again")
  unlisted = [name for name in _files(path) if name != MANIFEST and name not in files]
  if unlisted:
    shown = ", ".join(unlisted[:3]) + (f" (+{len(unlisted) - 3} more)" if len(unlisted) > 3 else "")
    raise BundleError(f"{path} holds files its {MANIFEST} does not list: {shown}. A bundle is exactly its "
                      f"manifest: remove them, or get the bundle again")
  if not any(n.startswith(f"{ckpt.CHECKPOINTS_DIR}/{step}/") for n in files):
    raise BundleError(f"{where} lists no checkpoint of its step {step}: get the bundle again")
  return manifest


# --- the model card -------------------------------------------------------------------------

def _read(folder: str, name: str) -> dict:
  try:
    with open(os.path.join(folder, name)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def model_card(folder: str, step: int, records: list[dict], name: str) -> str:
  """MODEL_CARD.md: what the model is, how it was trained, its measured numbers (the eval
  recorded at the bundled step), what made it, and how to load and check it."""
  config = config_lib.from_json(os.path.join(folder, "config.json"))
  classes, env = _read(folder, "classes.json"), _read(folder, "environment.json")
  identity = _read(folder, provenance.DATA_IDENTITY_FILE)
  evals = [r for r in records if r["step"] == step and any(k.startswith("eval/") for k in r)]
  numbers = "\n".join(f"| `{k}` | {v:.6g} |" if isinstance(v, float) else f"| `{k}` | {v} |"
                      for k, v in sorted((evals[-1] if evals else {}).items()) if k.startswith("eval/"))
  data = "\n".join(f"- {split}: " + ", ".join(f"{k} {_shown(v)}" for k, v in ident.items())
                   for split, ident in sorted(identity.items())) or "- (not recorded)"
  packages = ", ".join(f"{k} {v}" for k, v in sorted(env.get("packages", {}).items())) or "(not recorded)"
  return f"""# {name}: {config.model.name} on {config_lib.data_name(config)}

A jaxnet bundle: the checkpoint of step {step} of a training run, with its config and the
records of what made it. Made by `python -m jaxnet.cli.export --format=bundle`.

## What it is

- model: `{config.model.name}`, {classes.get("num_classes", "?")} classes{_class_names(classes)}
- input: {config.image_size}x{config.image_size} images, {len(config.data.mean)} channel(s), normalised with mean {tuple(config.data.mean)} and std {tuple(config.data.std)} inside the model
- precision: {config.precision}{"; the EMA of the params (decay " + str(config.ema_decay) + ")" if config.ema_decay > 0 else ""}

## How it was trained

- data: `data.source={config.data.source}`, its identity (data_identity.json):
{data}
- {_length(env, config, step)}
- on {env.get("device_count", "?")} {env.get("device_kind", "?")} device(s), {env.get("process_count", "?")} process(es), Python {env.get("python", "?")}
- packages: {packages}
- code: jaxnet {env.get("jaxnet", "?")}, git revision {env.get("git_revision") or "(none)"}{", with the uncommitted changes in code.diff" if env.get("code_diff_sha256") else ""}
- the config: config.json (every key); the file it was run from: config_file.py

## Its numbers

The eval recorded at step {step} (metrics.jsonl holds the run's records up to it):

| metric | value |
| --- | --- |
{numbers or "| (no eval recorded at this step) | |"}

## How to load it

```python
from jaxnet import api
model = api.restore("{name}")          # checks every file's sha256 (bundle.json) and every array's checksum
model.predict(["image.png"])
```

```bash
python -m jaxnet.cli.predict --workdir={name} IMAGE
python -m jaxnet.cli.verify {name}       # re-evaluates it: needs the data it was evaluated on
```

Loading runs no code from the bundle: the config is read from config.json, and no file is a pickle.
"""


def _length(env: dict, config, step: int) -> str:
  """How long it trained; weights imported without data (no run length recorded) were not trained here."""
  total = env.get("total_steps", config.total_steps)
  if total is None:
    return f"not trained here: the weights of {config.init.weights or '(not recorded)'}, imported without data; this is step {step}"
  return (f"{total} steps of a global batch of {config.batch_size}, optimizer {config.optim.name}, learning rate "
          f"{config.optim.learning_rate}, seed {config.seed}; this is step {step}")


def _class_names(classes: dict) -> str:
  names = classes.get("class_names") or []
  if not names:
    return ""
  shown = ", ".join(map(str, names[:10])) + (f", ... ({len(names)} in classes.json)" if len(names) > 10 else "")
  return f" ({shown})"


def _shown(value) -> str:
  if isinstance(value, str) and len(value) == 64:
    return value[:16] + "..."
  if isinstance(value, list) and len(value) > 6:
    return f"[{len(value)} items]"
  return str(value)
