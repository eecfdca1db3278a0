"""What a compiled XLA:GPU program does, read from its optimized HLO text.

jaxnet/tools/gpu_plan.py compiles the train step for a GPU target on a machine without one
and hands `compiled.as_text()` to `analyse`, which parses it (computations, instructions,
shapes, attributes) and reads it into kernels, FLOPs and HBM bytes. Only the text is read
(no jax, no device), so the parsing and the rules are unit-tested on small HLO snippets.

What counts as a kernel: each fusion and each library call (cuDNN, cuBLAS, ...) in
the computations that run on the device, i.e. the entry computation and the bodies
of its while loops and conditionals, not the computations fused into a kernel
or used as a reduction's combiner. A while body counts once per known trip.
FLOPs are the convolutions' and matmuls' (2 per multiply-add); elementwise work is
left out, as it is small beside them and bound by memory, which HBM bytes count:
each kernel's operands plus results, so a lower bound (no re-reads, no spills).
"""

from __future__ import annotations

import collections
import dataclasses
import re


# --- the text --------------------------------------------------------------------------

# Bytes per element of each HLO element type (a missing one counts as 4).
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
               "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
               "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e4m3b11fnuz": 1, "f8e5m2fnuz": 1,
               "f8e4m3fnuz": 1, "s4": 0.5, "u4": 0.5, "token": 0}

# A convolution's dim_labels (b: batch, f: feature, digits: spatial) -> the layout's usual name.
LAYOUT_NAMES = {"b01f": "NHWC", "bf01": "NCHW", "b012f": "NDHWC", "bf012": "NCDHW", "b0f": "NWC",
                "bf0": "NCW"}

_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")


@dataclasses.dataclass
class Instruction:
  name: str
  shape: str      # the result's shape text, a tuple "(a, b)" for several results
  opcode: str
  operands: list  # names of the operand instructions
  attrs: str      # everything after the operand list
  root: bool = False


@dataclasses.dataclass
class Computation:
  name: str
  instructions: list
  entry: bool = False

  def __post_init__(self):
    self.by_name = {i.name: i for i in self.instructions}

  @property
  def root(self):
    return next((i for i in self.instructions if i.root), self.instructions[-1])


def balanced(text: str, start: int) -> int:
  """Index just past the bracket group opening at text[start]."""
  depth, pairs = 0, {"(": ")", "{": "}", "[": "]"}
  closers = set(pairs.values())
  quoted = False
  for i in range(start, len(text)):
    c = text[i]
    if c == '"' and text[i - 1] != "\\":
      quoted = not quoted
    elif quoted:
      continue
    elif c in pairs:
      depth += 1
    elif c in closers:
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


def parse_instruction(line: str) -> Instruction | None:
  m = _INSTR.match(line)
  if not m:
    return None
  root, name, rest = bool(m.group(1)), m.group(2), m.group(3)
  if rest.startswith("("):
    end = balanced(rest, 0)
  else:
    end = rest.find(" ")
    # A layout with tiling, "{1,0:T(8,128)}", holds no spaces; the type ends at the first space.
  shape, rest = rest[:end], rest[end:].lstrip()
  m = re.match(r"([\w\-]+)\(", rest)
  if not m:
    return None
  opcode = m.group(1)
  close = balanced(rest, m.end() - 1)
  operand_text, attrs = rest[m.end():close - 1], rest[close:]
  operands = re.findall(r"%([\w.\-]+)", operand_text)
  if not operands and operand_text.strip() and opcode not in ("constant", "parameter"):
    operands = [t.strip().split()[-1] for t in operand_text.split(",") if t.strip()]
  return Instruction(name, shape, opcode, operands, attrs, root)


def parse_module(text: str) -> dict:
  """HLO module text -> {computation name: Computation}."""
  computations, current, lines = {}, None, []
  for line in text.splitlines():
    if current is None:
      m = _HEADER.match(line.strip())
      if m:
        current, lines = (m.group(2), bool(m.group(1))), []
      continue
    if line.strip() == "}":
      instructions = [i for i in map(parse_instruction, lines) if i]
      if instructions:
        computations[current[0]] = Computation(current[0], instructions, entry=current[1])
      current = None
      continue
    lines.append(line)
  return computations


