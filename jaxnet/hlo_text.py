"""XLA's HLO text, parsed: computations, instructions, shapes and attributes.

The reading `jaxnet.hlo_analysis` builds on: only the text is read (no jax, no device),
so the parsing is tested on small HLO snippets.
"""

from __future__ import annotations

import dataclasses
import re

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
