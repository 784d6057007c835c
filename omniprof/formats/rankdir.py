"""A directory of per-rank traces: an omniprof distributed run (``rank<N>/omniprof.result.json``) or
a directory of per-rank Kineto traces (what Holistic Trace Analysis takes: the rank from the trace's
``distributedInfo.rank``, else from a ``rank<N>`` in the file name). :func:`rank_inputs` names each
rank's file; :func:`load_kineto_dir` reads the Kineto traces as one merged result."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import attrs

from omniprof.core.results import ProfileResult
from omniprof.errors import TraceReadError

__all__ = ["rank_inputs", "load_kineto_dir"]

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def _is_trace_file(p: Path) -> bool:
    n = p.name
    return p.is_file() and (n.endswith((".json", ".json.gz")) and not n.startswith("omniprof."))


def rank_inputs(path: str | os.PathLike[str]) -> list[tuple[str, str, int | None]]:
    """``(file, kind, rank hint)`` per rank in a run directory or a directory of Kineto traces: kind
    ``"result"`` (an omniprof rank part) or ``"kineto"``; the hint is the rank the file's name or
    directory gives, None where it gives none."""
    from omniprof.core.distributed import find_rank_results

    d = Path(path)
    if not d.is_dir():
        raise TraceReadError(f"{d}: not a directory (give a distributed run directory or a directory of per-rank "
                             f"Kineto traces)")
    ours = find_rank_results(d)
    if ours:
        return [(str(p), "result", rank) for rank, p in ours.items()]
    files = sorted(p for p in d.iterdir() if _is_trace_file(p))
    if not files:
        raise TraceReadError(f"{d}: no rank<N>/omniprof.result.json and no Kineto trace (*.json, *.json.gz) inside")
    out = []
    for p in files:
        m = _RANK_IN_NAME.search(p.name)
        out.append((str(p), "kineto", int(m.group(1)) if m else None))
    return out


def load_kineto_dir(path: str | os.PathLike[str]) -> ProfileResult:
    """A directory of per-rank Kineto traces (HTA's input) as one merged result: each trace's rank
    from its ``distributedInfo.rank``, else from ``rank<N>`` in its name. Times stay each trace's own
    Kineto clock (Unix-based, so hosts line up as well as their clocks do; no offset is estimated)."""
    from omniprof.core.distributed import load_run, merge_ranks
    from omniprof.formats.kineto import read_trace

    results = []
    for file, kind, hint in rank_inputs(path):
        if kind != "kineto":
            return load_run(path)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = read_trace(file)
        for w in caught:  # losses stay counted in the part; say them once, naming the file
            warnings.warn(str(w.message), w.category, stacklevel=2)
        info = res.parts[0].metadata.get("distributedInfo")
        rank = info.get("rank") if isinstance(info, dict) and isinstance(info.get("rank"), int) else hint
        if rank is None:
            raise TraceReadError(f"{file}: no rank in the trace (distributedInfo.rank) nor in the file name (rank<N>)")
        world = info.get("world_size", 0) if isinstance(info, dict) else 0
        results.append(attrs.evolve(res, metadata=attrs.evolve(
            res.metadata, distributed={"rank": int(rank), "world_size": int(world or 0), "launcher": "kineto trace"})))
    ranks = [r.metadata.distributed["rank"] for r in results]
    if len(set(ranks)) != len(ranks):
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        raise TraceReadError(f"{path}: several files claim rank(s) {dup}; keep one trace per rank in the directory")
    return merge_ranks(results)
