"""`config.init`: start a run from pretrained weights (fine-tuning).

`init.weights` names the source: a .safetensors file under PyTorch's names
(read with numpy), a .pth state dict (read with torch, when installed), a jaxnet
workdir (its latest checkpoint, EMA params if it kept an EMA), or
`hf-hub:OWNER/NAME` (through huggingface_hub). A file's tensor names are read
as the model family's: torchvision's for ResNets (timm's plain ResNets share
them) and AlexNet, timm's for ViTs, torchvision's or timm's for ConvNeXts and
EfficientNets (whichever the file uses). Every variable of the model must
come from the source, except the classifier head when it is re-initialised, and
every source tensor must be used; otherwise one error lists each missing,
unused and misshapen tensor.

The head (a detector's: its class logits layer) is kept when `init.keep_head` is on and
the class counts match; else the fresh random head stays and a line says why. The optimizer state is
its init's of these params: SGD/LARS momentum and Adam moments start at zero.
Only a run that starts fresh is initialised this way; a resumed run restores
its checkpoint.
"""

import dataclasses
import functools
import importlib
import json
import pkgutil
import os
from typing import Callable

import jax
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from jaxnet.tools.weights import hub, preprocessing, tensor_files, torch_names
from jaxnet.tools.weights.preprocessing import Preprocessing
from jaxnet.core.errors import InvalidValueError, MissingFileError

Path = tuple[str, ...]


class WeightsMismatchError(ValueError):
  """The source's tensors do not fit the model's variables (`hint`: the fix, where the
  weights' family knows it: Family.unused_hint)."""

  def __init__(self, problems: str, hint: str | None = None):
    super().__init__(problems)
    self.hint = hint


@dataclasses.dataclass
class Source:
  variables: dict[Path, np.ndarray]     # flat jaxnet variables, jaxnet layouts, float32
  unknown: list[str]                    # source tensors that map to no jaxnet variable
  describe: Callable[[Path], str]       # a variable's name in the source's own terms
  class_layer: tuple[str, int] = ("head", 1)  # the model family's (torch_names.Family.class_layer)
  unused_hint: Callable[[list[str]], str | None] = lambda names: None  # its Family.unused_hint


@functools.cache
def families() -> dict[str, tuple[torch_names.Family, ...]]:
  """Model-name prefix -> the PyTorch namings of that family (names and layouts), the default
  first: each `NAME_names.py` of this package is the family of the models named NAME*, or of
  those its MODELS prefixes name (segmentation_names: fcn*, deeplabv3*); a new family is a new
  file. Its FAMILY, or its NAMINGS where it has several (ConvNeXt and EfficientNet:
  torchvision's and timm's)."""
  package = importlib.import_module("jaxnet.tools.weights")
  modules = {m.name.removesuffix("_names"): importlib.import_module(f"{package.__name__}.{m.name}")
             for m in pkgutil.iter_modules(package.__path__) if m.name.endswith("_names") and m.name != "torch_names"}
  return {prefix: getattr(module, "NAMINGS", (module.FAMILY,))
          for name, module in modules.items() for prefix in getattr(module, "MODELS", (name,))}


def namings_of(model: str) -> tuple[torch_names.Family, ...]:
  """The PyTorch namings of model `model` or family `model` ("resnet", "vit", ...), the default first."""
  prefixes = [p for p in families() if model.startswith(p)]
  if prefixes:
    return families()[max(prefixes, key=len)]  # the most specific: "efficientnet_v2" before "efficientnet"
  raise InvalidValueError(f"model {model!r} has no PyTorch tensor names in jaxnet: weights files and "
                          f"hf-hub specs load into {', '.join(p + '*' for p in families())} models "
                          f"(a jaxnet workdir loads into any model)")


def names_of(model: str, names: str | None = None) -> torch_names.Family:
  """The PyTorch names and layouts of model `model` or family `model`: those of `names`
  ("torchvision", "timm"), or by default the family's first naming."""
  namings = namings_of(model)
  if names is None:
    return namings[0]
  for family in namings:
    if family.NAMES == names:
      return family
  known = " and ".join(f"{f.NAMES}'s" for f in namings)
  raise InvalidValueError(f"{model} has no {names} names in jaxnet: it has {known}")


