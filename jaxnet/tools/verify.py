"""Verifies a workdir's numbers (docs/reproducibility.md): re-evaluates the checkpoints whose
eval it recorded and compares the metrics, and compares the data's identity, the package
versions and the code with what made the run. `retrain` re-runs its first steps into a
scratch workdir and compares the train losses with metrics.jsonl.

Each comparison is a Check (what, recorded, now, whether it holds); the command line
(jaxnet/cli/verify.py) prints them as a table. Nothing is written into the workdir.
"""

import dataclasses
import json
import math
import os
import shutil
import tempfile

from jaxnet.core import checkpoint as ckpt
from jaxnet.core import config as config_lib
from jaxnet.core import provenance, tasks
from jaxnet.core import workdir as workdir_lib
from jaxnet.core.errors import UserError
from jaxnet.core.metrics import read_jsonl

# On another device kind or count, float sums run in another order: metrics agree to this
# (an absolute tolerance, plus this fraction of the value), not bit for bit.
ABS_TOLERANCE, REL_TOLERANCE = 2e-3, 1e-3


@dataclasses.dataclass
class Check:
  """One row of the table. `holds` None: a fact shown, not a check (the device kind)."""
  what: str
  recorded: str
  now: str
  holds: bool | None
  verdict: str = ""

  def __post_init__(self):
    if not self.verdict:
      self.verdict = {True: "same", False: "DIFFERS", None: "note"}[self.holds]


def all_hold(checks: list[Check]) -> bool:
  return all(c.holds is not False for c in checks)


def open_workdir(workdir: str) -> dict:
  """The workdir's records verify reads, each {content} or None where it is missing, and
  `unreadable`: {file: why} for those that do not read (each a finding, not a traceback).
  One line naming what is missing where it is no trained workdir."""
  if not os.path.isdir(workdir):
    raise UserError(f"{workdir} is not a directory: give the workdir of a training run")
  names = ("config.json", "environment.json", "metrics.jsonl")
  missing = [name for name in names if not os.path.isfile(os.path.join(workdir, name))]
  if "config.json" in missing or "metrics.jsonl" in missing:
    raise UserError(f"{workdir} is not a trained jaxnet workdir (it lacks {', '.join(missing)}): "
                    f"give the --workdir a training run wrote")
  records, unreadable = {"metrics": read_jsonl(workdir)}, {}
  for key, name in (("environment", "environment.json"), ("data_identity", provenance.DATA_IDENTITY_FILE),
                    ("init_weights", provenance.INIT_WEIGHTS_FILE)):
    records[key], why = _read_json(os.path.join(workdir, name))
    if why:
      unreadable[name] = why
  records["unreadable"] = unreadable
  return records


def _read_json(path: str) -> tuple[dict | None, str]:
  """(a record's content, ""), (None, "") where the workdir has none (a run older than it),
  or (None, why) where it does not read as a JSON object."""
  if not os.path.isfile(path):
    return None, ""
  try:
    with open(path) as f:
      content = json.load(f)
  except (OSError, ValueError) as e:
    return None, f"unreadable ({e})"
  if not isinstance(content, dict):
    return None, "unreadable (no JSON object)"
  return content, ""


def on_the_runs_devices(config, environment: dict, now: dict):
  """(config, exact). Where this process has the run's device kind and at least as many
  devices as its mesh had, the config is set to a mesh of that many. The numbers are then
  compared bit for bit (exact) only where the process also has as many devices, and
  processes, as the run's: XLA splits a host's work by its device count, so a 1-device run
  redone on 1 of 8 simulated CPU devices can differ in the last digits (seen with jax 0.12)."""
  count = environment.get("device_count", len(environment.get("devices", [])))
  run_devices = config.mesh.num_devices or count
  if environment.get("device_kind") != now["device_kind"] or run_devices > now["device_count"]:
    return config, False
  config = config.copy_and_resolve_references()
  config.lock()
  config_lib.apply_overrides(config, {"mesh.num_devices": run_devices})
  exact = count == now["device_count"] and environment.get("process_count", 1) == now["process_count"]
  return config, exact


# --- versions, devices, code -----------------------------------------------------------

