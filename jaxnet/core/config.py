"""The run's config: every run-level key with its default, loading a config file or a
workdir's config.json with overrides, range checks, and durations in steps or epochs.

A config file defines `get_config()` that calls `base_config()` and overrides what its
recipe needs. The recipes jaxnet ships are such files in the package (jaxnet/configs/), named
by their file's name: `digits`, `resnet50:fast` (`resolve`). The command line passes its
`--config.KEY=VALUE` flags to `load` as strings, the Python API passes values; both get the
file's `get_config()`, locked, with the overrides applied, so a mistyped key is the same
error in both. A string for a non-string key is read as that key's type.

`config.model` is the model's own options: `name` picks a model of the registry
(jaxnet/core/models), and every other key is a field of that model, passed to it as a
keyword argument. `load` fills in the fields the config file left out, at the model's
defaults, so each can be overridden (`--config.model.bn_momentum=0.99`) and config.json
records them all; a key the model does not have is an error naming it and the model.
"""

import ast
import difflib
import importlib.util
import json
import math
import os
import traceback

import ml_collections

from jaxnet.core.errors import InvalidValueError, MissingFileError, UserError


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0                       # init, data order, augmentation: the same seed, the same run
  c.batch_size = 256               # global, over all devices and hosts
  c.grad_accum_steps = 1           # > 1: each step sums the gradients of this many micro-batches
                                   # of batch_size / grad_accum_steps (less memory, same update)
  c.total_steps = 0                # > 0 caps the run; 0 means num_epochs
  c.num_epochs = 1.0               # passes over the train split (when total_steps is 0)
  c.image_size = 224               # train and eval resolution, pixels (square)
  # ((fraction_of_training, image_size), ...): train at smaller sizes early on.
  # Empty: always image_size. Evaluation always uses image_size.
  c.progressive_resizing = ()
  c.precision = "fp32"             # fp32 | bf16 | fp16
  c.target_accuracy = 0.0          # eval/top1 that makes the MLPerf log's run_stop "success"
                                   # (WORKDIR/mlperf.log); 0: completing the run does
  c.ema_decay = 0.0                # 0: no EMA of params (and no copy of them in the state); eval uses EMA params when on

  c.log_every_steps = 100          # a progress line and a metrics.jsonl record every this many steps
  c.eval_every_steps = 0           # 0: only the final eval
  c.eval_every_epochs = 0.0        # used when eval_every_steps is 0; both 0: only the final eval
  c.checkpoint_every_steps = 1000  # 0: only the final checkpoint
  c.checkpoint_every_epochs = 0.0  # used when checkpoint_every_steps is 0 (duration_in_steps)
  c.keep_checkpoints = 3           # the newest this many checkpoints are kept
  c.async_checkpointing = True     # save in the background while training goes on
  # (first, last): trace steps first..last (1-based) with jax.profiler into
  # WORKDIR/tensorboard for TensorBoard's profile plugin. Empty: no trace.
  c.profile_steps = ()

  # The model: `name` (a registry name of jaxnet/core/models: resnet50, vit_s16, ...) and the
  # model's own options, the fields of its flax module (ResNet's bn_momentum, ViT's flavour, ...);
  # `load` fills in those a config file leaves out, and config.json lists every one a run used.
  # num_classes 0: the dataset's class count (a wider head is allowed, a narrower one an error).
  c.model = ml_collections.ConfigDict({"name": "resnet50", "num_classes": 0})
  c.bn_group_size = 0              # BN statistics over groups of this many devices; 0 = global batch
                                   # (models with batch norm only)

  # Initial weights (fine-tuning); used only when a run starts, never on resume.
  c.init = ml_collections.ConfigDict()
  c.init.weights = ""              # "": random init | FILE.safetensors | FILE.pth (needs torch) |
                                   # a jaxnet WORKDIR | hf-hub:timm/NAME (needs huggingface_hub)
  c.init.keep_head = True          # keep the source's classifier if its class count matches;
                                   # a different count always re-initialises it
  c.init.preprocessing = "weights"  # weights: data.mean/std/eval_crop_fraction/eval_interpolation
                                   # become what the weights expect | config: keep the config's

  c.data = ml_collections.ConfigDict()
  c.data.source = "synthetic"      # where the data comes from: one of the sources the model's
                                   # task reads (its `sources`, jaxnet/core/tasks; another is
                                   # refused in one line naming them); synthetic: random data
  c.data.dir = ""                  # the source's root folder, or tfds data_dir
  c.data.name = "imagenet2012"     # tfds dataset name
  c.data.train_split = "train"     # the split trained on (a folder of an ImageFolder root)
  c.data.eval_split = "validation"  # the split evaluated (ImageFolder: its folder, e.g. val)
  c.data.loader = "grain"          # grain | dali: NVIDIA DALI decodes and augments (on the GPU where
                                   # jax computes on one; image folders; pip install -e '.[dali]')
  c.data.workers = 0               # Grain worker processes (0: decode in the main process; -1: one
                                   # per core this process may use, less one);
                                   # with loader=dali, DALI's CPU threads
  c.data.read_threads = 0          # threads per worker reading a batch's records side by side;
                                   # 0 reads inline, cheapest from local disk; ~16 for GCS/NFS
  c.data.eval_batch_size = 0       # 0: batch_size
  c.data.identity = "listing"      # how an image folder's identity is taken at a run's start:
                                   # listing (paths and sizes) | sampled (and 3 blocks of each
                                   # file) | content (every byte); docs/reproducibility.md
  c.data.eval_crop_fraction = 0.875  # eval: resize to image_size / this, center-crop image_size
  c.data.eval_interpolation = "bilinear"  # eval resize filter (antialiased): bilinear | bicubic
  c.data.num_classes = 1000        # synthetic only: how many classes its labels draw from
  c.data.synthetic_size = 10_000   # synthetic only: examples per epoch
  c.data.mean = (0.485, 0.456, 0.406)  # per-channel, of pixels in [0, 1]
  c.data.std = (0.229, 0.224, 0.225)  # per-channel, of pixels in [0, 1]
  c.data.prefetch = 2              # batches placed on the devices ahead of the step
  c.data.randaug_num_ops = 0       # RandAugment: ops per train image (0: off); in the Grain
  c.data.randaug_magnitude = 10    # workers, on uint8 images; magnitude of 0..10

  # Each task's own keys (jaxnet/core/tasks: Task.add_config): classification's label_smoothing
  # and mix (mixup / CutMix), detection's detection.* (data.source=coco, a retinanet_* model).
  from jaxnet.core import tasks
  for task in tasks.all_tasks():
    task.add_config(c)

  c.optim = ml_collections.ConfigDict()
  c.optim.name = "sgd"             # sgd | lars | adamw
  c.optim.learning_rate = 0.1      # peak LR at base_batch_size; scaled linearly with batch_size
  c.optim.base_batch_size = 256    # the batch learning_rate is given for
  c.optim.schedule = "cosine"      # cosine | linear | poly2 | constant
  c.optim.warmup_epochs = 0.0      # linear warmup from 0 to the peak LR
  c.optim.warmup_steps = 0         # overrides warmup_epochs when > 0
  c.optim.end_lr_fraction = 0.0    # the final LR as a fraction of the peak
  c.optim.momentum = 0.9           # sgd, lars
  c.optim.nesterov = True          # sgd
  c.optim.weight_decay = 5e-5      # conv/dense kernels only: not BN, LayerNorm, biases, embeddings
  c.optim.b1 = 0.9                 # adamw
  c.optim.b2 = 0.999               # adamw
  c.optim.mu_dtype = ""            # adamw: dtype of the first moment, e.g. "bfloat16"; "" = params'
  c.optim.grad_clip_norm = 0.0     # clip gradients to this global norm; 0: no clipping

  c.loss_scale = ml_collections.ConfigDict()  # fp16 only
  c.loss_scale.initial_scale = 2.0**15  # fp16: the dynamic loss scale to start from
  c.loss_scale.growth_interval = 2000  # fp16: finite steps before the scale doubles

  c.mesh = ml_collections.ConfigDict()
  c.mesh.num_devices = 0           # 0: every device of every host
  # FSDP (jaxnet/core/sharding.py, docs/scaling.md): params, gradients, optimizer state and EMA split
  # over devices instead of copied to each; for models whose state does not fit one device.
  c.mesh.fsdp = False
  c.mesh.fsdp_devices = 0          # devices each tensor is split over; 0: all. k: split within
                                   # groups of k consecutive devices (one host's), copied across
  c.mesh.fsdp_min_size = 2**18     # tensors with fewer elements (biases, norms) stay replicated

  c.distributed = ml_collections.ConfigDict()  # multi-host; see docs/multihost.md
  c.distributed.enabled = "auto"   # auto (Slurm / coordinator set) | true | false
  c.distributed.coordinator_address = ""  # HOST:PORT of process 0; "": from Slurm or the environment
  c.distributed.num_processes = 0  # 0: from Slurm or the environment
  c.distributed.process_id = -1    # -1: from Slurm or the environment
  c.distributed.local_device_ids = ""  # comma-separated device ids this process uses; "": all
  c.distributed.heartbeat_timeout_sec = 100.0  # a process silent this long counts as dead: the
                                   # others stop with one line naming it (jaxnet/cli/heartbeat.py);
                                   # jax's own heartbeat timeout is set to twice this
  # "h100": the XLA flags and NCCL/CUDA variables NVIDIA's JAX-Toolbox documents for H100
  # clusters, set by the command line before jax starts (docs/multihost.md); "" adds none.
  c.distributed.cluster_profile = ""
  return c