def _naming_used(tensors: dict, target, namings: tuple[torch_names.Family, ...]
                 ) -> tuple[torch_names.Family, dict, list[str]]:
  """(the naming of `namings` that knows the most of the file's tensor names (the default on a
  tie), the variables it reads from them, the names it does not know): a file says by its
  names whose they are, so importing needs no flag."""
  read = [(family, *family.from_torch(tensors, target)) for family in namings]
  return max(read, key=lambda r: len(r[1]))  # max keeps the first of equals: the default


def _describer(families: tuple[torch_names.Family, ...]) -> Callable[[Path], str]:
  """A variable by its name in `families` (each naming's, where the file used none of them)."""
  if len(families) == 1:
    return lambda path: f"{families[0].torch_name(path) or '(no PyTorch name)'} ({'/'.join(path[1:])})"
  return lambda path: (" or ".join(f"{f.torch_name(path) or '(no name)'} ({f.NAMES})" for f in families)
                       + f" ({'/'.join(path[1:])})")


def _describe_jaxnet(path: Path) -> str:
  return "/".join(path)


def _is_workdir(spec: str) -> bool:
  if not os.path.isdir(spec):
    return False
  if not os.path.exists(os.path.join(spec, "config.json")):
    raise MissingFileError(f"init.weights={spec} is a directory without config.json: give a jaxnet "
                           f"workdir, a .safetensors/.pth file or hf-hub:OWNER/NAME")
  return True


def weights_record(spec: str) -> dict:
  """What identifies the init weights `spec` once the run has started from them: a file's
  absolute path and sha256; a workdir or hub name is recorded as given (sha256 None)."""
  from jaxnet.core import provenance
  if os.path.isfile(spec):
    return {"weights": spec, "path": os.path.abspath(spec), "sha256": provenance.file_sha256(spec)}
  return {"weights": spec, "path": os.path.abspath(spec) if os.path.isdir(spec) else None, "sha256": None}


def weights_file_sha256(record: dict | None, spec: str) -> str | None:
  """The sha256 of the file at `spec` now, to compare with the `record` of the init weights a
  run started from (weights_record): "" where the file is missing, None where there is nothing
  to compare (no record; a workdir or hub name, recorded without a sha256)."""
  from jaxnet.core import provenance
  if not record or not record.get("sha256"):
    return None
  return provenance.file_sha256(spec) if os.path.isfile(spec) else ""


def check_weights_record(record: dict, spec: str) -> None:
  """Raises MissingFileError (or InvalidValueError) in one line when the init weights file
  `record` describes (weights_record) is missing at `spec` (or its sha256 differs): the run rereading it would
  start from other weights."""
  now = weights_file_sha256(record, spec)
  if now is None:
    return
  recorded = record["sha256"]
  if not now:
    raise MissingFileError(
        f"the init weights {spec} this run started from are missing (sha256 {recorded[:12]}): put that "
        f"file back at {spec}, or verify without --retrain")
  if now != recorded:
    raise InvalidValueError(
        f"the init weights {spec} are not the file this run started from (sha256 {now[:12]}, recorded "
        f"{recorded[:12]}): put that file back at {spec}, or verify without --retrain")