def environment_checks(recorded: dict, now: dict) -> list[Check]:
  """A row per package recorded or installed (a workdir older than the packages record:
  jax, flax and optax), then the devices, Python and the XLA flags as notes."""
  old = recorded.get("packages") or {k: recorded[k] for k in ("jax", "flax", "optax") if k in recorded}
  new = now["packages"] if recorded.get("packages") else {k: v for k, v in now["packages"].items() if k in old}
  checks = [Check(f"package {name}", old.get(name, "(absent)"), new.get(name, "(absent)"),
                  old.get(name) == new.get(name)) for name in sorted(set(old) | set(new))]
  count = recorded.get("device_count", len(recorded.get("devices", [])))
  for what, was, is_ in (("device kind", recorded.get("device_kind"), now["device_kind"]),
                         ("device count", count, now["device_count"]),
                         ("python", recorded.get("python"), now["python"]),
                         ("XLA_FLAGS", recorded.get("xla_flags"), now["xla_flags"])):
    checks.append(Check(what, str(was) if was != "" else "(none)", str(is_) if is_ != "" else "(none)", None,
                        "same" if was == is_ else "differs"))
  return checks


def _diff_shown(sha: str, diff: str | None = None) -> str:
  if not sha:
    return "clean tree"
  lines = f", {diff.count(chr(10))} lines" if diff is not None else ""
  return f"diff {sha[:12]}{lines}"


def code_checks(workdir: str, recorded: dict, now: dict) -> list[Check]:
  """jaxnet's version, the git revision and the uncommitted changes (code.diff) of the run
  against the code imported now. The stored code.diff must be the one recorded: present
  where the run had a diff, absent where it had none."""
  now_sha = provenance.text_sha256(now["diff"]) if now["diff"] else ""
  recorded_sha = recorded.get("code_diff_sha256", "")
  diff_path = os.path.join(workdir, provenance.CODE_DIFF_FILE)
  stored_sha = provenance.file_sha256(diff_path) if os.path.isfile(diff_path) else ""
  if "code_diff_sha256" in recorded and stored_sha != recorded_sha:
    now_stored = ("missing" if not stored_sha else "a code.diff the run did not write" if not recorded_sha
                  else "the stored code.diff does not match it")
    return [Check("code.diff", _diff_shown(recorded_sha), now_stored, False)]
  return [Check("version of jaxnet", recorded.get("jaxnet", "(not recorded)"), now["jaxnet"],
                recorded.get("jaxnet") == now["jaxnet"]),
          Check("git revision", recorded.get("git_revision", "") or "(none)", now["git_revision"] or "(none)",
                recorded.get("git_revision", "") == now["git_revision"]),
          Check("uncommitted changes", _diff_shown(recorded_sha), _diff_shown(now_sha, now["diff"]),
                recorded_sha == now_sha)]


# --- the records of what the model is ------------------------------------------------

def _sha_shown(sha: str | None) -> str:
  return f"sha256 {sha[:12]}" if sha else "(none)"


def record_checks(workdir: str, recorded: dict) -> list[Check]:
  """classes.json and config_file.py against the sha256 the run recorded when it wrote them
  (environment.json's records_sha256): edited, deleted or added since, each is its row's DIFFERS."""
  digests = recorded.get("records_sha256")
  if digests is None:
    return [Check("records' sha256", "(not recorded: a workdir older than it)", "-", None, "note")]
  checks = []
  for name in provenance.DIGESTED_RECORDS:
    path = os.path.join(workdir, name)
    was, now = digests.get(name), provenance.file_sha256(path) if os.path.isfile(path) else None
    shown = (_sha_shown(now) if was == now else "missing" if now is None
             else f"{_sha_shown(now)}: not written by the run" if was is None
             else f"{_sha_shown(now)}: edited since the run wrote it")
    checks.append(Check(name, _sha_shown(was), shown, was == now))
  return checks


def config_checks(workdir: str, kept: list[int]) -> list[Check]:
  """config.json against the config each kept checkpoint was saved with: a difference is a
  DIFFERS unless config_history.jsonl records it as a change accepted on a resume after that
  checkpoint (a checkpoint being rotated away while read is passed over)."""
  config_dict = config_lib.upgrade_saved(config_lib.read_json(os.path.join(workdir, workdir_lib.CONFIG_FILE)))
  history = _history(workdir)
  checks = []
  for step in kept:
    saved = ckpt.saved_config(workdir, step)
    if saved is None:
      continue
    unexplained = {k: v for k, v in workdir_lib.saved_config_changes(saved, config_dict).items()
                   if not any(e.get("resumed_from_step", -1) >= step and
                              k in e.get("changes", {}) and e["changes"][k][1] == v[1] for e in history)}
    if unexplained:
      shown = "; ".join(f"{k} {v[0]!r} -> {v[1]!r}" for k, v in list(unexplained.items())[:3])
      more = f" (+{len(unexplained) - 3} more)" if len(unexplained) > 3 else ""
      checks.append(Check(f"config.json vs checkpoint {step}", "the checkpoint's config",
                          f"{shown}{more}, not in {workdir_lib.HISTORY_FILE}", False))
  if not checks:
    checks.append(Check("config.json", f"the configs of checkpoints {kept}" if kept else "(no checkpoint)",
                        "the same" if kept else "-", True if kept else None))
  return checks


