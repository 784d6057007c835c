"""Live capture: read a running CPython process from outside (``omniprof dump`` / ``omniprof attach``).

:class:`~omniprof.live.reader.PythonProcess` reads every thread's stack of a CPython 3.10-3.13
process with ``process_vm_readv`` (no code in the target, no stop); :mod:`omniprof.live.attach`
samples it into a :class:`~omniprof.core.results.ProfileResult`.
"""

from __future__ import annotations

__all__: list[str] = []