def arrays(shape: str) -> list:
  """'(bf16[2,3]{1,0}, u8[0]{0})' -> [('bf16', (2, 3)), ('u8', (0,))]."""
  return [(d, tuple(int(x) for x in dims.split(",") if x)) for d, dims in _SHAPE.findall(shape)]


def elements(dims) -> int:
  n = 1
  for d in dims:
    n *= d
  return n


def nbytes(shape: str) -> float:
  return sum(elements(dims) * DTYPE_BYTES.get(dtype, 4) for dtype, dims in arrays(shape))


def layout_name(labels: str) -> str:
  return LAYOUT_NAMES.get(labels, labels)


def attribute(attrs: str, key: str) -> str | None:
  m = re.search(rf"\b{key}=(%?[\w.\-$>]+|\"[^\"]*\"|\{{[^}}]*\}})", attrs)
  return m.group(1).strip('"').lstrip("%") if m else None


def called(attrs: str, key: str) -> list:
  m = re.search(rf"\b{key}=(\{{[^}}]*\}}|%?[\w.\-]+)", attrs)
  return re.findall(r"[\w.\-]+", m.group(1).replace("%", "")) if m else []


def backend_config(attrs: str) -> str:
  i = attrs.find("backend_config=")
  if i < 0:
    return ""
  start = i + len("backend_config=")
  if attrs[start:start + 1] == "{":
    return attrs[start:balanced(attrs, start)]
  m = re.match(r'"((?:[^"\\]|\\.)*)"', attrs[start:])
  return m.group(1).encode().decode("unicode_escape") if m else ""


def op_name(attrs: str) -> str:
  """The instruction's metadata op_name: jax's name stack (jit, jvp/transpose, the model's
  named scopes: flax modules, jaxnet's step scopes) and the primitive, "" when it has none."""
  m = re.search(r'\bop_name="([^"]*)"', attrs)
  return m.group(1) if m else ""


# --- what it does ---------------------------------------------------------------------

# cuDNN / cuBLAS custom-call targets, by what they compute.
CONV_TARGETS = {"__cudnn$convForward": "forward", "__cudnn$convBackwardInput": "backward-input",
                "__cudnn$convBackwardFilter": "backward-filter",
                "__cudnn$convBiasActivationForward": "fused", "__cudnn$convForwardGraph": "fused"}
GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all",
               "collective-broadcast", "ragged-all-to-all")
# Instructions that launch nothing: bookkeeping, views, and the second half of async pairs.
NO_KERNEL = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
             "partition-id", "replica-id", "add-dependency", "opt-barrier", "domain",
             "copy-done", "send-done", "recv-done", "async-done", "async-update", "iota"}


def conv_flops(forward_output_dims, filter_dims, filter_labels: str) -> int:
  """2 x (forward output elements) x (filter elements per output feature): the multiply-adds
  of the forward convolution, which its backward-input and backward-filter also do."""
  out_features = filter_dims[filter_labels.index("o")] if "o" in filter_labels else 1
  return 2 * elements(forward_output_dims) * elements(filter_dims) // max(out_features, 1)


def attention_flops(q_dims, k_dims, backward: bool) -> int:
  """A fused attention call's FLOPs from its q and k operands in jax's (batch, tokens, heads,
  head dim) layout: softmax(q k^T) v is two matmuls of 2 * B * N * Tq * Tk * H each; the
  backward pass counts twice the forward's (the model-FLOPs convention, no recomputation)."""
  if len(q_dims) != 4 or len(k_dims) != 4:
    return 0
  b, tq, n, h = q_dims
  forward = 2 * 2 * b * n * tq * k_dims[1] * h
  return 2 * forward if backward else forward


def dot_flops(output_dims, lhs_dims, contracting) -> int:
  return 2 * elements(output_dims) * elements(lhs_dims[d] for d in contracting)


