"""Remove device activity from a serialized XSpace (``device_tracer_level=0``).

jax has no device-tracer switch and XLA records device activity anyway; this rewrites the xplane
before it is saved, so the native artifact (what XProf and TensorBoard show) holds no more than the
result does. Device activity is what :func:`omniprof.formats.xplane._is_device_activity`
leaves out of the result: every ``/device:*`` plane, and on host planes the events of XLA ops the
host device executed (events carrying ``hlo_op`` or ``device_ordinal``) and XLA's ``end: <op>``
markers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["strip_device_activity", "strip_marks", "DEVICE_STATS", "MARK"]

#: The stat omniprof's annotations carry while a profiler server runs in the process (a remote
#: capture has no other way to tell them from XLA's own ranges); removed before a file is saved.
MARK = "_omniprof"

DEVICE_STATS = frozenset({"hlo_op", "device_ordinal"})


def strip_device_activity(data: bytes) -> tuple[bytes, int]:
    """``(new xspace bytes, number of events removed)``."""
    from omniprof.formats import xspace as xs

    space = xs.XSpace.FromString(data)
    removed = 0
    kept_planes: list[Any] = []
    for plane in space.planes:
        if plane.name.startswith("/device:"):
            removed += sum(len(line.events) for line in plane.lines)
            continue
        stat_names = {i: m.name for i, m in plane.stat_metadata.items()}
        device_md = {i for i, m in plane.event_metadata.items()
                     if m.name.startswith("end: ") or any(stat_names.get(s.metadata_id) in DEVICE_STATS for s in m.stats)}
        for line in plane.lines:
            keep = [e for e in line.events
                    if e.metadata_id not in device_md and not any(stat_names.get(s.metadata_id) in DEVICE_STATS
                                                                  for s in e.stats)]
            if len(keep) == len(line.events):
                continue
            removed += len(line.events) - len(keep)
            copies = []
            for e in keep:
                c = xs.XEvent()
                c.CopyFrom(e)
                copies.append(c)
            del line.events[:]
            line.events.extend(copies)
        kept_planes.append(plane)
    if len(kept_planes) != len(space.planes):
        copies = []
        for p in kept_planes:
            c = xs.XPlane()
            c.CopyFrom(p)
            copies.append(c)
        del space.planes[:]
        space.planes.extend(copies)
    return space.SerializeToString(), removed


def strip_marks(data: bytes) -> tuple[bytes, frozenset[str]]:
    """Remove the ``_omniprof`` stat from every event: ``(new xspace bytes, names of the marked events)``.

    The names let the reader file those ranges as annotations; the saved file (what XProf shows)
    carries no omniprof bookkeeping. Data without marks comes back unchanged.
    """
    if MARK.encode() not in data:
        return data, frozenset()
    from omniprof.formats import xspace as xs

    space = xs.XSpace.FromString(data)
    names: set[str] = set()
    for plane in space.planes:
        mark_ids = {i for i, m in plane.stat_metadata.items() if m.name == MARK}
        if not mark_ids:
            continue
        for line in plane.lines:
            for e in line.events:
                kept = [st for st in e.stats if st.metadata_id not in mark_ids]
                if len(kept) == len(e.stats):
                    continue
                md = plane.event_metadata.get(e.metadata_id)
                if md is not None:
                    names.add(md.name)
                copies = []
                for st in kept:
                    c = xs.XStat()
                    c.CopyFrom(st)
                    copies.append(c)
                del e.stats[:]
                e.stats.extend(copies)
        for i in mark_ids:
            del plane.stat_metadata[i]
    return space.SerializeToString(), frozenset(names)
