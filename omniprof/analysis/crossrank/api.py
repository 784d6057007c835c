"""The entry points of the cross-rank analysis: a merged result (:func:`analyze_result`), a
directory of ranks (:func:`analyze_dir`), either (:func:`analyze`)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from omniprof.analysis.crossrank.combine import Combiner, combine
from omniprof.analysis.crossrank.pool import iter_reduce_local, loss_notes
from omniprof.analysis.crossrank.reduce import reduce_rank
from omniprof.analysis.crossrank.report import CrossRankReport
from omniprof.analysis.crossrank.summary import RankSummary
from omniprof.core.results import BackendResult, ProfileResult
from omniprof.errors import InvalidArgumentError, TraceReadError
from omniprof.formats.rankdir import rank_inputs

__all__ = ["analyze", "analyze_result", "analyze_dir", "is_rank_dir"]


def analyze_result(result: ProfileResult, **kw: Any) -> CrossRankReport:
    """Analyse a merged distributed result (its parts grouped by their ``rank``; times already on
    rank 0's clock)."""
    groups: dict[int, list[BackendResult]] = {}
    for p in result.parts:
        groups.setdefault(int(p.metadata.get("rank", 0)), []).append(p)
    rows = {int(x["rank"]): x for x in result.metadata.distributed.get("ranks", []) if isinstance(x, dict)}
    summaries = []
    for rank, parts in sorted(groups.items()):
        row = rows.get(rank, {})
        # The parts' offsets already hold the rank's clock offset; the summary shows it.
        s = reduce_rank(parts, rank=rank, host=str(parts[0].metadata.get("rank_host", "")),
                        clock_offset_ns=int(row.get("clock_offset_ns", 0) or 0),
                        clock_uncertainty_ns=int(row.get("clock_uncertainty_ns", 0) or 0))
        summaries.append(attrs.evolve(s, read_notes=loss_notes(parts, rank)))
    return combine(summaries, **kw)


def analyze_dir(path: str | os.PathLike[str], *, workers: int | None = None, executor: Any = None,
                **kw: Any) -> CrossRankReport:
    """Analyse every rank under ``path``: each rank read (in a stream) and reduced alone, and each
    small per-rank summary folded into a :class:`Combiner` as it arrives.

    Args:
        workers: processes here (default: one per core, at most one per rank).
        executor: ``"dask://host:port"`` (or a ``distributed.Client``): read and reduce each rank on
            a Dask worker that sees its file (:mod:`omniprof.analysis.crossrank.executor`); ``path`` is then
            the directory as the workers see it. ``workers`` does not apply.
    """
    if executor is not None:
        from omniprof.analysis.crossrank.executor import iter_reduce_ranks

        summaries: Iterable[RankSummary] = iter_reduce_ranks(path, executor)
    else:
        summaries = iter_reduce_local(rank_inputs(path), workers)
    c = Combiner(str(path))
    for s in summaries:
        c.add(s)
    return c.report(**kw)


def analyze(source: ProfileResult | str | os.PathLike[str], **kw: Any) -> CrossRankReport:
    """Cross-rank analysis of a merged result, a run directory, or a directory of Kineto traces.

    ``workers`` and ``executor`` (directories only): see :func:`analyze_dir`.

    .. versionadded:: 0.2
    """
    if isinstance(source, ProfileResult):
        if kw.pop("executor", None) is not None:
            raise InvalidArgumentError("an executor reads rank files where they are: give the run directory, not a "
                                       "result already in memory")
        kw.pop("workers", None)
        return analyze_result(source, **kw)
    return analyze_dir(source, **kw)


def is_rank_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory :func:`analyze_dir` reads: a distributed run (rank parts) or
    a directory holding only Kineto traces."""
    from omniprof.core.readers import detect_format

    try:
        return Path(path).is_dir() and detect_format(path) in ("result", "kineto")
    except TraceReadError:
        return False