@dataclasses.dataclass
class Kernel:
  name: str
  kind: str        # fusion, conv, gemm, attention, library, collective, transpose, other
  flops: int
  bytes: float
  dtype: str       # the dtype its FLOPs run in ("" when none)
  count: int = 1   # launches per step (a while body's trip count)
  op_name: str = ""  # the jax name stack that made it (HLO metadata): which layer, which pass
  part: str = ""     # what it does there, from the HLO: a convolution's kind, else ""


@dataclasses.dataclass
class Analysis:
  kernels: list = dataclasses.field(default_factory=list)
  convolutions: list = dataclasses.field(default_factory=list)  # dicts: kind, layout, dim_labels, dtype
  gemms: list = dataclasses.field(default_factory=list)         # dicts: kind, dtype, shape
  attention: list = dataclasses.field(default_factory=list)     # dicts: target, shape
  transposes: list = dataclasses.field(default_factory=list)    # dicts: op, shape, bytes, size, inside
  collectives: list = dataclasses.field(default_factory=list)   # dicts: op, bytes, operands, combined

  @property
  def kernel_count(self) -> int:
    return sum(k.count for k in self.kernels if k.kind != "collective")

  @property
  def flops(self) -> int:
    return sum(k.flops * k.count for k in self.kernels)

  @property
  def hbm_bytes(self) -> float:
    return sum(k.bytes * k.count for k in self.kernels if k.kind != "collective")

  def counts(self, items: str, key: str) -> dict:
    """E.g. counts("convolutions", "kind") -> {"forward": 53, ...}, counting repeats."""
    counter = collections.Counter()
    for item in getattr(self, items):
      counter[item[key]] += item.get("count", 1)
    return dict(counter)

  def transposes_of(self, size: str) -> list:
    return [t for t in self.transposes if t["size"] == size]

  def roofline_seconds(self, peak_flops: dict, bandwidth: float) -> float:
    """Sum over kernels of max(FLOPs at the dtype's peak, bytes at the HBM bandwidth): a lower
    bound on the step time, with kernels one after another and each at its own roofline."""
    total = 0.0
    for k in self.kernels:
      if k.kind == "collective":
        continue
      peak = peak_flops.get(k.dtype) or max(peak_flops.values())
      total += k.count * max(k.flops / peak, k.bytes / bandwidth)
    return total


