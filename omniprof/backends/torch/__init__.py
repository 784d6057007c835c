"""Backend ``torch``: ``torch.profiler`` (Kineto), and the reader of any Kineto trace.

Importing this package does not import torch; the backend imports it in ``probe()``/``prepare()``.
"""

from omniprof.backends.torch.backend import TorchBackend, TorchOptions

__all__ = ["TorchBackend", "TorchOptions"]
