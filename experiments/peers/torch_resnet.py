"""Peer 2: PyTorch training-step throughput, same model, batch and precision as jaxnet.

    python experiments/peers/torch_resnet.py --model resnet50 --precisions fp32,bf16,fp16 \
        --batches 64,128,256 --image-size 224 [--compile on|off|auto] \
        [--compile-modes default,max-autotune-no-cudagraphs] [--optimizer fused|foreach|compiled]

The model is torchvision's (`torchvision.models.<name>(weights=None)`) when
torchvision is importable and has it, else our own ResNet v1.5 below (stride on
the 3x3 conv of bottlenecks, as torchvision and jaxnet). `convnext_tiny`..`convnext_large`
and `efficientnet_b0`..`efficientnet_b7` are torchvision's (jaxnet's names are the same), and so
are the segmenters `fcn_resnet50`/`fcn_resnet101`/`deeplabv3_resnet50`/`deeplabv3_resnet101`
(torchvision.models.segmentation, with the auxiliary head, as jaxnet's fcn recipe: per-pixel
cross-entropy on a random label map, the aux head's weighted 0.5). jaxnet's `resnet_tiny`
and `*_small` (3x3 stem) models exist only in our definition. `alexnet` is
torchvision's; the ViTs (`vit_ti16`, `vit_s16`, `vit_b16`, `vit_l16`, jaxnet's
default timm flavour) are timm's `vit_*_patch16_224` at the given image size,
or torchvision's `vit_b_16` / `vit_l_16` without timm. Those need torchvision or
timm; there is no fallback definition for them here.

The step: uint8 NCHW batch (channels_last) already on the device -> normalise
-> forward under autocast (bf16/fp16; none for fp32) -> fp32 cross-entropy ->
backward -> SGD (Nesterov momentum 0.9, weight decay 5e-5 on conv/linear weights
only, like jaxnet). fp16 uses a GradScaler.
The peer at its best (issue 52): each of `--compile-modes` is its own cell (torch.compile's
`mode`: "default", "max-autotune-no-cudagraphs" (Triton autotuning of convolutions and
GEMMs, no CUDA graphs), "max-autotune" (with them), "reduce-overhead"), and the optimizer
step is `--optimizer`: "fused" (torch.optim.SGD(fused=True): one CUDA kernel for all the
parameters, the default on CUDA), "foreach" (torch's multi-tensor default), or "compiled"
(the foreach step inside torch.compile). bench_train.py compares jaxnet with the best of
the cells it gets. fp32 allows TF32 for matmuls
(`set_float32_matmul_precision("high")`), as XLA and cuDNN do for convolutions.
torch.compile: on by default on CUDA, off on CPU (where it needs a C++
toolchain and minutes of compile), `--compile on|off` to force.
On a shared CPU, run with OMP_WAIT_POLICY=PASSIVE (bench_train.py does): with
OpenMP's default spin-waiting, 2 threads on a busy 2-core VM ran a step 100x
slower than 1 thread (measured here: 1.6 s vs 11 ms for resnet_tiny).

Prints one `RESULT {json}` line per (precision, batch), for experiments/bench_train.py;
exits 1 if any of them failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DEPTHS = {18: ([2, 2, 2, 2], "basic"), 34: ([3, 4, 6, 3], "basic"), 50: ([3, 4, 6, 3], "bottleneck"),
          101: ([3, 4, 23, 3], "bottleneck"), 152: ([3, 8, 36, 3], "bottleneck")}


def _bn(channels, zero=False):
  bn = nn.BatchNorm2d(channels)
  if zero:
    nn.init.zeros_(bn.weight)  # residual branch starts as identity, as in jaxnet
  return bn


class Block(nn.Module):
  def __init__(self, kind, cin, filters, stride):
    super().__init__()
    cout = filters * (4 if kind == "bottleneck" else 1)
    if kind == "bottleneck":
      self.body = nn.Sequential(
          nn.Conv2d(cin, filters, 1, bias=False), _bn(filters), nn.ReLU(inplace=True),
          nn.Conv2d(filters, filters, 3, stride, 1, bias=False), _bn(filters), nn.ReLU(inplace=True),
          nn.Conv2d(filters, cout, 1, bias=False), _bn(cout, zero=True))
    else:
      self.body = nn.Sequential(
          nn.Conv2d(cin, filters, 3, stride, 1, bias=False), _bn(filters), nn.ReLU(inplace=True),
          nn.Conv2d(filters, cout, 3, 1, 1, bias=False), _bn(cout, zero=True))
    self.proj = None
    if stride != 1 or cin != cout:
      self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _bn(cout))
    self.out_channels = cout

  def forward(self, x):
    return F.relu(self.body(x) + (x if self.proj is None else self.proj(x)))


class ResNet(nn.Module):
  """Our ResNet v1.5, NCHW; used when torchvision is absent or lacks the model."""

  def __init__(self, stages, kind, num_classes=1000, width=64, stem="imagenet"):
    super().__init__()
    if stem == "imagenet":
      layers = [nn.Conv2d(3, width, 7, 2, 3, bias=False), _bn(width), nn.ReLU(inplace=True),
                nn.MaxPool2d(3, 2, 1)]
    else:
      layers = [nn.Conv2d(3, width, 3, 1, 1, bias=False), _bn(width), nn.ReLU(inplace=True)]
    cin = width
    for stage, blocks in enumerate(stages):
      for b in range(blocks):
        block = Block(kind, cin, width * 2**stage, 2 if stage > 0 and b == 0 else 1)
        layers.append(block)
        cin = block.out_channels
    self.features = nn.Sequential(*layers)
    self.head = nn.Linear(cin, num_classes)
    for m in self.modules():
      if isinstance(m, nn.Conv2d):
        nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

  def forward(self, x):
    return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


SEGMENTERS = ("fcn_", "deeplabv3_")
TIMM_VITS = {"vit_ti16": "vit_tiny_patch16_224", "vit_s16": "vit_small_patch16_224",
             "vit_b16": "vit_base_patch16_224", "vit_l16": "vit_large_patch16_224"}


def create_other(name: str, num_classes: int, image_size: int) -> tuple[nn.Module, str]:
  """AlexNet and the ViTs, from torchvision or timm (no fallback definition here)."""
  if name == "alexnet":
    import torchvision
    return torchvision.models.alexnet(weights=None, num_classes=num_classes), \
        f"torchvision {torchvision.__version__}"
  try:
    import timm
    return timm.create_model(TIMM_VITS[name], pretrained=False, num_classes=num_classes,
                             img_size=image_size), f"timm {timm.__version__} {TIMM_VITS[name]}"
  except ImportError:
    import torchvision
    if name not in ("vit_b16", "vit_l16"):
      raise
    tv_name = name.replace("16", "_16")  # vit_b16 -> vit_b_16
    return getattr(torchvision.models, tv_name)(weights=None, num_classes=num_classes,
                                                image_size=image_size), \
        f"torchvision {torchvision.__version__} {tv_name}"


def create(name: str, num_classes: int, image_size: int = 224) -> tuple[nn.Module, str]:
  """(model, where its definition came from)."""
  if name == "alexnet" or name in TIMM_VITS:
    return create_other(name, num_classes, image_size)
  if name.startswith(SEGMENTERS):
    import torchvision
    return getattr(torchvision.models.segmentation, name)(
        weights=None, weights_backbone=None, num_classes=num_classes, aux_loss=True), \
        f"torchvision {torchvision.__version__} (segmentation, aux head)"
  if name.startswith(("convnext_", "efficientnet_b")):  # torchvision's, under jaxnet's names
    import torchvision
    return getattr(torchvision.models, name)(weights=None, num_classes=num_classes), \
        f"torchvision {torchvision.__version__}"
  if name == "resnet_tiny":
    return ResNet([1, 1, 1], "basic", num_classes, width=16, stem="small"), "ours (jaxnet's resnet_tiny)"
  small = name.endswith("_small")
  depth = name.removeprefix("resnet").removesuffix("_small")
  if not name.startswith("resnet") or not depth.isdigit():
    raise ValueError(f"no PyTorch definition of jaxnet's {name!r} here")
  depth = int(depth)
  if not small:
    try:
      import torchvision
      return getattr(torchvision.models, name)(weights=None, num_classes=num_classes), \
          f"torchvision {torchvision.__version__}"
    except (ImportError, AttributeError, RuntimeError):
      pass
  stages, kind = DEPTHS[depth]
  return ResNet(stages, kind, num_classes, stem="small" if small else "imagenet"), "ours (v1.5)"


def make_optimizer(model, kind: str, device):
  """SGD as jaxnet's recipe (Nesterov, weight decay on conv/linear weights only), stepped by
  one fused kernel ("fused"), torch's multi-tensor loop ("foreach"), or that loop compiled
  ("compiled"); returns (optimizer, step function)."""
  decay = [p for p in model.parameters() if p.ndim > 1]
  no_decay = [p for p in model.parameters() if p.ndim <= 1]
  groups = [{"params": decay, "weight_decay": 5e-5}, {"params": no_decay, "weight_decay": 0.0}]
  options = {"fused": True} if kind == "fused" else {"foreach": device.type == "cuda"}
  opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True, **options)
  return opt, (torch.compile(opt.step) if kind == "compiled" else opt.step)


def fused_sgd_supported(device) -> bool:
  """Whether this torch has a fused SGD for `device` (CUDA, torch >= 2.4 or so)."""
  try:
    torch.optim.SGD([torch.zeros(1, device=device, requires_grad=True)], lr=0.1, momentum=0.9, fused=True)
    return True
  except (RuntimeError, TypeError, ValueError):
    return False


def bench_one(name, precision, batch, image_size, num_classes, steps, warmup, repeats, use_compile,
              device, compile_mode="default", optimizer="foreach"):
  torch.manual_seed(0)
  model, source = create(name, num_classes, image_size)
  model = model.to(device).to(memory_format=torch.channels_last).train()
  opt, opt_step = make_optimizer(model, optimizer, device)
  amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
  scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
  mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
  std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
  gen = torch.Generator().manual_seed(0)
  images = torch.randint(0, 256, (batch, 3, image_size, image_size), dtype=torch.uint8, generator=gen)
  images = images.to(device).contiguous(memory_format=torch.channels_last)
  segmenter = name.startswith(SEGMENTERS)
  label_shape = (batch, image_size, image_size) if segmenter else (batch,)
  labels = torch.randint(0, num_classes, label_shape, generator=gen).to(device)

  def forward_loss(x, y):
    x = ((x.float() - mean) / std).contiguous(memory_format=torch.channels_last)
    with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
      out = model(x)
    if segmenter:  # torchvision's reference: the main head's loss + 0.5 x the aux head's
      return F.cross_entropy(out["out"].float(), y) + 0.5 * F.cross_entropy(out["aux"].float(), y)
    return F.cross_entropy(out.float(), y)

  if use_compile:
    forward_loss = torch.compile(forward_loss, mode=None if compile_mode == "default" else compile_mode)

  def step():
    opt.zero_grad(set_to_none=True)
    loss = forward_loss(images, labels)
    if scaler.is_enabled():
      scaler.scale(loss).backward()
      scaler.step(opt)  # unscales, skips the step on inf/nan (its own opt.step, uncompiled)
      scaler.update()
    else:
      loss.backward()
      opt_step()
    return loss

  sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
  if device.type == "cuda":
    torch.cuda.reset_peak_memory_stats()
  start = time.perf_counter()
  step()
  sync()
  first = time.perf_counter() - start  # includes torch.compile's compile when on
  for _ in range(max(warmup - 1, 0)):
    step()
  sync()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(steps):
      loss = step()
    sync()
    times.append((time.perf_counter() - start) / steps)
  seconds = statistics.median(times)
  peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
  return {"precision": precision, "batch": batch, "img_s": batch / seconds, "ms_step": 1000 * seconds,
          "first_step_s": first, "peak_bytes": peak, "loss": float(loss.detach()), "model_source": source,
          "compiled": bool(use_compile), "compile_mode": compile_mode if use_compile else "eager",
          "optimizer": optimizer, "repeat_ms": [1000 * t for t in times]}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="resnet50")
  parser.add_argument("--precisions", default="fp32,bf16,fp16")
  parser.add_argument("--batches", default="64", help="comma list of batch sizes (one device)")
  parser.add_argument("--image-size", type=int, default=224)
  parser.add_argument("--num-classes", type=int, default=1000)
  parser.add_argument("--steps", type=int, default=20, help="steps per timed repeat")
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
  parser.add_argument("--compile-modes", default="default",
                      help="comma list of torch.compile modes, one cell each: default, "
                           "max-autotune-no-cudagraphs, max-autotune, reduce-overhead")
  parser.add_argument("--optimizer", default="auto", choices=["auto", "fused", "foreach", "compiled"],
                      help="how SGD steps (auto: fused on CUDA, foreach on the CPU)")
  parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
  parser.add_argument("--deadline", type=float, default=0, help="time.time() after which no cell starts")
  args = parser.parse_args(argv)
  if args.threads:
    torch.set_num_threads(args.threads)

  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  use_compile = args.compile == "on" or (args.compile == "auto" and device.type == "cuda")
  optimizer = args.optimizer
  if optimizer == "auto":
    optimizer = "fused" if device.type == "cuda" and fused_sgd_supported(device) else "foreach"
  modes = args.compile_modes.split(",") if use_compile else ["eager"]
  if device.type == "cuda":
    torch.backends.cudnn.benchmark = True  # pick the fastest conv algorithms for these shapes
  torch.set_float32_matmul_precision("high")
  name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
  print("INFO " + json.dumps({"torch": torch.__version__, "device": name, "threads": torch.get_num_threads(),
                              "compile": use_compile, "compile_modes": modes, "optimizer": optimizer}),
        flush=True)
  failed = 0
  for precision in args.precisions.split(","):
    for batch in [int(b) for b in args.batches.split(",")]:
      for mode in modes:
        cell = {"precision": precision, "batch": batch, "compile_mode": mode, "optimizer": optimizer}
        if args.deadline and time.time() > args.deadline:
          print("RESULT " + json.dumps({**cell, "error": "not run: time budget spent"}), flush=True)
          continue
        try:
          result = bench_one(args.model, precision, batch, args.image_size, args.num_classes, args.steps,
                             args.warmup, args.repeats, use_compile, device, mode, optimizer)
        except Exception as e:  # e.g. out of memory at the largest batch: report it, go on
          result = {**cell, "error": f"{type(e).__name__}: {e}"[:300]}
          failed += 1
          if device.type == "cuda":
            torch.cuda.empty_cache()
        if use_compile:
          torch._dynamo.reset()  # the next mode compiles afresh
        print("RESULT " + json.dumps(result), flush=True)
  return 1 if failed else 0  # a failed cell must fail the command that ran it


if __name__ == "__main__":
  sys.exit(main())