def load(spec: str, target: dict[Path, tuple], model: str = "resnet") -> Source:
  """The variables of `spec` (a file, a jaxnet workdir or hf-hub:OWNER/NAME) for the model
  whose variables' shapes `target` gives ({path: shape}).

  A file's tensors carry the PyTorch names of `model`'s family (`model` is a
  model name such as "vit_ti16", or a family: "resnet", "vit", "alexnet"), in the naming
  of the family's that knows the most of them where it has several (ConvNeXt, EfficientNet:
  torchvision's, timm's); a tensor that is no variable of `target` under those names is
  unknown. A file in none of them describes the model's variables in each naming's names.
  """
  if _is_workdir(spec):
    from jaxnet.core import config as config_lib
    from jaxnet.tools import predictor
    variables, _ = predictor.load_eval_variables(spec, config_lib.load(spec))
    flat = {p: np.asarray(x, np.float32) for p, x in flatten_dict(variables).items()}
    return Source(flat, [], _describe_jaxnet, _family(model).class_layer)
  namings = namings_of(model)
  path = hub.fetch(spec)[0] if hub.is_hub_spec(spec) else spec
  tensors, _ = tensor_files.read(path)
  family, flat, unknown = _naming_used(tensors, target, namings)
  return Source(flat, unknown, _describer((family,) if flat else namings), family.class_layer,
                family.unused_hint)


def _family(model: str) -> torch_names.Family:
  """Model `model`'s family's default naming; a plain Family (class layer "head", no backbone)
  for a model without PyTorch names (a jaxnet workdir loads into any model)."""
  try:
    return namings_of(model)[0]
  except InvalidValueError:
    return torch_names.Family("", model, lambda path: None)


def preprocessing_of(spec: str, model: str = "") -> tuple[Preprocessing, str]:
  """(the preprocessing `spec`'s weights expect, where that came from); reads no tensors.
  Weights that record none are taken as torchvision's weights of `model` (config.model.name):
  the eval transform torchvision documents for them (preprocessing.TORCHVISION_EVAL)."""
  if _is_workdir(spec):
    from jaxnet.core import config as config_lib
    return preprocessing.of_config(config_lib.load(spec)), f"the config of {spec}"
  if hub.is_hub_spec(spec):
    cfg = hub.fetch(spec)[1]
    if "mean" in cfg:
      return preprocessing.from_timm(cfg), f"timm's pretrained_cfg of {spec}"
  else:
    recorded = tensor_files.read_metadata(spec).get("preprocessing")
    if recorded:
      return Preprocessing.from_json(recorded), f"the metadata of {spec}"
  prep, documented = preprocessing.torchvision_eval(model)
  return prep, f"{documented} ({spec} records none)"


def _wants_weights_preprocessing(config) -> bool:
  mode = config.init.preprocessing
  if mode not in ("weights", "config"):
    raise InvalidValueError(f"init.preprocessing must be 'weights' or 'config', got {mode!r}")
  return bool(config.init.weights) and mode == "weights"


def _recorded(config, workdir: str) -> Preprocessing | None:
  """What WORKDIR/preprocessing.json records for `config.init.weights`, if it does."""
  record = os.path.join(workdir, preprocessing.FILE)
  if not os.path.exists(record):
    return None
  with open(record) as f:
    saved = json.load(f)
  if saved.get("weights") != config.init.weights:
    return None
  return Preprocessing.from_dict(saved["preprocessing"])


def _with(config, prep: Preprocessing | None):
  """`config` with data.* set to `prep` (a copy; `config` itself if nothing changes)."""
  if prep is None or prep == preprocessing.of_config(config):
    return config
  resolved = config.copy_and_resolve_references()
  preprocessing.set_in_config(resolved, prep)
  resolved.lock()
  return resolved


def preprocessing_for(config, workdir: str, log=print) -> tuple:
  """(`config` with the preprocessing its init weights expect (a copy; `config` if unchanged),
  the record to keep in WORKDIR/preprocessing.json, or None where there is nothing new to keep).

  With `init.weights` set and `init.preprocessing="weights"`, data.mean, .std,
  .eval_crop_fraction and .eval_interpolation become the weights' values: read
  from WORKDIR/preprocessing.json when it records them for these weights, else
  fetched from the weights (the hub repository, the file's metadata, the
  workdir's config) and returned as the record to keep, which the workdir's gate writes
  (jaxnet.core.workdir.Workdir), so a resumed run, `--mode=eval`
  (`with_recorded_preprocessing`) and prediction use them without the weights.
  """
  if not _wants_weights_preprocessing(config):
    return config, None
  prep, record = _recorded(config, workdir), None
  if prep is None:
    spec = config.init.weights
    prep, origin = preprocessing_of(spec, config.model.name)
    record = {"weights": spec, "origin": origin, "preprocessing": dataclasses.asdict(prep)}
    log(f"init: preprocessing from {origin}: mean {prep.mean}, std {prep.std}, eval crop fraction "
        f"{prep.crop_fraction}, {prep.interpolation} (set init.preprocessing=config to keep data.*)")
  return _with(config, prep), record


