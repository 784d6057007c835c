"""The memory backend's own helpers: profile allocations of a block, print them, heap snapshots.
``omniprof.allocs``, ``omniprof.take_heap_snapshot`` and ``omniprof.assemble_snapshot`` are
deprecated spellings of this module and its functions."""

from omniprof.backends.memory.api import (
    assemble_snapshot,
    clear,
    fetch,
    flat_rows,
    init,
    print,
    profile,
    start,
    stop,
    take_heap_snapshot,
    tree_rows,
)

__all__ = ["profile", "start", "stop", "fetch", "clear", "print", "init", "flat_rows", "tree_rows",
           "take_heap_snapshot", "assemble_snapshot", "MAX_KEPT_ALLOCATIONS"]


def __getattr__(name: str) -> object:
    # The buffer's limit is read where init() sets it, so it is never a stale copy.
    if name == "MAX_KEPT_ALLOCATIONS":
        from omniprof.backends.memory import api

        return api.MAX_KEPT_ALLOCATIONS
    raise AttributeError(f"module 'omniprof.memory' has no attribute {name!r}")
