"""jaxnet/xla_flags.py: the user's flags win, and the bf16 CPU workaround is added exactly where XLA needs it."""

import os
import re
import subprocess
import sys

import pytest

from jaxnet import xla_flags
from tests.helpers import REPO

YNN = xla_flags.YNN_FUSION_OFF
FORCED_ON = "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce"  # what XLA fuses by default
NEEDED = xla_flags.has_ynn_bug(xla_flags.jaxlib_version())


def test_merge_keeps_every_user_flag_and_adds_the_rest():
  count = "--xla_force_host_platform_device_count=8"
  assert xla_flags.merge("", [YNN]) == YNN
  # Another flag (tests/conftest.py's device count) does not stop the workaround...
  assert xla_flags.merge(count, [YNN]) == f"{count} {YNN}"
  # ...but the user's own value of the same flag wins.
  assert xla_flags.merge(f"{FORCED_ON} {count}", [YNN]) == f"{FORCED_ON} {count}"
  assert xla_flags.merge(f" {YNN} ", [YNN]) == YNN
  # A flag whose name merely starts with another's is a different flag.
  assert (xla_flags.merge("--xla_gpu_foo_bar=1", ["--xla_gpu_foo=2"])
          == "--xla_gpu_foo_bar=1 --xla_gpu_foo=2")


def test_affected_jaxlib_versions():
  assert xla_flags.version_tuple("0.12.0.1") == (0, 12, 0, 1)
  assert xla_flags.version_tuple("0.13.0.dev20260101") == (0, 13, 0)
  # Measured: 0.10.0, 0.10.2, 0.11.0, 0.11.1 right; 0.11.2, 0.12.0, 0.12.0.1 wrong.
  for version, bug in [((0, 10, 2), False), ((0, 11, 1), False), ((0, 11, 2), True),
                       ((0, 12, 0), True), ((0, 12, 0, 1), True), (None, False)]:
    assert xla_flags.has_ynn_bug(version) == bug, version


def test_apply_only_on_the_cpu_and_only_where_needed(monkeypatch):
  # Every jaxlib this project supports defines the flag; a made-up one is not found.
  assert xla_flags.jaxlib_defines_flag(xla_flags.flag_name(YNN))
  assert not xla_flags.jaxlib_defines_flag("xla_jaxnet_made_up_flag")
  count = "--xla_force_host_platform_device_count=8"
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("XLA_FLAGS", count)
  xla_flags.apply()
  assert os.environ["XLA_FLAGS"] == (f"{count} {YNN}" if NEEDED else count)
  monkeypatch.setenv("XLA_FLAGS", FORCED_ON)
  xla_flags.apply()
  assert os.environ["XLA_FLAGS"] == FORCED_ON
  monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")  # a GPU run: the CPU workaround stays out
  monkeypatch.setenv("XLA_FLAGS", count)
  xla_flags.apply()
  assert os.environ["XLA_FLAGS"] == count


def _docs_reproduction() -> str:
  text = open(os.path.join(REPO, "docs", "models.md")).read()
  section = text[text.index("### bf16 on the CPU"):]
  return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _reproduction_is_right(flags: str, jaxnet_setup: bool) -> bool:
  """Runs the docs' reproduction in a fresh process with XLA_FLAGS=`flags`, after
  jaxnet.runtime.setup() (what the command line and the API do first) if asked."""
  code = ("from jaxnet import runtime; runtime.setup()\n" if jaxnet_setup else "") + _docs_reproduction()
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  verdict = re.search(r"jit matches eager: (True|False)", proc.stdout)
  assert verdict, proc.stdout
  return verdict.group(1) == "True"


def test_docs_reproduction_is_right_after_jaxnet_setup_and_wrong_without_exactly_where_needed():
  version = xla_flags.jaxlib_version()
  # jaxnet's setup makes it right on every jaxlib, even with other flags set.
  assert _reproduction_is_right("--xla_force_host_platform_device_count=2", jaxnet_setup=True), (
      f"jaxnet.runtime.setup() left the reproduction wrong on jaxlib {version}")
  # Without the workaround it is wrong exactly on the jaxlibs the workaround is for.
  wrong_without = not _reproduction_is_right("", jaxnet_setup=False)
  assert wrong_without == NEEDED, (
      f"jaxlib {version} computes the reproduction right without the flag: XLA fixed it, set "
      f"YNN_BUG_FIXED_IN in jaxnet/xla_flags.py" if NEEDED else
      f"jaxlib {version} computes the reproduction wrong: widen the range in jaxnet/xla_flags.py")
  # The user's own setting of the flag wins over jaxnet's.
  assert _reproduction_is_right(FORCED_ON, jaxnet_setup=True) == (not NEEDED)


def test_nan_hint_names_the_flag_only_when_it_can_be_the_cause(monkeypatch):
  monkeypatch.setattr(xla_flags, "jaxlib_version", lambda: (0, 12, 0, 1))
  monkeypatch.setenv("XLA_FLAGS", FORCED_ON)
  hint = xla_flags.ynn_hint("bf16", "cpu")
  assert "YNNPACK" in hint and f"XLA_FLAGS={YNN} " in hint
  assert xla_flags.ynn_hint("fp16", "cpu") == xla_flags.ynn_hint("bf16", "gpu") == ""
  monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {YNN}")
  assert xla_flags.ynn_hint("bf16", "cpu") == ""  # the workaround was on: something else
  monkeypatch.setattr(xla_flags, "jaxlib_version", lambda: (0, 10, 2))
  monkeypatch.setenv("XLA_FLAGS", "")
  assert xla_flags.ynn_hint("bf16", "cpu") == ""