def key_definitions() -> list:
  """The functions whose lines define the config's keys, each commented with what it does:
  base_config and every task's add_config (jaxnet config reads their comments)."""
  from jaxnet.core import tasks
  return [base_config] + [type(task).add_config for task in tasks.all_tasks()]


class ConfigOverrideError(UserError, ValueError):
  """An override names a key the config does not have, or has the wrong type."""


class InvalidConfigError(UserError, ValueError):
  """A config value is out of its range (batch_size=0, total_steps=-5, ...)."""


class ConfigFileError(UserError, ValueError):
  """A config file that cannot be run: a syntax error, an exception in get_config()."""


def load(path: str, overrides: dict | None = None) -> ml_collections.ConfigDict:
  """A locked config from a recipe `NAME[:ARG]`, a file `PATH.py[:ARG]`, a `config.json`, or a
  workdir holding one.

  `overrides` maps dotted keys to values: {"optim.learning_rate": 0.1, "total_steps": 50}.
  An override of `model.name` comes first (`switch_model`), so that the other overrides
  reach the options of the model it names.
  """
  # A workdir: one that holds its run's config.json, or any folder not named as a recipe.
  if os.path.isdir(path) and (os.path.isfile(os.path.join(path, "config.json")) or not is_recipe(path)):
    config = from_json(os.path.join(path, "config.json"))
  elif path.endswith(".json"):
    config = from_json(path)
  else:
    config = from_file(path)
  overrides = flatten(overrides or {})
  if "model.name" in overrides:
    config = switch_model(config, overrides.pop("model.name"))
  config = with_model_options(config)
  config.lock()
  apply_overrides(config, overrides)
  return config


