"""The public plugin API: what a third-party backend, reporter or reader subclasses and uses.

Import from here (``from omniprof.plugin import Backend, Reporter``); the classes are defined in
the kernel (:mod:`omniprof.core.backend`, :mod:`omniprof.core.reporter`, :mod:`omniprof.core.reader`)
so the Profiler and the registry need nothing outside ``core``. The old paths
``omniprof.backends.base`` and ``omniprof.reporters.base`` name this module and keep working.

Entry-point groups: ``omniprof.backends``, ``omniprof.reporters``, ``omniprof.readers``; the
entry-point name must equal the class's ``name``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omniprof.core.annotations import STEP_MARK, user_args
from omniprof.core.backend import SUPPORTED_API_VERSIONS, Backend, BackendContext, Capability
from omniprof.core.clock import DEFAULT_CLOCK, Clock
from omniprof.core.options import ProfileOptions
from omniprof.core.reader import Reader
from omniprof.core.reporter import Reporter
from omniprof.core.results import BackendResult, ProfileResult

if TYPE_CHECKING:
    from omniprof.analysis.timeline import measure_offset

#: Imported on first use: a backend that imports this module (every built-in one) does not pay for
#: the trace readers and the timeline analysis at ``omniprof run``'s start.
_LAZY = {"measure_offset": "omniprof.analysis.timeline"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'omniprof.plugin' has no attribute {name!r}")

__all__ = [
    "Backend", "BackendContext", "Capability", "Reporter", "Reader", "SUPPORTED_API_VERSIONS",
    "BackendResult", "ProfileResult", "ProfileOptions", "Clock", "DEFAULT_CLOCK", "measure_offset",
    "STEP_MARK", "user_args",
]
