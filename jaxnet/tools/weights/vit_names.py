"""jaxnet ViT variable paths -> timm Vision Transformer state-dict names.

For timm's `vit_*_patch16_224` family (and `vit_huge_patch14_224`) (jaxnet's default `flavour=timm`):

  jaxnet                       timm
  cls_token, pos_embed         cls_token, pos_embed (same layout)
  patch_embed                  patch_embed.proj
  blockI/norm1, norm2          blocks.I.norm1, norm2
  blockI/attn/qkv, attn/proj   blocks.I.attn.qkv, attn.proj
  blockI/fc1, fc2              blocks.I.mlp.fc1, mlp.fc2
  norm, head                   norm, head

Leaves: a Dense `kernel` (in, out) is `weight` (out, in), the patch conv's
(H, W, in, out) is (out, in, H, W); LayerNorm `scale` is `weight`. timm's qkv
output is ordered (q/k/v, head, head_dim), as jaxnet's, so it maps unchanged.
"""

import re

from jaxnet.tools.weights import torch_names

Path = tuple[str, ...]

_OWN = ("cls_token", "pos_embed")  # parameters of the model itself, same names in timm
_FIXED = {"patch_embed": "patch_embed.proj", "norm": "norm", "head": "head"}
_IN_BLOCK = {"norm1": "norm1", "norm2": "norm2", "attn/qkv": "attn.qkv", "attn/proj": "attn.proj",
             "fc1": "mlp.fc1", "fc2": "mlp.fc2"}


def _module_to_torch(module: str) -> str | None:
  if module in _FIXED:
    return _FIXED[module]
  m = re.fullmatch(r"block(\d+)/(.+)", module)
  return f"blocks.{m[1]}.{_IN_BLOCK[m[2]]}" if m and m[2] in _IN_BLOCK else None


def _leaves(module: str) -> dict[str, str]:
  is_norm = module.rpartition("/")[2].startswith("norm")
  return torch_names.NORM_LEAVES if is_norm else torch_names.LINEAR_LEAVES


def torch_name(path: Path) -> str | None:
  """The timm name of a jaxnet ViT variable path, or None if it has none."""
  if len(path) == 2 and path[0] == "params" and path[1] in _OWN:
    return path[1]
  return torch_names.params_name(path, _module_to_torch, _leaves)


# Only kernels change layout.
def _refuses(model) -> str | None:
  if model.flavour != "timm":
    return (f"a {model.name} of flavour={model.flavour!r} has no timm counterpart (timm's ViTs have a "
            f"class token and learned position embeddings)")
  return None


FAMILY = torch_names.Family("timm", "timm ViT", torch_name, refuses=_refuses)
