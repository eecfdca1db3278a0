"""Only the optional C extension lives here; all metadata is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[
    # JPEG region decoding for the input pipeline (jaxnet/data/_jpeg_region.c).
    # optional: without a compiler or the libjpeg-turbo headers the install
    # still succeeds and the pipeline decodes whole images instead.
    Extension("jaxnet.core.data._jpeg_region", ["jaxnet/core/data/_jpeg_region.c"],
              libraries=["jpeg"], extra_compile_args=["-O2"], optional=True),
])
