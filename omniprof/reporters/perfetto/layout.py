"""The track layout: every track of every part as a Perfetto track (plain data, no encoding)."""

from __future__ import annotations

import attrs

from omniprof.core import validators as v
from omniprof.core.results import BackendResult, ProfileResult, Track

__all__ = ["TrackRow", "Layout", "layout"]

_PID_BASE = 10_000_000  # synthetic pids/tids start here: above Linux's pid_max (2**22)


# -- layout: tracks, processes, threads ---------------------------------------------------------
@attrs.frozen
class TrackRow:
    """One Perfetto track.

    Attributes:
        uuid: TrackDescriptor.uuid (> 0).
        kind: ``"process"``, ``"thread"``, ``"named"`` (device/stream/other), ``"lane"`` or ``"counter"``.
        name: shown name.
        pid: the process it belongs to. tid: for thread tracks.
        parent_uuid: enclosing track (0: none).
        unit: counter unit (counter tracks).
    """

    uuid: int
    kind: str
    name: str
    pid: int = attrs.field(converter=v.to_int)  # a plain int: JSON gets 1, never True
    tid: int = attrs.field(default=0, converter=v.to_int)
    parent_uuid: int = 0
    unit: str = ""


@attrs.define
class Layout:
    """All tracks of a result, and how each part's track ids, threads and counters map onto them.

    ``span_tracks[(part, track_id)]`` is the TrackRow spans of that track go to;
    ``sample_threads[(part, thread_id)]`` the thread TrackRow of a sampled thread;
    ``counter_tracks[(part, series_index)]`` a counter's TrackRow.
    """

    tracks: list[TrackRow] = attrs.field(factory=list)
    span_tracks: dict[tuple[int, str], TrackRow] = attrs.field(factory=dict)
    sample_threads: dict[tuple[int, int], TrackRow] = attrs.field(factory=dict)
    counter_tracks: dict[tuple[int, int], TrackRow] = attrs.field(factory=dict)
    _procs: dict[tuple[str, int], TrackRow] = attrs.field(factory=dict)
    _threads: dict[tuple[int, int], TrackRow] = attrs.field(factory=dict)
    _lanes: dict[tuple[int, int], TrackRow] = attrs.field(factory=dict)
    _next_synthetic: int = _PID_BASE

    def _uuid(self) -> int:
        return len(self.tracks) + 1

    def synthetic_id(self) -> int:
        self._next_synthetic += 1
        return self._next_synthetic

    def process(self, name: str, pid: int | None) -> TrackRow:
        key = (name, pid if pid is not None else -1)
        row = self._procs.get(key)
        if row is None:
            row = TrackRow(self._uuid(), "process", name, pid if pid is not None else self.synthetic_id())
            self.tracks.append(row)
            self._procs[key] = row
        return row

    def thread(self, proc: TrackRow, tid: int | None, name: str) -> TrackRow:
        tid = tid if tid is not None else self.synthetic_id()
        row = self._threads.get((proc.pid, tid))
        if row is None:
            row = TrackRow(self._uuid(), "thread", name, proc.pid, tid, proc.uuid)
            self.tracks.append(row)
            self._threads[(proc.pid, tid)] = row
        return row

    def named(self, proc: TrackRow, name: str) -> TrackRow:
        # Chrome JSON has no named tracks: these become threads with a synthetic tid there.
        row = TrackRow(self._uuid(), "named", name, proc.pid, self.synthetic_id(), proc.uuid)
        self.tracks.append(row)
        return row

    def counter(self, proc: TrackRow, name: str, unit: str) -> TrackRow:
        row = TrackRow(self._uuid(), "counter", name, proc.pid, 0, proc.uuid, unit)
        self.tracks.append(row)
        return row

    def lane(self, base: TrackRow, n: int) -> TrackRow:
        """Overflow lane ``n`` (2, 3, ...) of slice track ``base``."""
        row = self._lanes.get((base.uuid, n))
        if row is None:
            row = TrackRow(self._uuid(), "lane", f"{base.name} (lane {n})", base.pid, self.synthetic_id(), base.uuid)
            self.tracks.append(row)
            self._lanes[(base.uuid, n)] = row
        return row


def _host_process_name(result: ProfileResult) -> str:
    md = result.metadata
    prog = " ".join(md.argv[:1]) if md.argv else ""
    base = f"python {prog}".strip() if prog else "python"
    return f"{base} ({md.host})" if md.host else base