def _history(workdir: str) -> list[dict]:
  """config_history.jsonl's entries (a torn line skipped)."""
  path = os.path.join(workdir, workdir_lib.HISTORY_FILE)
  entries = []
  if os.path.isfile(path):
    with open(path) as f:
      for line in f:
        try:
          entry = json.loads(line)
        except ValueError:
          continue
        if isinstance(entry, dict):
          entries.append(entry)
  return entries


def final_checkpoint_checks(metrics: list[dict], kept: list[int]) -> list[Check]:
  """The final eval follows the final save: where the newest record is an eval, its
  checkpoint must be kept (deleted, it would silently drop out of the eval checks)."""
  evaluated = [r["step"] for r in metrics if any(k.startswith("eval/") for k in r)]
  if not evaluated or evaluated[-1] != max(r["step"] for r in metrics) or evaluated[-1] in kept:
    return []
  step = evaluated[-1]
  return [Check(f"checkpoint {step}", "the final eval's checkpoint",
                f"missing (deleted, or the run was stopped before saving it); kept: {kept or 'none'}", False,
                "MISSING")]


# --- the data ---------------------------------------------------------------------------

def data_checks(config, recorded: dict | None) -> list[Check]:
  """A row per split: the data's identity now (each source's identity(), no image read)
  against data_identity.json."""
  task = tasks.for_model(config.model.name)
  if recorded is None:
    return [Check("data", "(not recorded: a workdir older than data_identity.json)", "-", False,
                  "NOT RECORDED")]
  checks = []
  for split in sorted(recorded):
    try:
      now = provenance.identity_of(task.make_source(config, split), provenance.kind_of(recorded[split]))
    except UserError as e:  # the data is not here (a bundle on another machine, say)
      checks.append(Check(f"data {split}", _identity_summary(recorded[split]), f"cannot read it: {e}", False,
                          "NOT READ"))
      continue
    changes = provenance.identity_changes({split: recorded[split]}, {split: now})
    summary = _identity_summary(recorded[split])
    checks.append(Check(f"data {split}", summary, provenance.describe_changes(changes) if changes else summary,
                        not changes))
  return checks


# What each kind of identity compares (docs/reproducibility.md).
_KIND_SHOWN = {"listing": "paths and sizes", "sampled": "paths, sizes, sampled blocks", "content": "every byte"}


def _identity_summary(identity: dict) -> str:
  count = next((identity[k] for k in ("examples", "files", "images") if k in identity), "?")
  kind = provenance.kind_of(identity)
  digest = identity.get(f"{kind}_sha256") or next((v for k, v in identity.items() if k.endswith("sha256")), "")
  shown = f" ({_KIND_SHOWN[kind]})" if any(k.endswith("_sha256") for k in identity if k != "annotations_sha256") else ""
  return f"{count} examples" + (f", {digest[:12]}{shown}" if digest else "")


# --- the init weights ------------------------------------------------------------------

def init_weights_checks(record: dict | None, spec: str) -> list[Check]:
  """A note on the `init.weights` file the run started from against init_weights.json; none
  for a run from random init. A note, not a check: the checkpoints re-evaluated do not depend
  on it, only --retrain reads it again (and refuses first where it is missing or another)."""
  from jaxnet.tools.weights import pretrained
  if not spec:
    return []
  if record is None:
    return [Check("init weights", "(not recorded: a workdir older than init_weights.json)", spec, None, "note")]
  now = pretrained.weights_file_sha256(record, spec)
  if now is None:  # a workdir or hub name: what it holds now is not compared
    return [Check("init weights", spec, "not a file: not compared", None, "note")]
  recorded = f"{spec}, sha256 {record['sha256'][:12]}"
  if now == record["sha256"]:
    return [Check("init weights", recorded, recorded, None, "same")]
  if not now:
    return [Check("init weights", recorded, "missing: --retrain would refuse", None, "missing")]
  return [Check("init weights", recorded, f"sha256 {now[:12]}: --retrain would refuse", None, "differs")]