def switch_model(config, name: str) -> ml_collections.ConfigDict:
  """A copy of `config` for model `name`: the config file's model options that `name` also
  has are kept, the others (set for the model the file names) are dropped."""
  from jaxnet.core import models
  keep = set(models.options(name))
  switched = config.copy_and_resolve_references()
  with switched.unlocked():
    switched.model = ml_collections.ConfigDict(
        {"name": name, **{k: v for k, v in config.model.items() if k in keep}})
  return switched


def with_model_options(config) -> ml_collections.ConfigDict:
  """A copy of `config` whose `model` holds every option of the model it names: those the
  config sets, and the model's defaults for the rest. InvalidValueError names a key the
  model does not have."""
  from jaxnet.core import models
  options = models.check_options(config.model)
  filled = config.copy_and_resolve_references()
  with filled.unlocked():
    for key, default in options.items():
      if key not in filled.model:
        filled.model[key] = default
  if config.is_locked:
    filled.lock()
  return filled


# The recipes that ship with jaxnet: jaxnet/configs/NAME.py, run as `--config=NAME[:ARG]`.
RECIPES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def recipe_names() -> list[str]:
  """The names of the packaged recipes (jaxnet/configs/NAME.py), sorted."""
  return sorted(name[:-3] for name in os.listdir(RECIPES_DIR)
                if name.endswith(".py") and not name.startswith("_"))


def is_recipe(spec: str) -> bool:
  """Whether `spec` names a packaged recipe: `NAME[:ARG]`, a bare name (no folder, no .py)."""
  return spec.partition(":")[0] in recipe_names()