def analyse(text: str, *, weight_elements=(), min_activation_elements: int = 0) -> Analysis:
  """The optimized HLO `text` of one program -> an Analysis.

  A transpose or copy is *weight-sized* when its element count is that of one of
  `weight_elements` (the model's parameter sizes), *activation-sized* when it has at
  least `min_activation_elements` elements otherwise, else small.
  """
  computations = parse_module(text)
  entry = next((c for c in computations.values() if c.entry), None)
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text")
  weights = set(weight_elements)
  result = Analysis()

  def size_class(n: int) -> str:
    if n in weights:
      return "weight"
    return "activation" if n >= min_activation_elements else "small"

  def shape_of(comp, name):
    i = comp.by_name.get(name)
    return i.shape if i else ""

  def first_array(shape):
    a = arrays(shape)
    return a[0] if a else ("", ())

  def collective(comp, instr, op, count):
    operand_shapes = [shape_of(comp, o) for o in instr.operands]
    size = sum(nbytes(s) for s in operand_shapes)
    values = sum(elements(dims) for s in operand_shapes for _, dims in arrays(s))
    # Combined: several tensors in one collective, as operands or concatenated into one buffer.
    concatenated = any(computations[n].root.opcode == "concatenate"
                       for o in instr.operands if o in comp.by_name
                       for n in called(comp.by_name[o].attrs, "calls") if n in computations)
    result.collectives.append({"op": op, "bytes": size, "elements": values, "operands": operand_shapes,
                               "combined": len(instr.operands) > 1 or concatenated, "count": count,
                               "overlapped": overlapped(comp, instr)})
    result.kernels.append(Kernel(instr.name, "collective", 0, size, "", count))

  def overlapped(comp, start):
    """Whether the schedule (the order of a scheduled module's instructions) puts a compute
    kernel between an asynchronous collective's start and its done. A synchronous one, or one
    with nothing between, is exposed: the GPU waits for it."""
    if not (start.opcode.endswith("-start") or start.opcode == "async-start"):
      return False
    at = comp.instructions.index(start)
    for i in comp.instructions[at + 1:]:
      if start.name in i.operands and (i.opcode.endswith("-done") or i.opcode == "async-done"):
        return False
      if i.opcode in ("fusion", "custom-call", "convolution", "dot"):
        return True
    return False

  def inside_fusion(fused, kernel_name, count):
    """FLOPs and dtype of the dots/convolutions in a fused computation; its transposes and copies."""
    flops, dtype = 0, ""
    for i in fused.instructions:
      if i.opcode in ("transpose", "copy"):
        dt, dims = first_array(i.shape)
        result.transposes.append({"op": i.opcode, "shape": i.shape.split("{")[0], "bytes": nbytes(i.shape),
                                  "size": size_class(elements(dims)), "inside": kernel_name,
                                  "count": count})
      elif i.opcode == "dot":
        dt, out = first_array(i.shape)
        _, lhs = first_array(shape_of(fused, i.operands[0]))
        contracting = [int(x) for x in re.findall(r"\d+", attribute(i.attrs, "lhs_contracting_dims") or "")]
        flops += dot_flops(out, lhs, contracting)
        dtype = first_array(shape_of(fused, i.operands[0]))[0]
      elif i.opcode == "convolution":
        labels = (attribute(i.attrs, "dim_labels") or "b01f_01io->b01f").replace("->", "_").split("_")
        _, out = first_array(i.shape)
        _, rhs = first_array(shape_of(fused, i.operands[1]))
        flops += conv_flops(out, rhs, labels[1])
        dtype = first_array(shape_of(fused, i.operands[0]))[0]
    return flops, dtype

  def io_bytes(comp, instr, results_too=True):
    size = sum(nbytes(shape_of(comp, o)) for o in instr.operands)
    if results_too:
      size += nbytes(instr.shape)
    return size

  def walk(comp, count):
    for instr in comp.instructions:
      op = instr.opcode
      if op in NO_KERNEL or op.endswith("-done"):
        continue
      if op == "while":
        config = backend_config(instr.attrs)
        m = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)', config)
        trips = int(m.group(1)) if m else 1
        for key in ("body", "condition"):
          for name in called(instr.attrs, key):
            if name in computations:
              walk(computations[name], count * trips)
        continue
      if op in ("conditional", "call"):
        for key in ("branch_computations", "true_computation", "false_computation", "to_apply"):
          for name in called(instr.attrs, key):
            if name in computations:
              walk(computations[name], count)
        continue
      base = op[:-len("-start")] if op.endswith("-start") else op
      if base in COLLECTIVES:
        collective(comp, instr, base, count)
        continue
      if op == "async-start":
        wrapped = [computations[n] for n in called(instr.attrs, "calls") if n in computations]
        inner = [i for w in wrapped for i in w.instructions
                 if i.opcode.removesuffix("-start") in COLLECTIVES]
        if inner:
          collective(comp, instr, inner[0].opcode.removesuffix("-start"), count)
        else:
          for w in wrapped:
            walk(w, count)
        continue
      if op == "fusion":
        fused = [computations[n] for n in called(instr.attrs, "calls") if n in computations]
        flops, dtype = 0, ""
        for f in fused:
          f_flops, f_dtype = inside_fusion(f, instr.name, count)
          flops, dtype = flops + f_flops, dtype or f_dtype
        config = backend_config(instr.attrs)
        kind = "fusion"
        if "__cudnn$fusion" in config:
          kind = "conv" if any(i.opcode == "convolution" for f in fused for i in f.instructions) else "gemm"
        elif "__triton_gemm" in config or "__cublas" in config or "__custom_fusion" in config:
          kind = "gemm"
        elif flops:
          kind = "gemm" if any(i.opcode == "dot" for f in fused for i in f.instructions) else "conv"
        if kind == "gemm":
          result.gemms.append({"kind": "triton" if "triton" in config else "fusion", "dtype": dtype,
                               "shape": instr.shape.split("{")[0], "count": count})
        elif kind == "conv":
          result.convolutions.append({"kind": "fused", "layout": "", "dim_labels": "", "dtype": dtype,
                                      "count": count})
        result.kernels.append(Kernel(instr.name, kind, flops, io_bytes(comp, instr), dtype, count))
        continue
      if op == "custom-call":
        target = attribute(instr.attrs, "custom_call_target") or ""
        # Library calls return (result, scratch space): only the result is written to HBM.
        out_shape = instr.shape
        if out_shape.startswith("("):
          out_shape = "(" + ", ".join(f"{d}[{','.join(map(str, s))}]" for d, s in arrays(out_shape)[:1]) + ")"
        size = io_bytes(comp, instr, results_too=False) + nbytes(out_shape)
        if target in CONV_TARGETS:
          kind = CONV_TARGETS[target]
          labels = (attribute(instr.attrs, "dim_labels") or "").replace("->", "_").split("_")
          operands = [first_array(shape_of(comp, o))[1] for o in instr.operands]
          result_dims = first_array(instr.shape)[1]
          # Operands and result per kind (dim_labels always describe the forward convolution):
          # forward (x, w) -> y; backward-input (dy, w) -> dx; backward-filter (x, dy) -> dw.
          if kind == "backward-input":
            fwd_out, filt = operands[0], operands[1]
          elif kind == "backward-filter":
            fwd_out, filt = operands[1], result_dims
          else:
            fwd_out, filt = result_dims, operands[1]
          dtype = first_array(shape_of(comp, instr.operands[0]))[0]
          flops = conv_flops(fwd_out, filt, labels[1]) if len(labels) == 3 else 0
          result.convolutions.append({"kind": kind, "layout": layout_name(labels[0]),
                                      "dim_labels": "_".join(labels[:2]) + "->" + labels[-1],
                                      "dtype": dtype, "count": count})
          result.kernels.append(Kernel(instr.name, "conv", flops, size, dtype, count, part=kind))
        elif target.startswith(GEMM_TARGETS):
          config = backend_config(instr.attrs)
          contracting = re.search(r'"lhs_contracting_dimensions"\s*:\s*\[([^\]]*)\]', config)
          contracting = [int(x) for x in re.findall(r"\d+", contracting.group(1))] if contracting else []
          lhs_dtype, lhs = first_array(shape_of(comp, instr.operands[0]))
          flops = dot_flops(first_array(instr.shape)[1], lhs, contracting)
          result.gemms.append({"kind": "cublas", "dtype": lhs_dtype,
                               "shape": out_shape.strip("()"), "count": count})
          result.kernels.append(Kernel(instr.name, "gemm", flops, size, lhs_dtype, count))
        elif "fmha" in target.lower() or "attention" in target.lower():
          result.attention.append({"target": target, "shape": out_shape.strip("()"), "count": count})
          q_dtype, q = first_array(shape_of(comp, instr.operands[0]))
          k = first_array(shape_of(comp, instr.operands[1]))[1] if len(instr.operands) > 1 else ()
          result.kernels.append(Kernel(instr.name, "attention", attention_flops(q, k, "backward" in target.lower()),
                                       size, q_dtype, count))
        else:
          result.kernels.append(Kernel(instr.name, "library", 0, size, "", count))
        continue
      if op in ("transpose", "copy"):
        dims = first_array(instr.shape)[1]
        result.transposes.append({"op": op, "shape": instr.shape.split("{")[0], "bytes": nbytes(instr.shape),
                                  "size": size_class(elements(dims)), "inside": instr.name,
                                  "count": count})
        result.kernels.append(Kernel(instr.name, "transpose", 0, io_bytes(comp, instr), "", count))
        continue
      result.kernels.append(Kernel(instr.name, "other", 0, io_bytes(comp, instr), "", count))

  walk(entry, 1)
  name_kernels(computations, result.kernels)
  return result


