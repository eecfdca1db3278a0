"""jaxnet: a JAX/XLA training framework for image models.

The Python API is the module `jaxnet.api` (`from jaxnet import api`; see
docs/api.md). Its functions are not re-exported here: `jaxnet.train` and
`jaxnet.predict` are modules (the training loop, the predict command), and
Python rebinds a package attribute to the submodule whenever that submodule is
imported, so a top-level `jaxnet.train` function would silently turn into a
module. Importing `jaxnet` itself stays cheap (no jax import).
"""

__version__ = "0.1.0"