# --- the metrics --------------------------------------------------------------------------

def kept_steps(workdir: str) -> list[int]:
  if not os.path.isdir(os.path.join(workdir, ckpt.CHECKPOINTS_DIR)):
    return []
  checkpoints = ckpt.Checkpoints(workdir, read_only=True)
  try:
    return checkpoints.steps()
  finally:
    checkpoints.close()


def reported_steps(workdir: str, metrics: list[dict], step: int | None = None) -> list[int]:
  """The steps whose eval metrics.jsonl records and whose checkpoint is still there (or `step`)."""
  evaluated = {r["step"] for r in metrics if any(k.startswith("eval/") for k in r)}
  kept = set(kept_steps(workdir))
  if step is not None:
    if step not in evaluated or step not in kept:
      raise UserError(f"{workdir} has no recorded eval of a kept checkpoint {step} "
                      f"(recorded evals of kept checkpoints: {sorted(evaluated & kept) or 'none'})")
    return [step]
  return sorted(evaluated & kept)


def close_enough(recorded: float, now: float, exact: bool) -> bool:
  if exact:
    return recorded == now
  return math.isclose(recorded, now, rel_tol=REL_TOLERANCE, abs_tol=ABS_TOLERANCE)


def metric_checks(recorded: dict, now: dict, step: int, exact: bool) -> list[Check]:
  checks = []
  for key in sorted(k for k in recorded if k.startswith("eval/")):
    if key not in now:
      continue
    was, is_ = recorded[key], now[key]
    holds = close_enough(was, is_, exact) if key != "eval/examples" else was == is_
    verdict = "same" if was == is_ else ("within tolerance" if holds else "DIFFERS")
    checks.append(Check(f"{key} at step {step}", _num(was), _num(is_), holds, verdict))
  return checks


def _num(value) -> str:
  return f"{value:.6g}" if isinstance(value, float) else str(value)


def eval_checks(workdir: str, config, metrics: list[dict], exact: bool, step: int | None = None) -> list[Check]:
  """Re-evaluates each reported checkpoint (recording nothing) and compares every eval metric."""
  from jaxnet.core import train as train_lib
  steps = reported_steps(workdir, metrics, step)
  if not steps:
    return [Check("eval metrics", "(no recorded eval of a kept checkpoint)", "-", False, "NOTHING TO CHECK")]
  by_step = {}
  for r in metrics:  # a step's train and eval metrics may be on one line or two
    by_step.setdefault(r["step"], {}).update(r)
  checks = []
  for s in steps:
    try:
      now = train_lib.evaluate_checkpoint(config, workdir, s, (provenance.ACCEPT_DATA,), record=False)
    except UserError as e:  # no eval data here, a damaged checkpoint: said in its row
      checks.append(Check(f"eval at step {s}", "recorded", f"cannot evaluate: {e}", False, "NOT EVALUATED"))
      continue
    checks += metric_checks(by_step[s], now, s, exact)
  return checks


# --- retraining ---------------------------------------------------------------------------

def first_difference(recorded: list[dict], now: list[dict], exact: bool, key: str = "train/loss"):
  """(step, recorded value, now value) of the first logged step whose `key` differs, or None;
  (step, value, None) where the rerun logged no such step."""
  now_by_step = {r["step"]: r for r in now if key in r}
  for r in sorted((r for r in recorded if key in r), key=lambda r: r["step"]):
    other = now_by_step.get(r["step"])
    if other is None:
      return r["step"], r[key], None
    if not close_enough(r[key], other[key], exact):
      return r["step"], r[key], other[key]
  return None