def name_kernels(computations: dict, kernels: list) -> None:
  """Sets each kernel's op_name: its instruction's, or, for a fusion, that of an instruction
  inside it: one in a step scope (STEP_SCOPES: the optimizer's update fused with a weight
  gradient's transpose is the optimizer's kernel), else the root's, else any; a copy or
  transpose XLA added, with none, takes its operand's."""
  instructions = {i.name: (c, i) for c in computations.values() for i in c.instructions}
  in_step_scope = lambda name: any(f"/{scope}/" in name for scope in STEP_SCOPES)

  def name_of(name, depth=0):
    if name not in instructions or depth > 8:
      return ""
    comp, instr = instructions[name]
    own = op_name(instr.attrs)
    inside = [computations[c] for c in called(instr.attrs, "calls") if c in computations]
    names = [op_name(i.attrs) for c in inside for i in c.instructions if op_name(i.attrs)]
    found = (next((n for n in names if in_step_scope(n)), "") or own
             or next((op_name(c.root.attrs) for c in inside if op_name(c.root.attrs)), "")
             or next(iter(names), ""))
    if found:
      return found
    return next((n for n in (name_of(o, depth + 1) for o in instr.operands) if n), "")

  for k in kernels:
    k.op_name = name_of(k.name)


def summary(analysis: Analysis) -> dict:
  """The numbers of an Analysis as a flat dict (for tables, JSON and tests)."""
  collectives = collections.defaultdict(lambda: {"count": 0, "bytes": 0, "elements": 0, "combined": 0,
                                                 "exposed": 0})
  for c in analysis.collectives:
    entry = collectives[c["op"]]
    entry["count"] += c["count"]
    entry["exposed"] += 0 if c.get("overlapped") else c["count"]
    entry["bytes"] += c["bytes"] * c["count"]
    entry["elements"] += c["elements"] * c["count"]
    entry["combined"] += c["count"] if c["combined"] else 0
  layouts = collections.Counter()
  for c in analysis.convolutions:
    if c["layout"]:
      layouts[c["layout"]] += c["count"]
  return {
      "kernels": analysis.kernel_count,
      "fusions": sum(k.count for k in analysis.kernels if k.kind == "fusion"),
      "convolutions": analysis.counts("convolutions", "kind"),
      "conv_layouts": dict(layouts),
      "gemms": analysis.counts("gemms", "kind"),
      "attention": analysis.counts("attention", "target"),
      "transposes": {size: sum(t["count"] for t in analysis.transposes_of(size))
                     for size in ("activation", "weight", "small")},
      # Whole weight-sized copies (same shape and layout): a buffer duplicated, not re-laid-out.
      "weight_copies": sum(t["count"] for t in analysis.transposes_of("weight") if t["op"] == "copy"),
      "collectives": {k: dict(v) for k, v in collectives.items()},
      "exposed_collectives": sum(v["exposed"] for v in collectives.values()),
      "flops": analysis.flops,
      "hbm_bytes": analysis.hbm_bytes,
  }


