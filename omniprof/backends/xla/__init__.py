"""Backend ``xla``: jax.profiler + xprof. Importing this package imports neither jax nor xprof."""

from omniprof.backends.xla.backend import XlaBackend, XlaOptions

__all__ = ["XlaBackend", "XlaOptions"]
