"""A workdir's checkpoints read as plain files, without orbax and without arrays: whether
there are any, and the config the newest one carries. For the checks a run makes before
it opens anything (jaxnet/workdir.py, jaxnet/train.py)."""

import json
import os

# The names of jaxnet/checkpoint.py's layout: WORKDIR/checkpoints/<step>/config/.
CHECKPOINTS_DIR, CONFIG = "checkpoints", "config"


def has_checkpoints(workdir: str) -> bool:
  """Whether WORKDIR/checkpoints holds any step directory (intact or not), without opening it."""
  directory = os.path.join(workdir, CHECKPOINTS_DIR)
  return os.path.isdir(directory) and any(d.isdigit() for d in os.listdir(directory))


# The file in which orbax's JsonCheckpointHandler keeps an item (here: config/).
JSON_ITEM_FILE = "metadata"


def newest_saved_config(workdir: str) -> tuple[int, dict] | tuple[None, None]:
  """(step, config dict) of the newest checkpoint whose saved config reads, or (None, None).

  Every checkpoint carries the config that wrote it, so a workdir whose config.json
  was deleted still knows what run it holds. Reads the files directly: no orbax
  manager, no arrays, nothing written.
  """
  directory = os.path.join(workdir, CHECKPOINTS_DIR)
  if not os.path.isdir(directory):
    return None, None
  for step in sorted((int(d) for d in os.listdir(directory) if d.isdigit()), reverse=True):
    try:
      with open(os.path.join(directory, str(step), CONFIG, JSON_ITEM_FILE)) as f:
        config = json.load(f)
    except (OSError, ValueError):
      continue  # an incomplete or damaged checkpoint: an older one may still say
    if isinstance(config, dict):
      return step, config
  return None, None