# --- where each kernel comes from: the per-layer table -------------------------------------

# jaxnet's train step names its own parts (jaxnet/core/steps.py); the rest of a name stack
# outside the model is the input's normalisation and the task's loss.
STEP_SCOPES = ("optimizer", "metrics", "ema")
# A model module's name -> the part of a layer it is (digits and a block's number dropped).
PART_NAMES = {"conv": "conv", "proj_conv": "conv", "stem_conv": "conv", "batchnorm": "bn",
              "proj_bn": "bn", "stem_bn": "bn", "jit(relu)": "relu", "max_pool": "pool",
              "layernorm": "norm", "dense": "dense", "head": "head"}
CONV_PARTS = {"forward": "conv fwd", "fused": "conv fwd", "backward-input": "conv dgrad",
              "backward-filter": "conv wgrad"}


def layer_of(kernel: Kernel) -> tuple[str, str, str]:
  """(layer, part, pass) of a kernel, from its op_name and its HLO kind, never from a GPU
  kernel's name: e.g. ("stage2", "conv wgrad", "backward") for the filter gradient of a
  convolution in any block of stage 2, ("optimizer", "update", "step") for the update.

  The layer is the model's top-level module with a block's number dropped ("stage2_block3" ->
  "stage2", "stem_conv" -> "stem"); ops of the model outside any module (a ResNet's global
  average pool) are "model"; the step's own scopes are theirs; the rest is "input"
  (normalisation), "loss", or "step" (not named)."""
  name = kernel.op_name
  m = re.search(r"(transpose\()?jvp\((\w*)\)\)?/(.*)", name)
  if m and m.group(2):  # inside the model
    stage = "backward" if m.group(1) else "forward"
    path = m.group(3).split("/")
    # The layer: the first module named as a stage or block (a ViT's encoder blocks sit in a
    # Transformer module), its block number dropped; a stem's modules are the stem.
    modules = [p for p in path[:-1] if not p.startswith("jit(")] or ["model"]  # jit(relu): a function
    top = next((p for p in modules if re.search(r"stage|block|stem", p)), modules[0])
    layer = "stem" if top.startswith("stem") else re.sub(r"_?block_?\d+$", "", top)
    module = next((p for p in reversed(path[:-1]) if re.sub(r"_\d+$", "", p).lower() in PART_NAMES), "")
    part = PART_NAMES.get(re.sub(r"_\d+$", "", module).lower(), path[-1] if len(path) > 1 else path[0])
    if kernel.kind == "conv":
      # In the backward pass every convolution but the filter's gradient is an input gradient.
      part = CONV_PARTS.get(kernel.part, "conv")
      if stage == "backward" and part != "conv wgrad":
        part = "conv dgrad"
    elif kernel.kind == "gemm":
      part = f"{part} gemm"
    elif part == "conv":  # a fusion in a conv's scope: its weights cast or re-laid out
      part = "conv weights"
    elif stage == "backward" and part == "select_n":  # ReLU's gradient (with the residual add's)
      part = "relu"
    return layer, part, stage
  scopes = name.split("/")
  for scope in STEP_SCOPES:
    if scope in scopes:
      return scope, kernel.kind, "step"
  if "log_softmax" in name or "loss" in scopes:
    return "loss", kernel.kind, "step"
  if m:  # inside jvp(...) but no model: the input's normalisation
    return "input", kernel.kind, "forward"
  return "step", kernel.kind, "step"


