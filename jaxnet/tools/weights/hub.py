"""`hf-hub:timm/NAME`: a model.safetensors and its preprocessing from the Hugging Face Hub.

huggingface_hub (the optional extra `jaxnet-train[hub]`) downloads into its cache
(~/.cache/huggingface), so later runs read the cached file without network.
"""

import json

from jaxnet.core.errors import InvalidValueError

PREFIX = "hf-hub:"


def is_hub_spec(spec: str) -> bool:
  return spec.startswith(PREFIX)


def fetch(spec: str) -> tuple[str, dict]:
  """(local path of the repository's model.safetensors, timm's pretrained_cfg)."""
  repo = spec[len(PREFIX):]
  if repo.count("/") != 1:
    raise InvalidValueError(f"init.weights={spec!r}: a hub spec is hf-hub:OWNER/NAME, "
                            f"e.g. hf-hub:timm/resnet50.tv_in1k")
  try:
    from huggingface_hub import hf_hub_download
  except ImportError:
    raise InvalidValueError(f"init.weights={spec} needs huggingface_hub: pip install 'jaxnet-train[hub]' (or "
                            f"download model.safetensors yourself and set init.weights to its path)") from None
  try:
    weights = _download(hf_hub_download, repo, "model.safetensors")
    config_path = _download(hf_hub_download, repo, "config.json")
  # Failures come from several layers (HTTP client, hub errors, the offline
  # switch, the cache on disk); each gets the same one-line answer.
  except Exception as e:  # noqa: BLE001
    raise InvalidValueError(
        f"cannot fetch {spec} from the Hugging Face Hub ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else 'no detail'}). Without network access, download "
        f"model.safetensors from https://huggingface.co/{repo} on another machine and set "
        f"init.weights to its path.") from None
  with open(config_path) as f:
    config = json.load(f)
  # timm's config.json nests the preprocessing under "pretrained_cfg"; older
  # uploads are that dict alone.
  return weights, config.get("pretrained_cfg", config)


def _download(hf_hub_download, repo: str, filename: str) -> str:
  """The cached copy if there is one (no network, no retries), else a download."""
  try:
    return hf_hub_download(repo, filename, local_files_only=True)
  except Exception:  # noqa: BLE001  (not cached: each hub version names this differently)
    return hf_hub_download(repo, filename)

