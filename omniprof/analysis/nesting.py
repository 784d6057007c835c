"""What nests in what, and a span's self time: the one rule every view reads.

The rule is torch's (``EventList._populate_cpu_children``), which XProf's op tables also follow:
on one track, spans are taken by start (the longer first when two start together, then in the
order given); a span is a child of the innermost open span that holds it whole (``[start, end)``
inside the parent's). A span that starts inside an open span but ends after it is not its child:
that open span is closed and the new one is its sibling. A span's **self time** is its duration
less its direct children's durations. Two children of one span can overlap each other (the second
starts inside the first and ends after it, both inside the parent): torch then subtracts both,
and so does this rule; the flame-graph writers and the XLA op table show such a self time below
0 as 0.

So spans A[0,10), B[5,15), C[6,8) on one thread give A 10 (B overlaps A without nesting in it)
and B 8 (C is inside B, the innermost span open when C starts). Every view gives these figures:
the op tables (torch and XLA), ``omniprof diff``, and the flame-graph writers (pprof, collapsed,
speedscope), which draw an overlapping span on an overlap lane but give it the same children.

What takes part differs by source, and that is all a :class:`Rule` says:

* :data:`TORCH` (``key_averages()``): ops, user annotations, steps, Python functions and the CUDA/HIP
  runtime and driver calls (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ``hipLaunchKernel``, ...),
  which are children of the op that made them and rows of their own; torch's utility ops
  (``aten::is_leaf``, ``profiler::_record_function_exit``, ...) are left out, their time is their
  parent's; an op whose only child has its own name (a dispatcher re-entry) is counted once, the
  child folded into it. GPU work is attached to its op by correlation (the launch's op):
  :meth:`Nest.launcher`.
* :data:`XLA`: the ``xla_op`` spans of a device line.
* :data:`SPANS`: every span of a track (the flame-graph writers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import attrs

from omniprof.core.results import Span

__all__ = ["Rule", "TORCH", "XLA", "SPANS", "Nest", "nest", "self_times"]


@attrs.frozen
class Rule:
    """Which spans nest, and torch's two refinements.

    Attributes:
        name: the rule's name (``"torch"``, ``"xla"``, ``"spans"``).
        categories: span categories that take part (None: every span).
        hidden_names: span names left out as if not recorded (their time is their parent's self time).
        fold_same_name: a span whose parent has it as only child and the same name is folded into
            that parent (not counted; its children become the parent's), as torch's
            ``EventList._remove_dup_nodes``.
    """

    name: str
    categories: frozenset[str] | None = attrs.field(default=None, converter=lambda c: None if c is None else frozenset(c))
    hidden_names: frozenset[str] = attrs.field(default=frozenset(), converter=lambda c: frozenset(c))
    fold_same_name: bool = False

    def takes(self, span: Span) -> bool:
        return (self.categories is None or span.category in self.categories) and span.name not in self.hidden_names


#: torch's ``_filter_name``: utility ops ``key_averages()`` never shows.
TORCH_HIDDEN = ("aten::is_leaf", "aten::output_nr", "aten::_version", "profiler::_record_function_enter",
                "profiler::_record_function_enter_new", "profiler::_record_function_exit", "[memory]",
                "[OutOfMemory]")
TORCH = Rule("torch", ("cpu_op", "annotation", "step", "python", "runtime"), TORCH_HIDDEN, True)
XLA = Rule("xla", ("xla_op",))
SPANS = Rule("spans")


class Nest:
    """The nesting of ``spans`` by one :class:`Rule` (build it with :func:`nest`).

    Attributes:
        spans: the spans, as given.
        rule: the rule.
        parent: per span, its parent's index; -1 for a top-level span, -2 for a span the rule
            leaves out. Before folding (the call nesting).
        owner: per span, the span it is counted in: itself, or the same-name parent it was folded
            into (-2 where the rule leaves it out).
        children_ns: per span, its direct children's time after folding.
        order: the spans the rule takes, each track's in nesting order (a parent before its children).
    """

    __slots__ = ("spans", "rule", "parent", "owner", "children_ns", "order")

    def __init__(self, spans: Sequence[Span], rule: Rule) -> None:
        self.spans = spans
        self.rule = rule
        n = len(spans)
        self.parent = [-2] * n
        self.owner = [-2] * n
        self.children_ns = [0] * n
        self.order: list[int] = []

    def self_ns(self, i: int) -> int:
        """Span ``i``'s self time: its duration less its children's (after folding)."""
        return self.spans[i].dur_ns - self.children_ns[i]

    def counted(self) -> Iterable[int]:
        """The spans that are a call of their own (taken by the rule, not folded), in nesting order."""
        return (i for i in self.order if self.owner[i] == i)

    def launcher(self, i: int, categories: Iterable[str] = ("cpu_op", "annotation", "step")) -> int:
        """The op a runtime call ``i`` was made by: its nearest ancestor of ``categories`` (torch
        attaches a launch's GPU work to the op whose correlation id was current), as counted
        (after folding); -1 if none."""
        cats = frozenset(categories)
        p = self.parent[i]
        while p >= 0 and self.spans[p].category not in cats:
            p = self.parent[p]
        return self.owner[p] if p >= 0 else -1

    def enclosing(self, points: Iterable[tuple[str, int]]) -> list[int]:
        """Per ``(track, t_ns)`` point, the counted span that holds it (innermost, ``start <= t <
        end``), or -1."""
        pts = list(points)
        by_track: dict[str, list[int]] = {}
        for k, (track, _) in enumerate(pts):
            by_track.setdefault(track, []).append(k)
        spans_of: dict[str, list[int]] = {}
        for i in self.order:
            spans_of.setdefault(self.spans[i].track, []).append(i)
        out = [-1] * len(pts)
        for track, ks in by_track.items():
            ks.sort(key=lambda k: pts[k][1])
            idx = spans_of.get(track, [])
            stack: list[int] = []
            j = 0
            for k in ks:
                t = pts[k][1]
                while j < len(idx) and self.spans[idx[j]].start_ns <= t:
                    s = self.spans[idx[j]]
                    while stack and (s.start_ns >= self.spans[stack[-1]].end_ns or
                                     s.end_ns > self.spans[stack[-1]].end_ns):
                        stack.pop()  # as nest() does: what stays open holds the span whole
                    stack.append(idx[j])
                    j += 1
                while stack and self.spans[stack[-1]].end_ns <= t:
                    stack.pop()
                out[k] = self.owner[stack[-1]] if stack else -1
        return out


def nest(spans: Sequence[Span], rule: Rule = SPANS) -> Nest:
    """Nest ``spans`` track by track by ``rule`` (the module's rule; see its docstring).

    >>> from omniprof.core.results import Span
    >>> spans = [Span("A", "t", 0, 10), Span("B", "t", 5, 10), Span("C", "t", 6, 2)]
    >>> n = nest(spans)
    >>> n.parent, [n.self_ns(i) for i in range(3)]
    ([-1, -1, 1], [10, 8, 2])
    """
    out = Nest(spans, rule)
    per_track: dict[str, list[tuple[int, int, int]]] = {}
    takes = rule.takes
    for i, s in enumerate(spans):
        if takes(s):
            start = s.start_ns
            per_track.setdefault(s.track, []).append((start, -(start + s.dur_ns), i))
    parent, owner, children_ns = out.parent, out.owner, out.children_ns
    for entries in per_track.values():
        entries.sort()  # by start, the longer first, then as given
        idx = [i for _, _, i in entries]
        stack_end: list[int] = []
        stack_i: list[int] = []
        children: dict[int, list[int]] = {}
        for start, negend, i in entries:
            end = -negend
            while stack_end and (start >= stack_end[-1] or end > stack_end[-1]):
                stack_end.pop()
                stack_i.pop()
            if stack_i:
                p = parent[i] = stack_i[-1]
                children_ns[p] += end - start
                children.setdefault(p, []).append(i)
            else:
                parent[i] = -1
            owner[i] = i
            stack_end.append(end)
            stack_i.append(i)
        if rule.fold_same_name and _fold(lambda i: spans[i].name, idx, parent, owner, children):
            for p in children:  # the children after folding
                if owner[p] == p:
                    children_ns[p] = sum(spans[c].dur_ns for c in children[p])
            for i in idx:
                if owner[i] != i:
                    children_ns[i] = 0
        out.order += idx
    return out


def _fold(name: Callable[[int], object], idx: list[int], parent: Sequence[int], owner: list[int],
          children: dict[int, list[int]]) -> bool:
    """torch's ``_remove_dup_nodes``: until nothing changes, a span that is the only child of a
    same-name span is folded into it, its children becoming that span's. Whether any was.
    ``name(i)`` is span ``i``'s name (spans here, columns in :mod:`omniprof.analysis.torch_columns`)."""
    if not any(len(kids) == 1 and name(kids[0]) == name(p) for p, kids in children.items()):
        return False
    up = {i: parent[i] for i in idx}  # the parent after folding
    changed = True
    while changed:
        changed = False
        for i in idx:
            p = up[i]
            if owner[i] != i or p < 0 or name(p) != name(i) or len(children.get(p, ())) != 1:
                continue
            kids = children.pop(i, [])
            children[p] = kids
            for c in kids:
                up[c] = p
            owner[i] = p
            changed = True
    for i in idx:  # a span folded into one that was folded in turn is counted in the last
        o = owner[i]
        while owner[o] != o:
            o = owner[o]
        owner[i] = o
    return True


def self_times(spans: Sequence[Span], rule: Rule = SPANS) -> dict[int, int]:
    """Self time of each span the rule takes (by index in ``spans``; a folded span's time is in
    its parent's, so it shows 0)."""
    n = nest(spans, rule)
    return {i: (n.self_ns(i) if n.owner[i] == i else 0) for i in n.order}
