"""What made a run, recorded at its start and checked when it is resumed or evaluated:
the data's identity per split (data_identity.json), the package versions, XLA flags and
devices the numbers depend on (environment.json), and the code (jaxnet's version, its git
revision, the diff of uncommitted changes in code.diff, the config file's text).

Each data source says what it is (`source.identity()`, next to the source's own code): a
dict of JSON values that changes when the examples change and not when they move (no
absolute paths). This module compares identities and environments; it writes nothing
(the workdir's gate, jaxnet/core/workdir.py, does).
"""

import hashlib
import importlib.metadata
import os
import subprocess
import sys

from jaxnet.core.errors import UserError

DATA_IDENTITY_FILE = "data_identity.json"
CODE_DIFF_FILE = "code.diff"
CONFIG_TEXT_FILE = "config_file.py"
# The init.weights file a run started from ({"weights", "path", "sha256"}): not in the
# workdir, yet a --retrain reads it again (jaxnet/tools/verify.py checks it first).
INIT_WEIGHTS_FILE = "init_weights.json"
# The name that accepts a change of the data's identity, as a config key's name accepts its
# change (--accept_config_changes=data_identity, or "all").
ACCEPT_DATA = "data_identity"

# The distributions a run's numbers depend on: the compiler and its runtime (jaxlib and the
# CUDA plugin), the model and optimizer code, the checkpoint format, the input pipeline and
# the array libraries under them. Those not installed are left out.
PACKAGES = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin",
            "jax-cuda13-pjrt", "flax", "optax", "orbax-checkpoint", "grain", "grain-nightly",
            "numpy", "tensorstore", "ml_dtypes", "ml-collections", "pillow", "scikit-learn",
            "tensorflow-datasets", "array-record", "opencv-python-headless", "pycocotools")
# A different version of these, or another device kind, can change the numbers: a resume
# or an eval says so.
WARN_IF_CHANGED = ("jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin")


# The config keys the tasks make their sources from (their make_source): an accepted change of
# one of these (another data.dir, image_size for the generated digits) accepts the change of
# the data's identity it makes. A task adds its own (Task.source_keys: detection.*).
SOURCE_KEYS = ("data.", "image_size")


class DataChangedError(UserError):
  pass


def makes_the_sources(config_key: str) -> bool:
  from jaxnet.core import tasks
  keys = SOURCE_KEYS + tuple(k for task in tasks.all_tasks() for k in task.source_keys)
  return any(config_key == k or (k.endswith(".") and config_key.startswith(k)) for k in keys)


# --- the data ------------------------------------------------------------------------

def sha256_lines(lines) -> str:
  """The sha256 of the lines, each ended by a newline (a listing's digest)."""
  text = "".join(f"{line}\n" for line in lines)  # one update: 1.28M small ones cost seconds
  return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def text_sha256(text: str) -> str:
  return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


# The records besides config.json that decide what a workdir's model is: their sha256 is
# recorded in environment.json when the start writes them (config.json is compared with the
# config each checkpoint carries; code.diff with code_diff_sha256).
DIGESTED_RECORDS = ("classes.json", CONFIG_TEXT_FILE)


def records_sha256(workdir: str, written: dict) -> dict:
  """{name: sha256} of the DIGESTED_RECORDS: `written` ({name: text}, about to be written) or
  the file WORKDIR holds; a record the workdir lacks is left out (its absence is recorded)."""
  digests = {}
  for name in DIGESTED_RECORDS:
    if name in written:
      digests[name] = text_sha256(written[name])
    elif os.path.isfile(os.path.join(workdir, name)):
      digests[name] = file_sha256(os.path.join(workdir, name))
  return digests


# How a folder of files is identified (config.data.identity): by its listing (each file's
# relative path and size: a stat per file, no byte read), and also by SAMPLE_BLOCKS blocks of
# each file (its start, middle and end: new pixels in a JPEG of the same size change them), or
# by every byte of every file. Each kind's digest is named KIND_sha256 in the identity.
IDENTITY_KINDS = ("listing", "sampled", "content")
SAMPLE_BLOCKS, SAMPLE_BYTES = 3, 4096