def with_recorded_preprocessing(config, workdir: str):
  """`config` with the preprocessing its run recorded in WORKDIR/preprocessing.json (a copy;
  `config` if none is recorded for its init weights). Reads no weights and writes nothing:
  what `--mode=eval` evaluates a workdir with. A workdir without the record was trained
  with the config's data.*."""
  if not _wants_weights_preprocessing(config):
    return config
  return _with(config, _recorded(config, workdir))


def _class_layer(target, source: Source) -> str | None:
  """The module of `target` whose outputs are per class (its family's: Family.class_layer)."""
  layer = source.class_layer[0]
  return layer if any(p[1] == layer for p in target) else None


def _head_reason(layer: str | None, per_class: int, target: dict[Path, tuple], source: dict[Path, np.ndarray],
                 keep_head: bool) -> str | None:
  """Why the fresh class layer `layer` (`_class_layer`, `per_class` outputs per class) stays
  (None: the source's is loaded). `target` maps paths to shapes."""
  if layer is None:
    return None
  if not keep_head:
    return "init.keep_head=False"
  if not any(p[1] == layer for p in source):
    return "the weights have no classifier"
  # The layer's bias (a segmenter's class layer holds two convolutions: its first bias).
  bias = next((p for p in target if p[1] == layer and p[-1] == "bias"), None)
  if bias in source and source[bias].shape != tuple(target[bias]):
    return (f"the weights have {source[bias].shape[0] // per_class} classes, "
            f"this run {target[bias][0] // per_class}")
  return None


def fill(target: dict[Path, tuple], source: Source, keep_head: bool, spec: str = "the weights"):
  """The source's value for each target path -> ({path: array}, head_reason).

  `target` maps paths to shapes. Paths of a re-initialised head are left out
  of the result. Raises WeightsMismatchError listing every problem at once.
  """
  layer = _class_layer(target, source)
  reason = _head_reason(layer, source.class_layer[1], target, source.variables, keep_head)
  skip = {p for p in (*target, *source.variables) if reason and p[1] == layer}
  missing = [p for p in target if p not in source.variables and p not in skip]
  unused = [p for p in source.variables if p not in target and p not in skip]
  misshapen = [p for p in target if p in source.variables and p not in skip
               and tuple(source.variables[p].shape) != tuple(target[p])]
  if missing or unused or misshapen or source.unknown:
    lines = [f"{spec} does not fit the model:"]
    lines += [f"  missing from the weights: {source.describe(p)} {tuple(target[p])}" for p in missing]
    lines += [f"  not used by the model: {source.describe(p)}" for p in unused]
    lines += [f"  not used by the model: {name}" for name in source.unknown]
    lines += [f"  shape differs: {source.describe(p)} is {tuple(source.variables[p].shape)}, the model "
              f"needs {tuple(target[p])} (jaxnet layout)" for p in misshapen]
    hint = source.unused_hint([source.describe(p) for p in unused] + list(source.unknown))
    lines.append(f"({len(lines) - 1} problems; {hint or 'is config.model.name the architecture of the weights?'})")
    raise WeightsMismatchError("\n".join(lines), hint)
  return {p: source.variables[p] for p in target if p not in skip}, reason


def _place(value: np.ndarray, like: jax.Array) -> jax.Array:
  """`value` as a global array with `like`'s dtype and sharding (multi-host safe)."""
  value = np.asarray(value, like.dtype)
  return jax.make_array_from_callback(like.shape, like.sharding, lambda index: value[index])