def resolve(spec: str) -> tuple[str, str]:
  """(config file, ARG) of `spec`: a packaged recipe `NAME[:ARG]`, or a file `PATH.py[:ARG]`.

  A bare name is the recipe, not a file of that name (that is `./digits`; `load` takes a workdir
  named so that holds a config.json as the workdir).
  `configs/NAME.py` that does not exist (from any folder) is the packaged recipe NAME: where
  the recipes lived in a checkout before they moved into the package, so older commands keep
  working."""
  path, _, arg = spec.partition(":")
  if is_recipe(spec):
    return os.path.join(RECIPES_DIR, f"{path}.py"), arg
  if os.path.exists(spec):
    return spec, ""
  if os.path.exists(path):
    return path, arg
  name = os.path.basename(path).removesuffix(".py")
  if path.endswith(".py") and os.path.basename(os.path.dirname(path)) == "configs" and name in recipe_names():
    return os.path.join(RECIPES_DIR, f"{name}.py"), arg
  if path.endswith(".py") or os.sep in path:
    raise MissingFileError(f"config file {path!r} not found (or a recipe by name: "
                           f"{', '.join(recipe_names())}; jaxnet recipes)")
  close = difflib.get_close_matches(name, recipe_names(), n=1)
  hint = f"did you mean --config={close[0]}? " if close else ""
  raise MissingFileError(f"no recipe or config file {path!r}: {hint}the recipes are "
                         f"{', '.join(recipe_names())} (jaxnet recipes), or give a FILE.py")