def kind_of(identity: dict) -> str:
  """Which of IDENTITY_KINDS an identity was taken as (the strongest digest it holds)."""
  return next((k for k in ("content", "sampled") if f"{k}_sha256" in identity), "listing")


def files_sha256(paths, names, kind: str) -> str:
  """The digest of the files (`paths`, named `names` in the record: relative paths) by `kind`:
  "content" hashes every byte, "sampled" SAMPLE_BLOCKS blocks of SAMPLE_BYTES and the size."""
  lines = []
  for path, name in sorted(zip(paths, names), key=lambda pair: pair[1]):
    if kind == "content":
      lines.append(f"{name}\t{file_sha256(path)}")
      continue
    digest = hashlib.sha256()
    with open(path, "rb") as f:
      size = os.fstat(f.fileno()).st_size
      for start in sorted({0, max(size // 2 - SAMPLE_BYTES // 2, 0), max(size - SAMPLE_BYTES, 0)}):
        f.seek(start)
        digest.update(f.read(SAMPLE_BYTES))
    lines.append(f"{name}\t{size}\t{digest.hexdigest()}")
  return sha256_lines(lines)


def identity_of(source, kind: str = "listing") -> dict:
  """`source.identity()` (`identity(kind)` where the source reads files and `kind` asks for
  more than their listing), or what little can be said of a source without one (a user's own)."""
  if not hasattr(source, "identity"):
    return {"source": type(source).__name__, "examples": len(source)}
  if kind != "listing" and getattr(source, "IDENTITY_KINDS", ("listing",)) != ("listing",):
    return source.identity(kind)
  return source.identity()


def data_identity(splits: dict, kind: str = "listing", recorded: dict | None = None) -> dict:
  """{split: identity} of the sources given as {split: source} (None sources left out), each
  taken as `kind`, or, for a split `recorded` holds, as the kind it was recorded with."""
  recorded = recorded or {}
  kinds = {split: kind_of(recorded[split]) if split in recorded else kind for split in splits}
  return {split: identity_of(source, kinds[split]) if kinds[split] != "listing" else identity_of(source)
          for split, source in splits.items() if source is not None}


def identity_changes(recorded: dict, now: dict) -> dict:
  """{"split.key": (recorded, now)} for each key of the splits both sides have that differs."""
  changes = {}
  for split in sorted(set(recorded) & set(now)):
    old, new = recorded[split], now[split]
    for key in sorted(set(old) | set(new)):
      if old.get(key) != new.get(key):
        changes[f"{split}.{key}"] = (old.get(key), new.get(key))
  return changes


def check_identity(workdir: str, recorded: dict | None, now: dict, accept: tuple) -> dict:
  """The changes of the data's identity from the recorded one (none where nothing was
  recorded: a workdir older than the record). Raises DataChangedError in one line naming
  them unless ACCEPT_DATA (or "all") is in `accept`; returns the accepted ones."""
  changes = identity_changes(recorded or {}, now)
  if changes and ACCEPT_DATA not in accept and "all" not in accept:
    raise DataChangedError(
        f"the data differs from the data {workdir} was made with ({describe_changes(changes)}): "
        f"use that data, or accept the change with --accept_config_changes={ACCEPT_DATA}")
  return changes


def check_record(workdir: str, problem: str, accept: tuple) -> dict:
  """For a data_identity.json that is `problem` ("missing", "unreadable"): the data cannot be
  checked, so DataChangedError in one line unless ACCEPT_DATA (or "all") is in `accept`, which
  takes this run's data as the record; returns that accepted change."""
  if ACCEPT_DATA not in accept and "all" not in accept:
    raise DataChangedError(
        f"{os.path.join(workdir, DATA_IDENTITY_FILE)} is {problem}: this data cannot be checked against the "
        f"data the run was made with. Put the record back, or take this data as the run's with "
        f"--accept_config_changes={ACCEPT_DATA}")
  return {DATA_IDENTITY_FILE: (problem, "this run's data")}


def describe_changes(changes: dict) -> str:
  return "; ".join(f"{key} {_short(a)} -> {_short(b)}" for key, (a, b) in changes.items())


def _short(value) -> str:
  """A digest shown by its first 12 characters, a long list by its length."""
  if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
    return value[:12]
  if isinstance(value, list) and len(value) > 5:
    return f"[{len(value)} items]"
  return repr(value)


# --- the environment and the code ------------------------------------------------------

def package_versions() -> dict:
  """{distribution: version} of PACKAGES that are installed."""
  versions = {}
  for name in PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return versions


def _git(*args, cwd: str | None = None) -> str | None:
  """A git command's output in the checkout jaxnet is imported from; None where there is
  none (an installed wheel) or git is missing."""
  try:
    proc = subprocess.run(["git", *args], capture_output=True, text=True, timeout=20,
                          cwd=cwd or os.path.dirname(os.path.abspath(__file__)))
  except (OSError, subprocess.SubprocessError):
    return None
  return proc.stdout if proc.returncode == 0 else None


def code_state() -> dict:
  """jaxnet's version, its git revision ("" outside a checkout) and the diff of uncommitted
  changes to tracked files ("" for a clean tree): what the code was."""
  import jaxnet
  revision = (_git("rev-parse", "HEAD") or "").strip()
  diff = ""
  if revision:
    top = (_git("rev-parse", "--show-toplevel") or "").strip()
    diff = (_git("diff", "HEAD", "--no-color", cwd=top) or "") + _untracked_sources(top)
  return {"jaxnet": jaxnet.__version__, "git_revision": revision, "diff": diff}


# Where a new file changes what runs: the package and the recipes.
_SOURCE_FOLDERS = ("jaxnet", "configs")


def _untracked_sources(top: str) -> str:
  """New (untracked, not ignored) .py files of the package and the recipes, as the diff
  that adds them: `git diff HEAD` leaves them out, yet they run."""
  listed = _git("ls-files", "--others", "--exclude-standard", "--", *_SOURCE_FOLDERS, cwd=top) or ""
  parts = []
  for name in sorted(n for n in listed.splitlines() if n.endswith(".py")):
    try:
      with open(os.path.join(top, name), errors="replace") as f:
        lines = f.read().splitlines()
    except OSError:
      continue
    parts.append(f"diff --git a/{name} b/{name}\nnew file (untracked)\n--- /dev/null\n+++ b/{name}\n"
                 f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines))
  return "".join(parts)


def environment() -> dict:
  """What the numbers depend on besides the config, the data and the code: the versions,
  the XLA flags in effect, the devices."""
  import jax
  devices = jax.devices()
  return {
      "python": sys.version.split()[0], "packages": package_versions(),
      "platform": jax.default_backend(), "device_kind": devices[0].device_kind,
      "device_count": len(devices), "process_count": jax.process_count(),
      "devices": [str(d) for d in devices],
      # What the process ran under (config.distributed.cluster_profile, or the user's own).
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "cluster_environment": {k: v for k, v in sorted(os.environ.items())
                              if k.startswith("NCCL_") or k == "CUDA_DEVICE_MAX_CONNECTIONS"}}


def environment_warnings(recorded: dict | None, now: dict) -> list[str]:
  """One line per difference that can change the numbers: a WARN_IF_CHANGED package's
  version, the device kind. None for a workdir without a record."""
  if not recorded:
    return []
  lines = []
  old_packages = recorded.get("packages", {})
  for name in WARN_IF_CHANGED:
    old, new = old_packages.get(name), now["packages"].get(name)
    if old and old != new:
      lines.append(f"{name} {old} made this workdir, this is {new or 'not installed'}")
  # The device count is left out: an eval on fewer or more devices of the same kind only
  # orders the float sums otherwise, and is common (verify shows it).
  old = recorded.get("device_kind")
  if old is not None and old != now["device_kind"]:
    lines.append(f"device kind {old} made this workdir, this is {now['device_kind']}")
  return lines
