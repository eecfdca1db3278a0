"""jaxnet: a JAX/XLA training framework for image models."""

__version__ = "0.1.0"
