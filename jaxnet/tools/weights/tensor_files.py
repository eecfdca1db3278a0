"""Named-tensor files: .safetensors read and written with numpy alone, .pth read with torch.

A safetensors file is a JSON header (names, dtypes, shapes, and a str->str
metadata dict) followed by raw little-endian arrays; reading it needs no torch.
A .pth is a pickle of torch tensors, so it needs torch.
"""

import os
import pickle

import numpy as np

from jaxnet.core.errors import InvalidValueError, MissingFileError

SAFETENSORS = (".safetensors",)
TORCH_PICKLES = (".pth", ".pt", ".bin")


def read(path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """(tensors by name, metadata) of a .safetensors or .pth file."""
  _check_exists(path)
  if path.endswith(SAFETENSORS):
    from safetensors import SafetensorError, safe_open
    try:
      with safe_open(path, framework="numpy") as f:
        return {name: f.get_tensor(name) for name in f.keys()}, dict(f.metadata() or {})
    except (SafetensorError, OSError) as e:
      raise _unreadable(path, e) from None
  if path.endswith(TORCH_PICKLES):
    return _read_torch(path), {}
  raise InvalidValueError(f"{path}: unknown weights format; use a .safetensors file (or a torch "
                          f"{'/'.join(TORCH_PICKLES)} state dict where torch is installed)")


def read_metadata(path: str) -> dict[str, str]:
  """The metadata of a .safetensors file (only its header is read); {} for other files."""
  _check_exists(path)
  if not path.endswith(SAFETENSORS):
    return {}
  from safetensors import SafetensorError, safe_open
  try:
    with safe_open(path, framework="numpy") as f:
      return dict(f.metadata() or {})
  except (SafetensorError, OSError) as e:
    raise _unreadable(path, e) from None


def _unreadable(path: str, error: Exception) -> InvalidValueError:
  size = os.path.getsize(path) if os.path.exists(path) else 0
  return InvalidValueError(f"weights file {path} ({size} bytes) is not a whole .safetensors file ({error}): "
                           f"an interrupted download or copy leaves one cut short; fetch or export it again")


def _first_line(error: Exception, limit: int = 160) -> str:
  """An exception's first line, cut at `limit` characters, or its type where it has no text."""
  text = str(error).splitlines()[0] if str(error) else type(error).__name__
  return text if len(text) <= limit else text[:limit - 3] + "..."


def write(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
  if not path.endswith(SAFETENSORS):
    raise InvalidValueError(f"{path}: weights are written as .safetensors; name the file *.safetensors")
  from safetensors.numpy import save
  from jaxnet.core.metrics import write_file_atomically
  # np.array(order="C"), not ascontiguousarray, which turns 0-d counters into shape (1,).
  arrays = {k: np.array(v, order="C") for k, v in tensors.items()}
  data = save(arrays, metadata=metadata)

  # The bytes are written by Python, not by safetensors' save_file: its writer reports a full
  # disk as its own exception, without an errno, so the failure was a traceback; Python's
  # OSError becomes one line naming the file and the cause (write_file_atomically), and the
  # old file stays as it was. It holds the file in memory once (ViT-H: 2.5 GB).
  def write(tmp):
    with open(tmp, "wb") as f:
      f.write(data)
  write_file_atomically(path, write)


def _check_exists(path: str) -> None:
  if not os.path.isfile(path):
    raise MissingFileError(f"weights file {path} not found")


def _read_torch(path: str) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError:
    raise InvalidValueError(
        f"{path} is a torch pickle, and reading it needs torch, which is not installed. Convert it "
        f"once where torch is installed: python -c \"import torch, safetensors.torch as st; "
        f"st.save_file(torch.load('{path}', map_location='cpu'), 'model.safetensors')\", then set "
        f"init.weights to the .safetensors file (no torch needed to read it).") from None
  try:
    state = torch.load(path, map_location="cpu", weights_only=True)
  # What torch.load raises on a file cut short or not a state dict (torch 2.13): RuntimeError
  # (a zip archive without its central directory), EOFError (empty), KeyError, ValueError and
  # UnpicklingError (bytes that are no pickle, or a pickle of more than tensors, which
  # weights_only refuses), OSError (unreadable).
  except (RuntimeError, EOFError, KeyError, ValueError, pickle.UnpicklingError, OSError) as e:
    size = os.path.getsize(path)
    raise InvalidValueError(
        f"weights file {path} ({size} bytes) is not a torch state dict jaxnet can read "
        f"({_first_line(e)}): a download or copy cut short leaves one unreadable, and jaxnet reads "
        f"torch files with weights_only=True, running none of their code: fetch it again, or save "
        f"the state dict alone, torch.save(model.state_dict(), PATH), or as .safetensors") from None
  if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
    state = state["state_dict"]  # a training checkpoint wrapping the state dict
  # nn.DataParallel saves every name with a "module." prefix.
  return {name.removeprefix("module."): (t.float() if t.is_floating_point() else t).numpy()
          for name, t in state.items() if isinstance(t, torch.Tensor)}