def _rank_processes(lay: Layout, result: ProfileResult) -> dict[int, TrackRow]:
    """A merged distributed result: one process per rank, ``host / rank N`` (part index -> row).

    A rank keeps its own pid unless another rank (on another host) has the same one; then it gets a
    synthetic pid, since viewers identify processes by pid."""
    out: dict[int, TrackRow] = {}
    by_rank: dict[int, TrackRow] = {}
    used: set[int] = set()
    for pi, part in enumerate(result.parts):
        if "rank" not in part.metadata:
            continue
        rank = int(part.metadata["rank"])
        row = by_rank.get(rank)
        if row is None:
            host = str(part.metadata.get("rank_host") or "")
            pid = part.metadata.get("rank_pid")
            pid = pid if isinstance(pid, int) and pid > 0 and pid not in used else lay.synthetic_id()
            used.add(pid)
            row = by_rank[rank] = lay.process(f"{host} / rank {rank}" if host else f"rank {rank}", pid)
        out[pi] = row
    return out


def layout(result: ProfileResult) -> Layout:
    """Assign every track of every part a Perfetto track (plain data; no encoding).

    The parts of a merged distributed result (``rank`` in their metadata) each go under their
    rank's process, ``host / rank N``: threads as its threads, devices and streams as its named tracks.
    """
    lay = Layout()
    ranks = _rank_processes(lay, result)
    if ranks:
        for pi, part in enumerate(result.parts):
            _rank_layout(lay, pi, part, ranks.get(pi) or lay.process(_host_process_name(result), None))
        return lay
    host_pid = result.metadata.pid or None
    host = lay.process(_host_process_name(result), host_pid)
    for pi, part in enumerate(result.parts):
        counter_owners: dict[str, TrackRow] = {}
        for t in part.tracks:
            if t.kind == "counter":  # a counter-only track: its series go under its process, no slice track
                counter_owners[t.id] = _track_process(lay, result, host, t)
            else:
                lay.span_tracks[(pi, t.id)] = _track_row(lay, result, host, t)
        natives = {t.tid: lay.span_tracks[(pi, t.id)] for t in part.tracks
                   if t.kind == "thread" and t.tid is not None and (t.pid in (None, host_pid))}
        for th in part.threads:
            row = natives.get(th.native_id) if th.native_id is not None else None
            if row is None:
                row = lay.thread(host, th.native_id, th.name)
            lay.sample_threads[(pi, th.thread_id)] = row
        for ci, series in enumerate(part.counters):
            owner = lay.span_tracks.get((pi, series.track))
            proc = counter_owners.get(series.track) or (
                lay.tracks[owner.parent_uuid - 1] if owner is not None and owner.parent_uuid else host)
            lay.counter_tracks[(pi, ci)] = lay.counter(proc, series.name, series.unit)
    return lay


def _rank_layout(lay: Layout, pi: int, part: BackendResult, proc: TrackRow) -> None:
    counter_owner: dict[str, TrackRow] = {}
    for t in part.tracks:
        if t.kind == "counter":
            counter_owner[t.id] = proc
        elif t.kind == "thread" and t.device is None and t.tid is not None:
            lay.span_tracks[(pi, t.id)] = lay.thread(proc, t.tid, t.name)
        else:
            name = t.name if t.device is None or t.name.startswith("/device") else f"/device:{t.device} {t.name}"
            lay.span_tracks[(pi, t.id)] = lay.named(proc, name)
    natives = {t.tid: lay.span_tracks[(pi, t.id)] for t in part.tracks
               if t.kind == "thread" and t.device is None and t.tid is not None}
    for th in part.threads:
        row = natives.get(th.native_id) if th.native_id is not None else None
        lay.sample_threads[(pi, th.thread_id)] = row if row is not None else lay.thread(proc, th.native_id, th.name)
    for ci, series in enumerate(part.counters):
        lay.counter_tracks[(pi, ci)] = lay.counter(proc, series.name, series.unit)


def _device_process_name(t: Track) -> str:
    return f"/device:{t.device}" if t.device is not None else "other"


def _track_process(lay: Layout, result: ProfileResult, host: TrackRow, t: Track) -> TrackRow:
    """The process row a track belongs to: the run's process for its host threads (and for
    counter tracks of no device), a process per other pid, per device, or per named process."""
    host_pid = result.metadata.pid or None
    if t.kind in ("thread", "counter") and t.device is None:
        if t.pid is None or t.pid == host_pid:
            return host
        return lay.process(t.process or f"process {t.pid}", t.pid)
    if t.kind == "process":
        return lay.process(t.process or t.name, t.pid)
    return lay.process(t.process or _device_process_name(t), t.pid)


def _track_row(lay: Layout, result: ProfileResult, host: TrackRow, t: Track) -> TrackRow:
    proc = _track_process(lay, result, host, t)
    if t.kind == "thread" and t.device is None:
        return lay.thread(proc, t.tid, t.name)
    return lay.named(proc, t.name)


