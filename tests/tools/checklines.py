"""The line protocol of the per-interpreter check scripts (``native_engine_check.py``,
``allocsampler_check.py``, ``heapsnapshot_version_check.py``): each runs as a script under another
CPython, without omniprof's dependencies, prints ``OK name detail`` / ``FAIL name detail`` per check,
and exits 1 on any FAIL; the tests count its OK lines. Imported by those scripts from their own
directory (the script's directory is ``sys.path[0]``)."""

from __future__ import annotations

import sys

FAILS: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(("OK  " if ok else "FAIL") + f" {name} {detail}", flush=True)
    if not ok:
        FAILS.append(name)


def finish() -> None:
    """Exit with the checks' verdict: 1 when any failed."""
    sys.exit(1 if FAILS else 0)


def traced_bytes_each(make, n: int = 1000) -> tuple[list, list, float]:
    """``(warm, made, bytes_each)``: 200 objects made first (a class's first instances get larger
    values arrays, so the type is settled before measuring), then ``n`` more, each ``make()``'s
    bytes as tracemalloc saw them allocated. The list and the loop's range exist before tracing
    starts, so the loop allocates nothing else."""
    import tracemalloc

    warm = [make() for _ in range(200)]
    made, slots = [None] * n, list(range(n))
    tracemalloc.start()
    m0 = tracemalloc.get_traced_memory()[0]
    for k in slots:
        made[k] = make()
    each = (tracemalloc.get_traced_memory()[0] - m0) / n
    tracemalloc.stop()
    return warm, made, each
