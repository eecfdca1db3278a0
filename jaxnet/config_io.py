"""Configs: load a config file or a workdir's config.json, apply overrides, check ranges.

The one path for both front ends: the command line passes its `--config.KEY=VALUE`
flags to `load` as strings, the Python API passes values; both get a config file's
`get_config()`, locked, with the overrides applied, so a mistyped key is the same
error in both. A string for a non-string key is read as that key's type.
"""

import ast
import difflib
import importlib.util
import json
import os

import traceback

import ml_collections

from jaxnet.config_base import base_config
from jaxnet.errors import InvalidValueError, MissingFileError, UserError


class ConfigOverrideError(UserError, ValueError):
  """An override names a key the config does not have, or has the wrong type."""


class InvalidConfigError(UserError, ValueError):
  """A config value is out of its range (batch_size=0, total_steps=-5, ...)."""


class ConfigFileError(UserError, ValueError):
  """A config file that cannot be run: a syntax error, an exception in get_config()."""


def load(path: str, overrides: dict | None = None) -> ml_collections.ConfigDict:
  """A locked config from `configs/NAME.py[:ARG]`, a `config.json`, or a workdir holding one.

  `overrides` maps dotted keys to values: {"optim.learning_rate": 0.1, "total_steps": 50}.
  """
  if os.path.isdir(path):
    config = from_json(os.path.join(path, "config.json"))
  elif path.endswith(".json"):
    config = from_json(path)
  else:
    config = from_file(path)
  config.lock()
  apply_overrides(config, overrides or {})
  return config


def from_file(spec: str) -> ml_collections.ConfigDict:
  """Runs `get_config()` of a config file; `path.py:ARG` passes ARG (`get_config(ARG)`)."""
  path, _, arg = spec.partition(":") if not os.path.exists(spec) else (spec, "", "")
  if not os.path.exists(path):
    raise MissingFileError(f"config file {path!r} not found")
  module_spec = importlib.util.spec_from_file_location("_jaxnet_config", path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()
  except Exception as e:
    raise config_file_error(path, e) from e


def config_file_error(path: str, error: BaseException) -> ConfigFileError:
  """'configs/x.py:12: SyntaxError: invalid syntax' for an error raised by a config file."""
  if isinstance(error, SyntaxError):
    return ConfigFileError(f"{error.filename or path}:{error.lineno}: SyntaxError: {error.msg}")
  frames = [f for f in traceback.extract_tb(error.__traceback__)
            if os.path.abspath(f.filename) == os.path.abspath(path)]
  where = f"{path}:{frames[-1].lineno}" if frames else path
  return ConfigFileError(f"{where}: {type(error).__name__}: {error}")


def get(config, dotted: str):
  """The value of a dotted key: get(config, "optim.learning_rate")."""
  node = config
  for part in dotted.split("."):
    node = node[part]
  return node


# (key, test, what the value must be). Checked before a run writes anything.
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
    ("precision", lambda v: v in ("fp32", "bf16", "fp16"), "one of fp32, bf16, fp16"),
    ("label_smoothing", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("ema_decay", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("data.workers", lambda v: v >= 0, ">= 0"),
    ("data.read_threads", lambda v: v >= 0, ">= 0"),
    ("data.prefetch", lambda v: v >= 0, ">= 0"),
    ("data.eval_batch_size", lambda v: v >= 0, ">= 0 (0 means batch_size)"),
    ("optim.learning_rate", lambda v: v >= 0, ">= 0"),
    ("distributed.heartbeat_timeout_sec", lambda v: v >= 1, ">= 1"),
)


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises InvalidConfigError listing every out-of-range value (one line each)."""
  problems = []
  for key, ok, requirement in _RULES:
    value = get(config, key)
    if not ok(value):
      problems.append(f"{key}={value!r} must be {requirement}")
  if config.grad_accum_steps >= 1 and config.batch_size % config.grad_accum_steps:
    problems.append(f"batch_size={config.batch_size} must be a multiple of "
                    f"grad_accum_steps={config.grad_accum_steps}")
  profile = tuple(config.profile_steps)
  if profile and not (len(profile) == 2 and 1 <= profile[0] <= profile[1]):
    problems.append(f"profile_steps={profile!r} must be (first, last) with 1 <= first <= last")
  if config.total_steps == 0 and config.num_epochs <= 0:
    problems.append(f"num_epochs={config.num_epochs!r} must be > 0 when total_steps is 0")
  from jaxnet.data import transforms  # the eval options' checks live where they are used
  for check, value in ((transforms.check_crop_fraction, config.data.eval_crop_fraction),
                       (transforms.check_interpolation, config.data.eval_interpolation)):
    try:
      check(value)
    except InvalidValueError as e:
      problems.append(str(e))
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
  tuple). Keys the base does not know (a config file's own additions) are kept,
  with lists turned into tuples, the only sequence type configs use.
  """
  if not os.path.exists(path):
    raise MissingFileError(f"{path} not found: is this a workdir written by jaxnet training?")
  saved = read_json(path)
  config = base_config()
  _merge(config, saved)
  return config


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
                                f"Config keys are listed in jaxnet/config_base.py.")
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


def split_command_line(argv: list[str]) -> tuple[list[str], dict]:
  """Takes `--config.KEY=VALUE` (or `--config.KEY VALUE`) out of argv: (rest, {KEY: VALUE})."""
  rest, overrides, i = [], {}, 0
  while i < len(argv):
    arg = argv[i]
    if arg.startswith("--config."):
      key, has_value, value = arg[len("--config."):].partition("=")
      if not has_value:
        if i + 1 >= len(argv):
          raise ConfigOverrideError(f"{arg} needs a value: {arg}=VALUE")
        value, i = argv[i + 1], i + 1
      overrides[key] = value
    else:
      rest.append(arg)
    i += 1
  return rest, overrides


def flatten(overrides: dict, prefix: str = "") -> dict:
  """{"optim": {"learning_rate": 0.1}} and {"optim.learning_rate": 0.1} mean the same."""
  flat = {}
  for key, value in overrides.items():
    if isinstance(value, dict):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat
