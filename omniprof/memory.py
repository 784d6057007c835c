"""The memory backend's own helpers: profile allocations of a block, print them, heap snapshots.
``omniprof.allocs``, ``omniprof.take_heap_snapshot`` and ``omniprof.assemble_snapshot`` are the same
functions under their older names."""

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
           "take_heap_snapshot", "assemble_snapshot"]
