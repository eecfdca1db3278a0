"""The shell: jaxnet's command lines and the process set-up around them.

One module per command (`python -m jaxnet.main` runs `jaxnet.cli.main`; the others are
`python -m jaxnet.cli.NAME`; console.py is the `jaxnet` command that names them all), and what they share (process.py: XLA flags, the compilation
cache, jax.distributed, signals, the workdir lock, one-line errors; heartbeat.py: a
multi-process run's check that every process is alive). Only here does jaxnet touch
process-wide state: environment variables, jax's global config, signal handlers, loggers'
filters, exception hooks, os._exit. The core and the tools never import this package
(the import-linter contracts in pyproject.toml).
"""
