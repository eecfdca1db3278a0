"""Model registry: a name in `config.model.name` -> a Flax module.

Every model is a `flax.linen` module taking NHWC images already normalized and
cast to the compute dtype, with a `train: bool` argument, returning float32
logits. Models with batch norm keep its running statistics in the
`batch_stats` collection; the others have none (an empty collection in the
train state). Models with dropout draw from the `dropout` RNG stream, which the
train step feeds with a key derived from the seed and the step. Add a model by
decorating its factory with `@register("name")`.
"""

import dataclasses
from typing import Callable

import flax.linen as nn

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register(name: str):
  def wrap(factory):
    if name in _REGISTRY:
      raise ValueError(f"model {name!r} is registered twice")
    _REGISTRY[name] = factory
    return factory
  return wrap


def names() -> list[str]:
  return sorted(_REGISTRY)


def create(name: str, **kwargs) -> nn.Module:
  """Builds the registered model `name` with keyword options (num_classes, dtype, ...)."""
  if name not in _REGISTRY:
    raise ValueError(
        f"unknown model {name!r}; set config.model.name to one of: {', '.join(names())}")
  return _REGISTRY[name](**kwargs)


def options(name: str) -> set[str]:
  """The keyword options model `name` accepts (its module's fields), e.g. to pass
  batch-norm settings only to models that have batch norm."""
  module = create(name)
  return {f.name for f in dataclasses.fields(module) if f.init} - {"parent", "name"}


# Importing the model files fills the registry.
from jaxnet.models import alexnet, resnet, vit  # noqa: E402,F401
