"""Aggregations of stack samples shared by reporters: call tree and flat profile.

Samples are first aggregated by (thread, stack) so building a tree costs O(unique stacks x depth),
not O(samples x depth).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

import attrs

from omniprof.core.results import BackendResult, Frame

__all__ = ["Node", "aggregate", "build_tree", "flat_rows", "FlatRow"]


@attrs.define(eq=False)
class Node:
    """A call-tree node. ``frame_id`` is -1 for the root. Times are sample weights in ns."""

    frame_id: int
    total_ns: int = 0
    self_ns: int = 0
    count: int = 0
    self_count: int = 0
    children: dict[int, Node] = attrs.field(factory=dict)

    def sorted_children(self) -> list[Node]:
        return sorted(self.children.values(), key=lambda n: (-n.total_ns, n.frame_id))


def aggregate(part: BackendResult, *, select: Callable[[int], bool] | None = None) -> Counter[int]:
    """Total weight (ns) per stack id, counting only threads for which ``select(thread_id)`` holds.

    Returns a Counter of ``stack_id -> weight_ns``; the sample counts are in :func:`aggregate_counts`.
    """
    out: Counter[int] = Counter()
    for s in part.samples:
        if select is None or select(s.thread_id):
            out[s.stack_id] += s.weight_ns
    return out


def _counts(part: BackendResult, select: Callable[[int], bool] | None) -> tuple[Counter[int], Counter[int]]:
    weights: Counter[int] = Counter()
    counts: Counter[int] = Counter()
    for s in part.samples:
        if select is None or select(s.thread_id):
            weights[s.stack_id] += s.weight_ns
            counts[s.stack_id] += 1
    return weights, counts


def build_tree(part: BackendResult, *, select: Callable[[int], bool] | None = None) -> Node:
    """The call tree of ``part``'s samples (root first)."""
    weights, counts = _counts(part, select)
    root = Node(-1)
    for sid, w in weights.items():
        c = counts[sid]
        node = root
        node.total_ns += w
        node.count += c
        for fid in part.stacks[sid]:
            child = node.children.get(fid)
            if child is None:
                child = node.children[fid] = Node(fid)
            child.total_ns += w
            child.count += c
            node = child
        node.self_ns += w
        node.self_count += c
    return root


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


def iter_tree(root: Node, max_depth: int | None = None) -> Iterable[tuple[int, Node]]:
    """Depth-first (depth, node) pairs, children by descending total time, root excluded."""
    stack = [(0, c) for c in reversed(root.sorted_children())]
    while stack:
        depth, node = stack.pop()
        yield depth, node
        if max_depth is None or depth + 1 < max_depth:
            stack.extend((depth + 1, c) for c in reversed(node.sorted_children()))
