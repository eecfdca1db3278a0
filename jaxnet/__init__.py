"""jaxnet: a JAX/XLA training framework for image models.

Three layers (docs/architecture.md): jaxnet.core (the framework), jaxnet.tools (built on
it), jaxnet.cli (the command lines and the process set-up around them). The Python API is
the module `jaxnet.api` (`from jaxnet import api`; see docs/api.md). Importing `jaxnet`
itself stays cheap (no jax import).
"""

__version__ = "0.1.0"
