"""The errors jaxnet explains: each message says what happened and what to do about it.

The core raises them and never prints them; the command line (jaxnet/cli/process.py)
prints a UserError as one line and exits non-zero. Every other exception (a bug, a
shape error in a model) keeps its traceback.
"""

import errno
import os


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


def os_error_cause(error: BaseException) -> str | None:
  """The cause of a failed write in words ('no space left on device', 'permission denied'),
  from the first OSError with an errno in the exception's chain; None if there is none."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno is not None:
      if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on device"
      return os.strerror(error.errno).lower()
    error = error.__cause__ or error.__context__
  return None
