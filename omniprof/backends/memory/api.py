"""``omniprof.allocs``: allocation profiling in the shape of Julia's ``Profile.Allocs``.

>>> import omniprof
>>> with omniprof.allocs.profile(sample_rate=1.0) as prof:
...     data = [bytearray(1000) for _ in range(10)]
>>> sum(a.size_bytes >= 1000 for a in prof.result.part("memory").allocations) >= 10
True
"""

from __future__ import annotations

from typing import Any

from omniprof.backends.memory.heapsnapshot import assemble_snapshot, take_heap_snapshot
from omniprof.backends.memory.report import flat_rows, print_allocs, tree_rows
from omniprof.core.results import ProfileResult

__all__ = ["profile", "fetch", "clear", "print", "flat_rows", "tree_rows", "take_heap_snapshot", "assemble_snapshot"]

_last: list[ProfileResult] = []


def profile(sample_rate: float = 0.01, **options: Any) -> Any:
    """A :class:`omniprof.Profiler` on the ``memory`` backend; use as a context manager or decorator.

    ``options`` are other ``memory`` backend options (``max_allocations``, ``engine``, ``seed``, ...).
    The result is also kept for :func:`fetch`.
    """
    from omniprof.core.profiler import Profiler

    return Profiler(backend="memory", backend_options={"memory": {"sample_rate": sample_rate, **options}},
                    on_result=_keep)


def _keep(result: ProfileResult) -> None:
    _last.append(result)


def fetch() -> ProfileResult:
    """The most recent allocation profile (Julia's ``Allocs.fetch()``)."""
    if not _last:
        from omniprof.errors import ProfilerStateError

        raise ProfilerStateError("no allocation profile yet: run code under omniprof.allocs.profile() first")
    return _last[-1]


def clear() -> None:
    """Forget kept allocation profiles (Julia's ``Allocs.clear()``)."""
    _last.clear()


print = print_allocs  # noqa: A001 - mirrors Julia's Profile.print
