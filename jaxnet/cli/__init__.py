"""The shell: jaxnet's command lines and the process set-up around them.

One module per command (`python -m jaxnet.main` runs `jaxnet.cli.main`; the others are
`python -m jaxnet.cli.NAME`; console.py is the `jaxnet` command that names them all), and what they share (process.py: XLA flags, the compilation
cache, jax.distributed, signals, the workdir lock, one-line errors; heartbeat.py: a
multi-process run's check that every process is alive). Only here does jaxnet touch
process-wide state: environment variables, jax's global config, signal handlers, loggers'
filters, exception hooks, os._exit. The core and the tools never import this package
(the import-linter contracts in pyproject.toml).
"""

import argparse


class _WithDefaults(argparse.RawDescriptionHelpFormatter):
  """Each option's help ends with its default (one that is set and not already named)."""

  def _get_help_string(self, action):
    text = action.help or ""
    if (action.option_strings and action.default not in (None, False, argparse.SUPPRESS)
        and "default" not in text):
      text = f"{text} (default: %(default)s)".strip()
    return text


def parser(command: str, description: str) -> argparse.ArgumentParser:
  """The argument parser of `jaxnet COMMAND`: its usage line names the `jaxnet` command (the
  same under `python -m jaxnet.cli.COMMAND`), and every option's help shows its default."""
  return argparse.ArgumentParser(prog=f"jaxnet {command}", description=description,
                                 formatter_class=_WithDefaults)
