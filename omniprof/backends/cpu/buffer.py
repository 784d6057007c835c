"""The ``cpu`` backend's process-wide sample buffer and its defaults (Julia's ``Profile`` buffer).

Sessions without a sampler of their own record into :func:`buffer`, which accumulates until
``omniprof.cpu.clear()``; ``omniprof.cpu.init()`` sets the defaults (:func:`set_defaults`) that
``CpuOptions`` starts from. The lowest module of the backend: both the backend and its public
helpers (``omniprof.cpu``) read it.
"""

from __future__ import annotations

import threading

from omniprof.backends.cpu.sampler import Sampler
from omniprof.core.clock import DEFAULT_CLOCK

__all__ = ["buffer", "default_max_samples", "default_interval_s", "set_defaults"]

_config = {"max_samples": 1_000_000, "interval_s": 0.001}
_buffer: Sampler | None = None
_lock = threading.Lock()


def default_max_samples() -> int:
    return int(_config["max_samples"])


def default_interval_s() -> float:
    return float(_config["interval_s"])


def set_defaults(max_samples: int | None = None, interval_s: float | None = None) -> None:
    """New defaults (already validated); the buffer, if made, takes the new bound at once."""
    if max_samples is not None:
        _config["max_samples"] = max_samples
        if _buffer is not None:
            _buffer.max_samples = max_samples
    if interval_s is not None:
        _config["interval_s"] = float(interval_s)


def buffer() -> Sampler:
    """The process-wide sample buffer (created on first use)."""
    global _buffer
    with _lock:
        if _buffer is None:
            _buffer = Sampler(None, DEFAULT_CLOCK, int(_config["max_samples"]))
        return _buffer
