"""The flat profile of stack samples (inclusive and exclusive time per function).

Samples are first aggregated by stack, so the cost is O(unique stacks x depth),
not O(samples x depth).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import attrs

from omniprof.core.results import BackendResult, Frame

__all__ = ["flat_rows", "FlatRow"]


def _counts(part: BackendResult, select: Callable[[int], bool] | None) -> tuple[Counter[int], Counter[int]]:
    weights: Counter[int] = Counter()
    counts: Counter[int] = Counter()
    for s in part.samples:
        if select is None or select(s.thread_id):
            weights[s.stack_id] += s.weight_ns
            counts[s.stack_id] += 1
    return weights, counts


@attrs.frozen
class FlatRow:
    """One function (frame) in the flat profile: inclusive and exclusive time and sample counts."""

    frame: Frame
    total_ns: int
    self_ns: int
    count: int
    self_count: int


def flat_rows(part: BackendResult, *, select: Callable[[int], bool] | None = None,
              key: Callable[[Frame], object] | None = None) -> list[FlatRow]:
    """Flat profile sorted by self time. ``key`` merges frames (default: function, file, line).

    A frame appearing several times in one stack (recursion) counts once for that stack.
    """
    weights, counts = _counts(part, select)
    keyf = key or (lambda f: f)
    total: dict[object, list[int]] = {}
    first: dict[object, Frame] = {}
    for sid, w in weights.items():
        c = counts[sid]
        stack = part.stacks[sid]
        seen = set()
        for fid in stack:
            k = keyf(part.frames[fid])
            if k in seen:
                continue
            seen.add(k)
            first.setdefault(k, part.frames[fid])
            acc = total.setdefault(k, [0, 0, 0, 0])
            acc[0] += w
            acc[2] += c
        if stack:
            k = keyf(part.frames[stack[-1]])
            acc = total[k]
            acc[1] += w
            acc[3] += c
    rows = [FlatRow(first[k], a[0], a[1], a[2], a[3]) for k, a in total.items()]
    rows.sort(key=lambda r: (-r.self_ns, -r.total_ns, r.frame.name))
    return rows
