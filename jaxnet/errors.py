"""Errors a user can act on, and how the command-line tools report them.

The command line prints a UserError's message as one line and exits non-zero,
without a traceback (JAXNET_DEBUG=1 shows it). Each message says what happened
and what to do about it.
"""


import contextlib
import errno
import os
import sys


class UserError(Exception):
  """A problem with the config, the workdir or the data, explained in the message."""


class InvalidValueError(UserError, ValueError):
  """A value jaxnet cannot use (a config key, an argument, a file's format), explained.
  A ValueError too, so code that catches ValueError still does."""


class MissingFileError(UserError, FileNotFoundError):
  """A file or directory jaxnet needs is not there; the message says how to make it."""


class NonFiniteError(UserError):
  """Training produced a non-finite loss, gradient or state; nothing non-finite was saved."""


DIVERGED_HINT = ("Lower optim.learning_rate, add optim.warmup_epochs or optim.grad_clip_norm, "
                 "or use precision=bf16/fp32 instead of fp16.")


@contextlib.contextmanager
def one_line_errors(*also):
  """For command-line entry points: a UserError (jaxnet explaining a problem), or a type
  in `also`, is printed as one line on stderr and exits with status 1. Every other
  exception (a bug, a shape error in a model) keeps its traceback.

  JAXNET_DEBUG=1 lets the exception through, with its traceback. Also quiets the
  tracebacks libraries print for failures already reported in one line (quiet.py).
  """
  from jaxnet import quiet
  quiet.quiet_reported_failures()
  try:
    yield
  except (UserError, *also) as e:
    if os.environ.get("JAXNET_DEBUG"):
      raise
    print(f"error: {e}", file=sys.stderr)
    print("(set JAXNET_DEBUG=1 to see the traceback)", file=sys.stderr, flush=True)
    if getattr(e, "noisy_teardown", False):
      # Background threads of the failed operation may still print tracebacks while
      # the interpreter shuts down; the line above already said what happened.
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
    sys.exit(1)


def describe_os_error(error: BaseException) -> str:
  """The cause of a failed write, in words: 'no space left on device', 'permission denied', ..."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno is not None:
      if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on device"
      return os.strerror(error.errno).lower()
    text = str(error)
    if "RESOURCE_EXHAUSTED" in text or "No space left" in text:
      return "no space left on device"
    if "already exists" in text:
      return "a checkpoint of this step already exists (is another run using this workdir?)"
    error = error.__cause__ or error.__context__
  return first_line(error) if error is not None else "unknown error"


def first_line(e: BaseException) -> str:
  text = str(e).strip()
  line = text.splitlines()[0] if text else type(e).__name__
  return line.split(" See full TensorStore details")[0][:300]  # a repr of the whole store follows