def _variables(flat: dict[Path, jax.Array]) -> dict:
  """{"params": ..., "batch_stats": ...} from flat variables: a model without BN (ConvNeXt, ViT)
  has no flat path under batch_stats, and unflattening alone would leave that key out of the
  variables the train state is made from."""
  return {"batch_stats": {}, **unflatten_dict(flat)}


def initialiser(config, log=print, loaded: dict | None = None):
  """`init_params(variables) -> variables` for jaxnet.core (Experiment.init_state): the params
  and BN statistics from `config.init.weights`, placed as the abstract `variables` say (dtype,
  sharding); those the weights do not give (a re-initialised class layer) are left abstract,
  for the model's init to compute.
  `loaded`, when given, is filled with what was done: {"arrays": how many came from the
  weights, "of": the model's count, "head": why the class layer was re-initialised or None,
  "head_arrays": how many arrays that layer has}."""
  spec = config.init.weights
  loaded = {} if loaded is None else loaded

  def init_params(variables):
    target = flatten_dict(variables)
    shapes = {p: x.shape for p, x in target.items()}
    source = load(spec, shapes, config.model.name)
    backbone = _family(config.model.name).backbone
    if backbone and not any(p[1] == backbone[0] for p in source.variables):
      return init_backbone(target, *backbone)  # a plain network's weights for the backbone of a model
    try:
      values, reason = fill(shapes, source, config.init.keep_head, f"init.weights={spec}")
    except WeightsMismatchError as e:  # the import and init.weights in training: one line
      raise InvalidValueError(_another_architecture(spec, config, str(e), e.hint)) from None
    layer = _class_layer(shapes, source)
    loaded.update(arrays=len(values), of=len(target), head=reason,
                  head_arrays=sum(1 for p in shapes if reason and p[1] == layer))
    if jax.process_index() == 0:
      head = f"; classifier head re-initialised: {reason}" if reason else ""
      log(f"init: {len(values)} of {len(target)} variables from {spec}{head}")
    return _variables({p: _place(values[p], x) if p in values else x for p, x in target.items()})

  def init_backbone(target, module: str, family: str):
    """A model with a backbone (its family's Family.backbone: RetinaNet's ResNet) from a plain
    network's weights (ImageNet's, under the backbone's own names): that network's class layer
    left out, the rest fresh."""
    shapes = {p[:1] + p[2:]: x.shape for p, x in target.items() if p[1] == module}
    source = load(spec, shapes, family)
    head = {p for p in source.variables if p[1] == source.class_layer[0]}
    head_names = {names_of(family).torch_name(("params", source.class_layer[0], leaf)) for leaf in ("kernel", "bias")}
    source = dataclasses.replace(source, variables={p: v for p, v in source.variables.items() if p not in head},
                                 unknown=[n for n in source.unknown if n not in head_names])
    values, _ = fill(shapes, source, keep_head=False, spec=f"init.weights={spec}")
    values = {p[:1] + (module,) + p[1:]: v for p, v in values.items()}
    loaded.update(arrays=len(values), of=len(target), head="only the backbone is in the weights",
                  head_arrays=len(target) - len(values))
    if jax.process_index() == 0:
      log(f"init: {len(values)} of {len(target)} variables (the backbone's) from {spec}")
    return _variables({p: _place(values[p], x) if p in values else x for p, x in target.items()})

  return init_params


