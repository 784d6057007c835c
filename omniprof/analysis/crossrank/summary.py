"""What one rank reduces to: a :class:`RankSummary`, its steps (:class:`StepTable`) and its
collectives (:class:`CollectiveTable`) held column by column, so its size follows the rank's steps
and collectives, not its events nor the number of ranks."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator

import attrs

from omniprof.analysis.sketch import DurationSketch
from omniprof.core.validators import to_tuple

__all__ = ["StepRow", "StepTable", "CollectiveTable", "RankSummary"]


@attrs.frozen
class StepRow:
    """One step on one rank: ``step`` number, ``start_ns`` (rank 0's clock where offsets are known),
    ``dur_ns``, ``compute_ns``/``communication_ns``/``idle_ns`` inside it, and its ``top_ops``
    (``(name, total_ns)``, communication excluded, longest first)."""

    step: int
    start_ns: int
    dur_ns: int
    compute_ns: int
    communication_ns: int
    idle_ns: int
    top_ops: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=lambda x: tuple(tuple(r) for r in x))


def _q(values: Iterable[int] = ()) -> array[int]:
    return array("q", values)


@attrs.frozen
class StepTable:
    """A rank's steps column by column (8 bytes a figure, not a Python object a row): a sequence of
    :class:`StepRow` (each row built when asked for). ``top_*``: each step's top ops, rows
    ``top_at[i]:top_at[i + 1]`` of ``top_name`` (index into ``names``) and ``top_ns``."""

    step: array[int] = attrs.field(factory=_q)
    start_ns: array[int] = attrs.field(factory=_q)
    dur_ns: array[int] = attrs.field(factory=_q)
    compute_ns: array[int] = attrs.field(factory=_q)
    communication_ns: array[int] = attrs.field(factory=_q)
    idle_ns: array[int] = attrs.field(factory=_q)
    top_at: array[int] = attrs.field(factory=lambda: array("q", [0]))
    top_name: array[int] = attrs.field(factory=_q)
    top_ns: array[int] = attrs.field(factory=_q)
    names: tuple[str, ...] = ()

    @classmethod
    def of(cls, rows: Iterable[StepRow]) -> StepTable:
        t = cls()
        ids: dict[str, int] = {}
        names: list[str] = []
        for r in rows:
            t.step.append(r.step)
            t.start_ns.append(r.start_ns)
            t.dur_ns.append(r.dur_ns)
            t.compute_ns.append(r.compute_ns)
            t.communication_ns.append(r.communication_ns)
            t.idle_ns.append(r.idle_ns)
            for name, ns in r.top_ops:
                i = ids.get(name)
                if i is None:
                    i = ids[name] = len(names)
                    names.append(name)
                t.top_name.append(i)
                t.top_ns.append(ns)
            t.top_at.append(len(t.top_ns))
        return attrs.evolve(t, names=tuple(names))

    def __len__(self) -> int:
        return len(self.step)

    def __getitem__(self, i: int) -> StepRow:
        if not -len(self.step) <= i < len(self.step):
            raise IndexError(f"step row {i} of {len(self.step)}")
        i %= len(self.step)
        tops = tuple((self.names[self.top_name[k]], self.top_ns[k]) for k in range(self.top_at[i], self.top_at[i + 1]))
        return StepRow(self.step[i], self.start_ns[i], self.dur_ns[i], self.compute_ns[i], self.communication_ns[i],
                       self.idle_ns[i], tops)

    def __iter__(self) -> Iterator[StepRow]:
        return (self[i] for i in range(len(self.step)))


@attrs.frozen
class CollectiveTable:
    """A rank's collectives column by column: a sequence of ``(name, start_ns, dur_ns)`` in start
    order; ``name`` indexes ``names``."""

    name: array[int] = attrs.field(factory=_q)
    start_ns: array[int] = attrs.field(factory=_q)
    dur_ns: array[int] = attrs.field(factory=_q)
    names: tuple[str, ...] = ()

    @classmethod
    def of(cls, rows: Iterable[tuple[str, int, int]]) -> CollectiveTable:
        t = cls()
        ids: dict[str, int] = {}
        for name, a, d in rows:
            i = ids.setdefault(name, len(ids))
            t.name.append(i)
            t.start_ns.append(a)
            t.dur_ns.append(d)
        return attrs.evolve(t, names=tuple(ids))

    def __len__(self) -> int:
        return len(self.name)

    def __getitem__(self, i: int) -> tuple[str, int, int]:
        return (self.names[self.name[i]], self.start_ns[i], self.dur_ns[i])

    def __iter__(self) -> Iterator[tuple[str, int, int]]:
        names = self.names
        return ((names[n], a, d) for n, a, d in zip(self.name, self.start_ns, self.dur_ns))


def _step_table(x: Iterable[StepRow]) -> StepTable:
    return x if isinstance(x, StepTable) else StepTable.of(x)


def _collective_table(x: Iterable[tuple[str, int, int]]) -> CollectiveTable:
    return x if isinstance(x, CollectiveTable) else CollectiveTable.of(x)


@attrs.frozen
class RankSummary:
    """One rank reduced: see the module docs for every figure's meaning. Its size follows the rank's
    steps and collectives, not its events nor the number of ranks: ``steps`` holds one row per step
    (8 bytes a figure), ``collectives`` one ``(name, start_ns, dur_ns)`` per communication span (20
    bytes each) in start order (the primary kind only: GPU communication kernels, else
    ``gloo:``/``nccl:`` spans, else any), ``durations`` bounded sketches. ``read_notes``: what
    reading the rank lost (malformed events, unread phases, samples its backends dropped), one line
    each; the report lists them."""

    rank: int
    host: str
    source: str
    window_ns: int
    compute_ns: int
    communication_ns: int
    memory_ns: int
    overlap_ns: int
    exposed_communication_ns: int
    exposed_memory_ns: int
    idle_ns: int
    idle_causes: dict[str, int]
    steps: StepTable = attrs.field(converter=_step_table)
    collectives: CollectiveTable = attrs.field(converter=_collective_table)
    clock_offset_ns: int = 0
    clock_uncertainty_ns: int = 0
    label: str = ""
    #: name -> :class:`~omniprof.analysis.sketch.DurationSketch` of every kernel (GPU ranks: compute,
    #: communication, memcpy/memset) or op (CPU ranks: CPU and XLA ops, communication spans) the
    #: breakdown classified, over the whole trace: at most :data:`MAX_DURATION_NAMES` names, those
    #: with the most total time.
    durations: dict[str, DurationSketch] = attrs.field(factory=dict)
    #: how many names past :data:`MAX_DURATION_NAMES` (those with the least total time) are summed
    #: into ``durations_other`` (one sketch of all their runs) instead.
    durations_left_out: int = 0
    durations_other: DurationSketch | None = None
    read_notes: tuple[str, ...] = attrs.field(default=(), converter=to_tuple)

    @property
    def overlap_pct(self) -> float:
        return 100.0 * self.overlap_ns / self.communication_ns if self.communication_ns else 0.0

    def pct(self, value_ns: int) -> float:
        return 100.0 * value_ns / self.window_ns if self.window_ns else 0.0

