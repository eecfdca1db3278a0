"""What jaxnet relies on in its libraries beyond their public API: one small module per
library (`xla` for jax, jaxlib and XLA; `orbax` for orbax and tensorstore; `grain`), each
behaviour pinned by tests/test_adapters.py on both CI legs, so that a release that changes
one fails a named test instead of making jaxnet misbehave. Nothing else in jaxnet matches a
library's message text or uses its private names."""