def retrain_checks(workdir: str, config, metrics: list[dict], steps: int, exact: bool,
                   scratch: str | None = None) -> list[Check]:
  """Re-runs the first `steps` steps from the recorded config and seed (the whole run's
  schedule: total_steps stays) in a scratch workdir, and compares each logged train loss."""
  from jaxnet.core import train as train_lib
  logged = [r for r in metrics if "train/loss" in r and r["step"] <= steps]
  if not logged:
    raise UserError(f"{workdir} logged no train loss in its first {steps} steps (it logs every "
                    f"{config.log_every_steps}): give --retrain a STEPS of at least {config.log_every_steps}")
  steps = max(r["step"] for r in logged)
  quick = {"eval_every_steps": 0, "checkpoint_every_steps": 0, "eval_every_epochs": 0.0,
           "checkpoint_every_epochs": 0.0}
  config = config.copy_and_resolve_references()
  config.lock()
  config_lib.apply_overrides(config, {k: v for k, v in quick.items() if k in config})
  folder = scratch or tempfile.mkdtemp(prefix="jaxnet-verify-")
  try:
    control = train_lib.RunControl()
    control.stop_requested = lambda: (control.step or 0) >= steps
    init_params = None
    if config.init.weights:
      from jaxnet.tools.weights import pretrained
      init_params = pretrained.initialiser(config)
    train_lib.train_and_evaluate(config, folder, init_params=init_params, control=control)
    rerun = read_jsonl(folder)
  finally:
    if scratch is None:
      shutil.rmtree(folder, ignore_errors=True)
  differs = first_difference(logged, rerun, exact)
  what = f"train/loss, steps 1-{steps} ({len(logged)} logged)"
  if differs is None:
    return [Check(what, "metrics.jsonl", "rerun: the same" if exact else "rerun: within tolerance", True)]
  step, was, is_ = differs
  now = f"first differs at step {step}: {_num(is_)}" if is_ is not None else f"step {step} not logged"
  return [Check(what, f"step {step}: {_num(was)}", now, False)]


# --- all of it ---------------------------------------------------------------------------

def verify(workdir: str, *, evaluate: bool = True, step: int | None = None, retrain: int = 0,
           scratch: str | None = None) -> list[Check]:
  """Every check of WORKDIR: versions and devices, code, data, the recorded evals (re-run),
  and, with `retrain` > 0, the first `retrain` steps' train losses."""
  from jaxnet.tools import bundle
  from jaxnet.tools.weights import pretrained
  manifest = bundle.check_bundle(workdir)  # a bundle: every file as it was made, or one line
  records = open_workdir(workdir)
  unreadable = records["unreadable"]
  config = pretrained.with_recorded_preprocessing(config_lib.load(workdir), workdir)
  if retrain and config.init.weights:  # rereads them: refused at once where they are not the run's
    pretrained.check_weights_record(records["init_weights"], config.init.weights)
  checks = []
  holder = workdir_lib.held_by(workdir)
  if holder:  # its checkpoints may rotate away while they are read
    checks.append(Check("workdir", "-", f"held by a training run ({holder})", None, "held"))
  now = provenance.environment()
  environment = records["environment"]
  if environment is None:
    checks.append(Check("environment.json", unreadable.get("environment.json", "missing"),
                        "versions, devices and code not compared", False, "NOT READ"))
    environment = {}
  config, exact = on_the_runs_devices(config, environment, now)
  if records["environment"] is not None:
    checks += environment_checks(environment, now)
  checks.append(Check("numbers compared", "-", f"bit for bit, on the run's {config.mesh.num_devices} device(s)"
                      if exact else f"to a tolerance ({ABS_TOLERANCE} + {REL_TOLERANCE:.0e} x value): "
                      f"other devices than the run's", None, "note"))
  if records["environment"] is not None:
    checks += code_checks(workdir, environment, provenance.code_state())
    checks += record_checks(workdir, environment)
  if manifest is not None:
    checks.append(Check("bundle files", f"{len(manifest['files'])} sha256 in {bundle.MANIFEST}", "all match", True))
  kept = kept_steps(workdir)
  checks += config_checks(workdir, kept)
  if not holder:  # a running training may be saving its newest checkpoint now
    checks += final_checkpoint_checks(records["metrics"], kept)
  for name in (provenance.DATA_IDENTITY_FILE, provenance.INIT_WEIGHTS_FILE):
    if name in unreadable:
      checks.append(Check(name, unreadable[name], "not compared", False, "NOT READ"))
  if provenance.DATA_IDENTITY_FILE not in unreadable:
    checks += data_checks(config, records["data_identity"])
  checks += init_weights_checks(records["init_weights"], config.init.weights)
  if evaluate:
    checks += eval_checks(workdir, config, records["metrics"], exact, step)
  if retrain:
    checks += retrain_checks(workdir, config, records["metrics"], retrain, exact, scratch)
  return checks


def table(checks: list[Check]) -> str:
  """The checks as aligned columns: check, recorded, now, verdict."""
  rows = [("check", "recorded", "now", "verdict")] + [(c.what, c.recorded, c.now, c.verdict) for c in checks]
  widths = [min(max(len(r[i]) for r in rows), 48) for i in range(3)]
  return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows)
