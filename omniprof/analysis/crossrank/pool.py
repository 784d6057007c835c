"""Each rank's file read and reduced alone (:func:`reduce_file`), in worker processes here
(:func:`iter_reduce_local`) or on a Dask cluster (:mod:`omniprof.analysis.crossrank.executor`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from omniprof.analysis.crossrank.reduce import LINKED_CATS, RankReducer, reduce_rank
from omniprof.analysis.crossrank.summary import RankSummary
from omniprof.core.results import BackendResult, ProfileResult, Span
from omniprof.errors import InvalidArgumentError, TraceReadError

__all__ = ["reduce_file", "iter_reduce_local", "reduce_local", "summary_of_result", "loss_notes"]


def summary_of_result(result: ProfileResult, rank: int | None = None, label: str = "") -> RankSummary:
    """One rank's own result reduced, its parts put on rank 0's clock by
    :func:`omniprof.core.distributed.merge_ranks` (the rank's ``clock_offset_ns``)."""
    from omniprof.core.distributed import merge_ranks

    d = result.metadata.distributed
    r = int(d.get("rank", 0)) if rank is None else rank
    return reduce_rank(merge_ranks([result]).parts, rank=r, host=result.metadata.host,
                       clock_offset_ns=int(d.get("clock_offset_ns", 0)),
                       clock_uncertainty_ns=int(d.get("clock_uncertainty_ns", 0)), label=label)


def loss_notes(parts: Sequence[BackendResult], rank: int) -> tuple[str, ...]:
    """What a rank's parts say they lost, one line each (the same from a run dir or a merged result)."""
    return tuple(f"rank {rank}: {loss.count} {loss.unit} not read ({loss.kind}): {loss.detail}"
                 for p in parts for loss in p.losses)


def reduce_file(path: str, kind: str, rank_hint: int | None = None) -> RankSummary:
    """Read one rank's file and reduce it: the one per-rank step, run by the local worker pool and
    by a distributed executor's workers (:mod:`omniprof.analysis.crossrank.executor`) alike.

    ``kind`` is ``"kineto"`` (a per-rank Kineto trace, read in a stream: only the reduction's
    compact tables are held, never the trace's spans) or ``"result"`` (an omniprof rank part).
    The rank: the trace's ``distributedInfo.rank``, else ``rank_hint`` (from the file name).
    What the reader could not read is kept in the summary's ``read_notes``.
    """
    if kind == "result":
        from omniprof.core.results import load

        res = load(path)
        s = summary_of_result(res, rank_hint, label=Path(path).parent.name)
        notes = loss_notes(res.parts, s.rank)
        return attrs.evolve(s, read_notes=notes) if notes else s
    if kind != "kineto":
        raise InvalidArgumentError(f"unknown rank file kind {kind!r} (expected 'kineto' or 'result')")
    from omniprof.formats.kineto import stream_spans

    red = RankReducer()
    red.begin_part()
    add = red.add

    def sink(s: Span) -> None:  # a Kineto trace is one part on its own clock: its times as they are
        cat = s.category
        corr = s.args.get("correlation_id") if cat in LINKED_CATS else None
        add(s.name, cat, s.start_ns, s.dur_ns, (corr,) if type(corr) is int else (),
            s.args.get("step_num") if cat == "step" else None)

    top = stream_spans(path, sink)
    if top["_bounds_ns"] is not None:
        red.bounds.append(top["_bounds_ns"])
    info = top.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) and isinstance(info.get("rank"), int) else rank_hint
    if rank is None:
        raise TraceReadError(f"{path}: no rank in the trace (distributedInfo.rank) nor in the file name (rank<N>)")
    s = red.finish(rank=int(rank), host=str(top.get("host_name", "")), label=Path(path).name)
    notes = tuple(f"{Path(path).name}: {x}" for x in top["_losses"])
    return attrs.evolve(s, read_notes=notes) if notes else s



def iter_reduce_local(inputs: Sequence[tuple[str, str, int | None]], workers: int | None = None
                      ) -> Iterator[RankSummary]:
    """:func:`reduce_file` of every input in ``workers`` processes here (default: one per core, at
    most one per rank; 1 reads them one after another in this process), each summary yielded as
    soon as it is done (in any order). At most ``2 * workers`` ranks are in flight, so finished
    summaries do not pile up in the pool."""
    n = workers if workers is not None else min(len(inputs), os.cpu_count() or 1)
    if n < 1:
        raise InvalidArgumentError(f"'workers' must be >= 1 (got {workers})")
    if n == 1 or len(inputs) <= 1:
        for x in inputs:
            yield reduce_file(*x)
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, wait

    # spawn, not fork: the parent may hold threads (a torch job, a profiler's sampler).
    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as ex:
        todo = list(reversed(inputs))
        running: set[Any] = set()
        while todo or running:
            while todo and len(running) < 2 * n:
                running.add(ex.submit(reduce_file, *todo.pop()))
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for f in done:
                yield f.result()


def reduce_local(inputs: Sequence[tuple[str, str, int | None]], workers: int | None = None) -> list[RankSummary]:
    """:func:`reduce_file` of every input (see :func:`iter_reduce_local`), as a list in the inputs' order."""
    n = workers if workers is not None else min(len(inputs), os.cpu_count() or 1)
    if n < 1:
        raise InvalidArgumentError(f"'workers' must be >= 1 (got {workers})")
    if n == 1 or len(inputs) <= 1:
        return [reduce_file(*x) for x in inputs]
    import multiprocessing

    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as ex:
        return list(ex.map(reduce_file, *zip(*inputs)))