def layer_table(analysis: Analysis, peak_flops: dict | None = None, bandwidth: float | None = None) -> list:
  """Rows {layer, part, pass, kernels, flops, bytes, ms} summing the step's kernels by
  layer_of, in the order the step first runs them. With a target's peaks and HBM bandwidth,
  ms is the rows' roofline (each kernel at max(FLOPs / peak, bytes / bandwidth)): a lower
  bound per layer, not a measurement."""
  rows = {}
  for k in analysis.kernels:
    if k.kind == "collective":
      continue
    layer, part, stage = layer_of(k)
    row = rows.setdefault((layer, part, stage), {"layer": layer, "part": part, "pass": stage,
                                                 "kernels": 0, "flops": 0, "bytes": 0.0, "ms": 0.0})
    row["kernels"] += k.count
    row["flops"] += k.flops * k.count
    row["bytes"] += k.bytes * k.count
    if peak_flops and bandwidth:
      peak = peak_flops.get(k.dtype) or max(peak_flops.values())
      row["ms"] += 1e3 * k.count * max(k.flops / peak, k.bytes / bandwidth)
  return list(rows.values())


def map_trace(events: list, analysis: Analysis) -> dict:
  """A device trace's kernel events mapped to the step's HLO instructions, and through them
  to layers: {"matched": n, "events": n, "rows": {(layer, part, pass): us}, "unmatched": {name: us}}.

  An event names its HLO instruction in args["hlo_op"] (XLA's GPU profiler; "long_name"
  holds it in older traces, as "%name = ..."); a library call (cuDNN, cuBLAS) that launches
  several kernels has each of them carry the call's instruction."""
  by_name = {k.name: k for k in analysis.kernels}
  rows, unmatched, matched = collections.Counter(), collections.Counter(), 0
  for e in events:
    args = e.get("args", {})
    op = str(args.get("hlo_op") or args.get("long_name") or "")
    op = op.split(" ")[0].lstrip("%").split("=")[0].strip()
    kernel = by_name.get(op)
    if kernel is None:
      unmatched[str(e.get("name", ""))[:90]] += float(e.get("dur", 0))
      continue
    matched += 1
    rows[layer_of(kernel)] += float(e.get("dur", 0))
  return {"events": len(events), "matched": matched, "rows": dict(rows), "unmatched": dict(unmatched)}