def from_file(spec: str) -> ml_collections.ConfigDict:
  """Runs `get_config()` of a config file or packaged recipe (`resolve`); `:ARG` passes ARG
  (`get_config(ARG)`)."""
  path, arg = resolve(spec)
  module_spec = importlib.util.spec_from_file_location("_jaxnet_config", path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
  except Exception as e:
    raise config_file_error(path, e) from e
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigFileError(f"{path}: get_config() returned a {type(config).__name__}, not an "
                          f"ml_collections.ConfigDict: return the config, as configs/digits.py does")
  return config


def config_file_error(path: str, error: BaseException) -> ConfigFileError:
  """'configs/x.py:12: SyntaxError: invalid syntax' for an error raised by a config file."""
  if isinstance(error, SyntaxError):
    return ConfigFileError(f"{error.filename or path}:{error.lineno}: SyntaxError: {error.msg}")
  frames = [f for f in traceback.extract_tb(error.__traceback__)
            if os.path.abspath(f.filename) == os.path.abspath(path)]
  where = f"{path}:{frames[-1].lineno}" if frames else path
  return ConfigFileError(f"{where}: {type(error).__name__}: {error}")


def data_name(config) -> str:
  """What a run's data is called: a tfds dataset's name, else its folder's (an image folder's,
  a COCO-format one's: `shapes`, not `coco`), else the generated source's (digits, synthetic)."""
  if config.data.source == "tfds":
    return config.data.name
  return os.path.basename(os.path.normpath(config.data.dir)) if config.data.dir else config.data.source


def get(config, dotted: str):
  """The value of a dotted key: get(config, "optim.learning_rate")."""
  node = config
  for part in dotted.split("."):
    node = node[part]
  return node


# (key, test, what the value must be): ranges, checked before a run writes anything. A value
# that is checked where it is used (precision: state.get_policy, batch sizes against the
# devices: sharding.check_batch_sizes, the eval options: data/transforms.py) is not here.
_RULES = (
    ("batch_size", lambda v: v >= 1, ">= 1"),
    ("grad_accum_steps", lambda v: v >= 1, ">= 1"),
    ("total_steps", lambda v: v >= 0, ">= 0 (0 means num_epochs)"),
    ("num_epochs", lambda v: v >= 0, "> 0"),
    ("image_size", lambda v: v >= 1, ">= 1"),
    ("log_every_steps", lambda v: v >= 0, ">= 0 (0 turns it off)"),
    ("eval_every_steps", lambda v: v >= 0, ">= 0 (0 turns it off)"),
    ("checkpoint_every_steps", lambda v: v >= 0, ">= 0 (0 turns it off)"),
    ("eval_every_epochs", lambda v: v >= 0, ">= 0"),
    ("checkpoint_every_epochs", lambda v: v >= 0, ">= 0"),
    ("keep_checkpoints", lambda v: v >= 1, ">= 1"),
    ("ema_decay", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("data.workers", lambda v: v >= -1, ">= 0, or -1 (a worker per core, less one)"),
    ("data.read_threads", lambda v: v >= 0, ">= 0"),
    ("data.prefetch", lambda v: v >= 0, ">= 0"),
    ("data.eval_batch_size", lambda v: v >= 0, ">= 0 (0 means batch_size)"),
    ("optim.learning_rate", lambda v: v >= 0, ">= 0"),
    ("data.identity", lambda v: v in ("listing", "sampled", "content"), "listing, sampled or content"),
    ("distributed.heartbeat_timeout_sec", lambda v: v >= 1, ">= 1"),
)


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises InvalidConfigError listing every out-of-range value (one line each)."""
  problems = []
  from jaxnet.core import tasks  # and each task's, for its own keys (Task.rules)
  for key, ok, requirement in _RULES + tuple(r for task in tasks.all_tasks() for r in task.rules):
    value = get(config, key)
    if not ok(value):
      problems.append(f"{key}={value!r} must be {requirement}")
  profile = tuple(config.profile_steps)
  if profile and not (len(profile) == 2 and 1 <= profile[0] <= profile[1]):
    problems.append(f"profile_steps={profile!r} must be (first, last) with 1 <= first <= last")
  if config.total_steps == 0 and config.num_epochs <= 0:
    problems.append(f"num_epochs={config.num_epochs!r} must be > 0 when total_steps is 0")
  from jaxnet.core.data import transforms  # the eval options' checks live where they are used
  for check, value in ((transforms.check_crop_fraction, config.data.eval_crop_fraction),
                       (transforms.check_interpolation, config.data.eval_interpolation)):
    try:
      check(value)
    except InvalidValueError as e:
      problems.append(str(e))
  from jaxnet.core import models
  problems += models.option_problems(config.model)
  if problems:
    raise InvalidConfigError("invalid config: " + "; ".join(problems))


def parse_arg(arg: str, positional: str | None = None, **defaults) -> ml_collections.ConfigDict:
  """A config file's argument `key=value,flag,...` as a ConfigDict, typed by `defaults`.

  A bare word names a bool default (set to True) or, failing that, is the value
  of `positional`: parse_arg("fast", positional="recipe", recipe="standard").
  """
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (part.strip() for part in (arg or "").split(","))):
    key, has_value, value = item.partition("=")
    if not has_value:
      if isinstance(defaults.get(key), bool):
        key, value = key, "true"
      elif positional:
        key, value = positional, item
      else:
        raise ConfigOverrideError(f"config argument {item!r}: write it as KEY=VALUE")
    if key not in defaults:
      raise ConfigOverrideError(f"config argument {key!r} is not one of {', '.join(defaults)}")
    out[key] = _parse(key, value, defaults[key]) if not isinstance(defaults[key], str) else value
  return out


def from_json(path: str) -> ml_collections.ConfigDict:
  """Rebuilds the ConfigDict that training saved as JSON (WORKDIR/config.json).

  JSON has no tuples, so values come back as lists; merging onto `base_config()`
  restores each known key's type (a list assigned to a tuple field becomes a
  tuple). Keys the base does not know (a config file's own additions, the model's
  options) are kept, with lists turned into tuples, the only sequence type configs use.
  """
  if not os.path.exists(path):
    raise MissingFileError(f"{path} not found: is this a workdir written by jaxnet training?")
  saved = upgrade_saved(read_json(path))
  config = base_config()
  _merge(config, saved)
  return config


# Model keys that jaxnet 0.1 (up to main ab264ba) wrote into every config.json, whatever the
# model, at these values unless a recipe set them: the ones a model does not have are dropped
# from such a config. bn_group_size (devices per BN group) is a run-level key now.
_SHARED_MODEL_KEYS_V01 = {"bn_momentum": 0.9, "bn_epsilon": 1e-5, "zero_init_last_bn": True,
                          "freeze_bn_stats": False, "vit_flavour": "timm"}


def upgrade_saved(saved: dict) -> dict:
  """A config.json written by jaxnet 0.1 (ab264ba and before) in today's layout; a newer one
  unchanged. Such a workdir (tests/data/workdir_ab264ba) restores and resumes as it was."""
  model = dict(saved.get("model", {}))
  if "vit_flavour" not in model:
    return saved
  from jaxnet.core import models
  saved = dict(saved, model=model)
  saved.setdefault("bn_group_size", model.pop("bn_group_size", 0))
  options = models.options(model["name"]) if model.get("name") in models.names() else {}
  if "flavour" in options:
    model["flavour"] = model.pop("vit_flavour")
  for key, default in _SHARED_MODEL_KEYS_V01.items():
    if key in model and key not in options and model[key] == default:
      del model[key]
  return saved


def read_json(path: str) -> dict:
  """A saved config (WORKDIR/config.json); a UserError naming the file and the fix if
  it is not a JSON object (an edit gone wrong, a write cut short)."""
  try:
    with open(path) as f:
      saved = json.load(f)
  except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
    saved = e
  if not isinstance(saved, dict):
    why = f"{saved}" if isinstance(saved, ValueError) else "it holds no JSON object"
    raise UserError(
        f"{path} is not a valid config ({why}). It records the config the workdir was trained "
        f"with: put back a good copy, or delete it and train again, which restores it from "
        f"the newest checkpoint")
  return saved


def _merge(node: ml_collections.ConfigDict, values: dict) -> None:
  for key, value in values.items():
    if key in node and isinstance(node[key], ml_collections.ConfigDict) and isinstance(value, dict):
      _merge(node[key], value)
    elif key in node and value is not None:
      node[key] = value
    else:
      node[key] = _as_config_value(value)


def _as_config_value(value):
  if isinstance(value, dict):
    return ml_collections.ConfigDict({k: _as_config_value(v) for k, v in value.items()})
  if isinstance(value, list):
    return tuple(_as_config_value(v) for v in value)
  return value


def flat_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  keys = []
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      keys += flat_keys(value, f"{prefix}{key}.")
    else:
      keys.append(f"{prefix}{key}")
  return keys


def apply_overrides(config: ml_collections.ConfigDict, overrides: dict) -> None:
  """Sets dotted keys on a (locked) config; a missing key or a wrong type raises ConfigOverrideError."""
  known = flat_keys(config)
  for dotted, value in flatten(overrides).items():
    *parents, leaf = dotted.split(".")
    node = config
    for part in parents:
      node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node or \
        isinstance(node[leaf], ml_collections.ConfigDict):
      close = difflib.get_close_matches(dotted, known, n=3)
      hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
      raise ConfigOverrideError(f"the config has no key {dotted!r}.{hint} "
                                f"jaxnet config lists the keys (jaxnet/core/config.py).")
    if isinstance(value, str) and not isinstance(node[leaf], str):
      value = _parse(dotted, value, node[leaf])
    try:
      node[leaf] = value
    except TypeError as e:
      raise ConfigOverrideError(f"config key {dotted!r}: {e}") from None


def _parse(key: str, text: str, current):
  """A command-line string as the type of the key's current value."""
  try:
    if isinstance(current, bool):
      if text.lower() in ("true", "1", "yes"):
        return True
      if text.lower() in ("false", "0", "no"):
        return False
      raise ValueError
    if isinstance(current, int):
      return int(text)
    if isinstance(current, float):
      return float(text)
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    if current is None:
      return text
    raise ConfigOverrideError(f"config key {key!r}: cannot read {text!r} as "
                              f"{type(current).__name__} (its value is {current!r})") from None
  if isinstance(current, (tuple, list)):
    if not isinstance(value, (tuple, list)):
      raise ConfigOverrideError(f"config key {key!r} is a tuple: write it as one, e.g. {current!r}")
    return tuple(value)
  return value


def flatten(overrides: dict, prefix: str = "") -> dict:
  """{"optim": {"learning_rate": 0.1}} and {"optim.learning_rate": 0.1} mean the same."""
  flat = {}
  for key, value in overrides.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


# Durations: a duration named PREFIX is set as PREFIX_steps or PREFIX_epochs. Steps > 0 win,
# else the epochs are converted with this run's steps per epoch (dataset size // batch_size),
# so an epoch-based cadence keeps its meaning when batch_size is overridden.
DURATIONS = {
    "total": ("total_steps", "num_epochs"),
    "warmup": ("optim.warmup_steps", "optim.warmup_epochs"),
    "eval_every": ("eval_every_steps", "eval_every_epochs"),
    "checkpoint_every": ("checkpoint_every_steps", "checkpoint_every_epochs"),
}


def duration_in_steps(config, prefix: str, steps_per_epoch: int) -> int:
  """The duration `prefix` (a key of DURATIONS) in steps."""
  steps_key, epochs_key = DURATIONS[prefix]
  n = get(config, steps_key)
  if n > 0:
    return int(n)
  return math.ceil(get(config, epochs_key) * steps_per_epoch)