def import_to_workdir(config, workdir: str, spec: str, log=print, data: bool = True) -> dict:
  """A jaxnet workdir from pretrained weights, without training: `config`'s model and data
  with its params and BN statistics from `spec` (a .safetensors/.pth file under torchvision/
  timm names, hf-hub:OWNER/NAME, or another workdir) and the preprocessing they expect,
  saved as the checkpoint of step 0 with config.json, classes.json, environment.json and
  init_weights.json (the weights' path and sha256),
  through the workdir's gate (its lock: a workdir a training run holds is refused).
  Eval, predict and export take it as they take a trained workdir, and training it resumes
  from step 0, a fine-tune of the weights. Returns what was loaded (`initialiser`'s `loaded`:
  "arrays" from the weights, "of" the model's, "head" why its class layer was re-initialised,
  "head_arrays"; "classes": the head's width). Weights that do not fit the model are one error naming both architectures,
  and a failed import leaves nothing behind: a workdir it created is removed, a file it wrote
  into one that was there (preprocessing.json) too.

  `data=False` (--no-data) reads none of the recipe's data: the head is as wide as the
  weights' (config.model.num_classes, where set, instead), the classes are recorded without
  names (predict shows their indices) and the checkpoint holds no data position; the first
  training of the workdir reads its data, starts the data order afresh and records the
  names. With data, data that is not there is one line naming --no-data."""
  from jaxnet.core import workdir as workdir_lib
  workdir_lib.check_path(workdir)
  existed = os.path.isdir(workdir)
  before = set(os.listdir(workdir)) if existed else set()
  try:
    return _import(config, workdir, spec, log, data)
  except workdir_lib.WorkdirLockedError:
    raise  # another run holds the workdir and writes into it: nothing here is this import's
  except BaseException:
    import shutil
    if not existed:
      shutil.rmtree(workdir, ignore_errors=True)
    elif os.path.isdir(workdir):
      for name in set(os.listdir(workdir)) - before:
        path = os.path.join(workdir, name)
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
    raise


def _import(config, workdir: str, spec: str, log, data: bool) -> dict:
  from jaxnet.core import provenance
  from jaxnet.core import workdir as workdir_lib
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.init.weights = spec
  config.lock()
  with workdir_lib.Workdir.open(workdir, workdir_lib.IMPORT) as gate:
    config, record = preprocessing_for(config, workdir, log)
    config_json = config.to_json_best_effort(indent=2)
    gate.check(json.loads(config_json))
    exp = _experiment(config, spec, data)
    loaded = {}
    state = exp.init_state(initialiser(config, log=log, loaded=loaded))
    loaded["classes"] = exp.num_classes
    if record:
      gate.write_json(preprocessing.FILE, record)
    # What the weights were (a file's sha256), as a training from init.weights keeps it: verify's row.
    gate.write_json(provenance.INIT_WEIGHTS_FILE, weights_record(spec))
    checkpoints = gate.checkpoints(async_save=False)
    try:
      if data:
        with exp.device_batches() as batches:  # the data position of a run at step 0
          checkpoints.save(0, state, batches.position, json.loads(config_json))
      else:  # none: the first training starts its data order afresh
        checkpoints.save(0, state, None, json.loads(config_json))
    finally:
      checkpoints.close()
    gate.record_config(config_json, 0)
    gate.record_data_identity(0)  # {}: an import saw no data, a fine-tune's resume records its own
    gate.drop_records_after(0)  # another run's metrics (a workdir without checkpoints) are not these weights'
    # Without data: no class names (predict shows indices) and no run length, until a training records them.
    gate.write_run_info(total_steps=exp.total_steps, steps_per_epoch=exp.steps_per_epoch,
                        num_classes=exp.num_classes, class_names=exp.class_names)
  return loaded


def _experiment(config, spec: str, data: bool):
  """The import's Experiment: from the recipe's data (whose absence is one line naming
  --no-data), or, without data, with the head as wide as the weights' (or config.model.num_classes)."""
  from jaxnet.core.experiment import Experiment
  if not data:
    return Experiment(config, need_train_data=False,
                      classes_without_data=config.model.num_classes or classes_of(spec, config))
  try:
    return Experiment(config)
  except MissingFileError as e:  # the sources' word for data that is not there
    first = str(e).strip().splitlines()[0].rstrip(":. ")
    raise MissingFileError(f"the recipe's data is not there ({first}): import the weights without it with "
                           f"--no-data, or give it with --config.data.dir=DIR") from None


