"""Model registry: a name in `config.model.name` -> a Flax module.

Every model is a `flax.linen` module taking NHWC images already normalized and
cast to the compute dtype, with a `train: bool` argument, returning float32
logits. Add a model by decorating its factory with `@register("name")`.
"""

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


# Importing the model files fills the registry.
from jaxnet.models import resnet  # noqa: E402,F401
