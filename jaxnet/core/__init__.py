"""The core: the framework a researcher reads and changes.

config, data/, models/, the train state and precision (state.py), the steps (steps.py),
the optimizer (optim.py), shardings for data parallelism and FSDP (sharding.py), the
Experiment built from a config (experiment.py), the loop and evaluation (train.py),
checkpoints (checkpoint.py), the workdir's records (workdir.py, metrics.py), and the
adapters that hold what jaxnet relies on in its libraries beyond their API (adapters/).
The core touches no process-wide state and imports neither jaxnet.cli nor jaxnet.tools
(pyproject.toml's import-linter contracts); it raises typed errors (errors.py) and
leaves printing them to the command line.
"""
