"""Durations in steps, from config keys given in steps or in epochs.

A duration named PREFIX can be set as PREFIX_steps or PREFIX_epochs: a number of
steps > 0 wins, else the epochs are converted with this run's steps per epoch
(dataset size // batch_size), so an epoch-based cadence keeps its meaning when
batch_size is overridden. The pairs:
  total_steps / num_epochs                        the run's length
  optim.warmup_steps / optim.warmup_epochs        learning-rate warmup
  eval_every_steps / eval_every_epochs            periodic eval (0: only the final one)
  checkpoint_every_steps / checkpoint_every_epochs  periodic checkpoints (0: only the final one)
"""

import math

from jaxnet import config_io

# prefix -> (steps key, epochs key), dotted keys of the config.
PAIRS = {
    "total": ("total_steps", "num_epochs"),
    "warmup": ("optim.warmup_steps", "optim.warmup_epochs"),
    "eval_every": ("eval_every_steps", "eval_every_epochs"),
    "checkpoint_every": ("checkpoint_every_steps", "checkpoint_every_epochs"),
}


def steps(config, prefix: str, steps_per_epoch: int) -> int:
  """The duration `prefix` in steps: its _steps key if > 0, else its _epochs key converted."""
  steps_key, epochs_key = PAIRS[prefix]
  n = config_io.get(config, steps_key)
  if n > 0:
    return int(n)
  return math.ceil(config_io.get(config, epochs_key) * steps_per_epoch)
