"""One timeline from several backends: every part's times moved onto the run's reference clock.

Each :class:`~omniprof.core.results.BackendResult` keeps its own clock; ``t + part.clock.offset_ns``
is the same instant on the reference clock (the Profiler's ``perf_counter_ns``). A backend whose
native timestamps use another clock (``time.monotonic_ns``, CUPTI, a device clock) measures that
offset once with :func:`measure_offset` and stores it in its ``ClockInfo``; :func:`merge` then lines
every part up. Track ids are prefixed with the backend name so parts never collide.

>>> from omniprof.core.results import BackendResult, ClockInfo, ProfileResult, Span, Track
>>> a = BackendResult(backend="cpu", tracks=[Track("t", "main")], spans=[Span("x", "t", 100, 10)])
>>> b = BackendResult(backend="dev", clock=ClockInfo("device", offset_ns=1000),
...                   tracks=[Track("t", "stream")], spans=[Span("k", "t", -895, 5)])
>>> [(s.track, s.start_ns) for s in merge(ProfileResult(parts=(a, b))).spans]
[('cpu/t', 100), ('dev/t', 105)]

.. versionadded:: 0.1
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from omniprof.core.clock import Clock
from omniprof.core.results import CounterSeries, Instant, ProfileResult, Span, Track

__all__ = ["Timeline", "merge", "measure_offset"]


@attrs.frozen
class Timeline:
    """Spans, instants and counters of every part on the reference clock, sorted by time.

    Attributes:
        tracks: every part's tracks, ids prefixed ``"<backend>/"``.
        spans, instants, counters: the parts' data with times shifted and tracks renamed.
        start_ns, end_ns: the earliest part start and the latest part end, on the reference clock.
        parts: ``backend -> (start_ns, end_ns)`` of each part on the reference clock.
    """

    tracks: tuple[Track, ...]
    spans: tuple[Span, ...]
    instants: tuple[Instant, ...]
    counters: tuple[CounterSeries, ...]
    start_ns: int
    end_ns: int
    parts: dict[str, tuple[int, int]]


def merge(result: ProfileResult) -> Timeline:
    """Put every part of ``result`` on one timeline (the reference clock)."""
    tracks: list[Track] = []
    spans: list[Span] = []
    instants: list[Instant] = []
    counters: list[CounterSeries] = []
    bounds: dict[str, tuple[int, int]] = {}
    for part in result.parts:
        off = part.clock.offset_ns
        pre = f"{part.backend}/"
        tracks += [attrs.evolve(t, id=pre + t.id) for t in part.tracks]
        spans += [attrs.evolve(s, track=pre + s.track, start_ns=s.start_ns + off) for s in part.spans]
        instants += [attrs.evolve(i, track=pre + i.track, t_ns=i.t_ns + off) for i in part.instants]
        counters += [attrs.evolve(c, track=pre + c.track, t_ns=tuple(t + off for t in c.t_ns)) for c in part.counters]
        if part.start_ns or part.end_ns:
            bounds[part.backend] = (part.start_ns + off, part.end_ns + off)
    spans.sort(key=lambda s: (s.start_ns, -s.dur_ns, s.track))
    instants.sort(key=lambda i: (i.t_ns, i.track))
    starts = [b[0] for b in bounds.values()]
    ends = [b[1] for b in bounds.values()]
    return Timeline(tuple(tracks), tuple(spans), tuple(instants), tuple(counters),
                    min(starts) if starts else 0, max(ends) if ends else 0, bounds)


def measure_offset(own_now_ns: Callable[[], int], reference: Clock, *, rounds: int = 7) -> int:
    """The offset that maps times of clock ``own_now_ns`` onto ``reference``: ``own + offset = ref``.

    Reads ``reference``, then the own clock, then ``reference`` again, ``rounds`` times, and keeps the
    tightest bracket (least disturbed by preemption), taking the own reading to be at its middle.
    """
    best_width, best_offset = -1, 0
    for _ in range(max(1, rounds)):
        r0 = reference.now_ns()
        own = own_now_ns()
        r1 = reference.now_ns()
        if best_width < 0 or r1 - r0 < best_width:
            best_width, best_offset = r1 - r0, (r0 + r1) // 2 - own
    return best_offset