def classes_of(spec: str, config) -> int:
  """How many classes the class layer of `spec`'s weights has, read as config.model.name's
  (its family's class layer); a one-line error where the weights have none, or are another
  architecture's (as the import with data says it)."""
  from jaxnet.core import models
  module = models.from_config(config.model, 1, np.float32)
  size = config.image_size
  abstract = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), np.zeros((1, size, size, len(config.data.mean)),
                                                                                 np.float32), train=False))
  shapes = {p: tuple(x.shape) for p, x in flatten_dict(abstract).items()}
  source = load(spec, shapes, config.model.name)
  layer, per_class = source.class_layer
  # The layer's first bias the weights have (a segmenter's class layer holds two convolutions,
  # its auxiliary one optional).
  bias = next((p for p in shapes if p[1] == layer and p[-1] == "bias" and p in source.variables), None)
  if bias is None:
    try:  # the weights of another architecture are said so, as the import says it with data
      fill(shapes, source, keep_head=False, spec=spec)
    except WeightsMismatchError as e:
      raise InvalidValueError(_another_architecture(spec, config, str(e), e.hint)) from None
    raise InvalidValueError(f"{spec} has no class layer for a {config.model.name} to take its class count from: "
                            f"set --config.model.num_classes=N for the head to train")
  return source.variables[bias].shape[0] // per_class


def _another_architecture(spec: str, config, problems: str, hint: str | None = None) -> str:
  """One line for weights that do not fit config.model.name: the architecture they fit, when
  one of jaxnet's models does (or the family's `hint`), and the first of `problems` (fill's list)."""
  model = config.model.name
  lines = problems.splitlines()
  count = len(lines) - 2
  if hint:
    return f"{spec} does not fit this {model}: {count} tensors do not, e.g. {lines[1].strip()}; {hint}"
  fits = architecture_of(spec, config.image_size, model)
  what = f"the weights of a {fits}" if fits else "weights of no jaxnet model of their names"
  fix = (f"set --config.model.name={fits}, or import weights of a {model}" if fits
         else f"import weights of a {model}")
  return (f"{spec} holds {what}, not of a {model} (config.model.name): {count} tensor"
          f"{'s do' if count != 1 else ' does'} not fit, e.g. {lines[1].strip()}. {fix[0].upper()}{fix[1:]}")


def architecture_of(spec: str, image_size: int, model: str) -> str | None:
  """The first jaxnet model (`model`'s family first) whose variables `spec`'s tensors fill,
  the class layer aside; None if none does. Only shapes are traced (jax.eval_shape)."""
  from jaxnet.core import models
  if _is_workdir(spec):
    from jaxnet.core import config as config_lib
    return config_lib.load(spec).model.name
  path = hub.fetch(spec)[0] if hub.is_hub_spec(spec) else spec
  tensors, metadata = tensor_files.read(path)
  family = max((p for p in families() if model.startswith(p)), key=len, default="")
  recorded = metadata.get("model")  # a jaxnet export names its model

  def order(name):  # the recorded model, then the config's family, smallest first (cheap to trace)
    import re
    depth = int((re.findall(r"\d+", name) or ["0"])[0])
    return (name != recorded, not name.startswith(family), depth, name)

  candidates = sorted((n for n in models.names() if n != model and any(n.startswith(p) for p in families())),
                      key=order)
  # A family none of whose names the file uses (a ResNet's file and ConvNeXt's "features.*")
  # is passed over after its first member: tracing each model costs 1-4 s on a CPU.
  foreign = set()
  for name in candidates:
    namings = namings_of(name)
    if namings in foreign:
      continue
    try:
      module = models.create(name, num_classes=10)
      abstract = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0),
                                                    np.zeros((1, image_size, image_size, 3), np.float32),
                                                    train=False))
      shapes = {p: tuple(x.shape) for p, x in flatten_dict(abstract).items()}
      family, flat, unknown = _naming_used(tensors, shapes, namings)
      if not flat:
        foreign.add(namings)
        continue
      fill(shapes, Source(flat, unknown, _describe_jaxnet, family.class_layer), keep_head=False)
    except (WeightsMismatchError, KeyError, ValueError, TypeError):  # not this one
      continue
    return name
  return None
