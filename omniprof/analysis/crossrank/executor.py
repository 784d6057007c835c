"""Run the per-rank read+reduce of a cross-rank analysis on a Dask cluster.

``crossrank.analyze(path, executor="dask://host:port")`` (and ``omniprof report RUN_DIR --executor
dask://host:port``) sends each rank's :func:`omniprof.analysis.crossrank.pool.reduce_file` to a worker
that sees that rank's file, and brings back only its :class:`~omniprof.analysis.crossrank.summary.RankSummary`
(its size set by the rank's steps and collectives, not its events), each as soon as it is done,
released on the cluster once handed on; the traces never travel. Which worker sees which file is
asked of every worker first (``Client.run``), so traces on each host's local disk are read on that
host; on a shared filesystem any worker may read any rank.

Why Dask (not Ray): pure Python and light (``dask`` + ``distributed``, no native runtime to build
or ship), a scheduler and workers start in-process or with two commands (``dask scheduler``,
``dask worker``), it already runs on the HPC schedulers training jobs use (dask-jobqueue for SLURM/PBS,
dask-mpi), and its ``Client.run`` lets us ask each worker what files it sees, which is how the
work goes to where the traces are. The analysis needs nothing more than map-and-gather.

``dask`` and ``distributed`` are imported only when an executor is given: ``pip install
'omniprof[distributed]'``.

.. versionadded:: 0.2
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omniprof.errors import InvalidArgumentError, TraceReadError

if TYPE_CHECKING:
    from omniprof.analysis.crossrank.summary import RankSummary

__all__ = ["parse_address", "iter_reduce_ranks", "map_reduce_ranks", "CONNECT_TIMEOUT_S"]

#: seconds to wait for the scheduler before saying it cannot be reached
CONNECT_TIMEOUT_S = 10.0
_ADDRESS = re.compile(r"^(dask|tcp|tls)://([^/:\s]+|\[[0-9a-fA-F:]+\]):(\d{1,5})/?$")


def parse_address(executor: str) -> str:
    """``dask://host:port`` (or ``tcp://``/``tls://``) -> the scheduler address Dask takes."""
    m = _ADDRESS.match(executor.strip())
    if not m:
        if executor.startswith("ray://"):
            raise InvalidArgumentError(f"executor {executor!r}: Ray is not supported; omniprof runs on Dask "
                                       f"(give dask://host:port of a Dask scheduler; docs/distributed.md says why)")
        raise InvalidArgumentError(f"executor {executor!r}: expected dask://host:port (a Dask scheduler's address, "
                                   f"e.g. dask://10.0.0.5:8786)")
    scheme, host, port = m.groups()
    if not 0 < int(port) < 65536:
        raise InvalidArgumentError(f"executor {executor!r}: port {port} is not in 1..65535")
    return f"{'tcp' if scheme == 'dask' else scheme}://{host}:{port}"


def _client(executor: Any, timeout_s: float) -> tuple[Any, bool]:
    """A ``distributed.Client`` for ``executor`` (an address or a Client); whether we own it."""
    if not isinstance(executor, str):
        if hasattr(executor, "submit") and hasattr(executor, "run"):
            return executor, False
        raise InvalidArgumentError(f"executor must be 'dask://host:port' or a distributed.Client, not "
                                   f"{type(executor).__name__}")
    address = parse_address(executor)
    try:
        from distributed import Client
    except ImportError:
        raise InvalidArgumentError(f"executor {executor!r} needs dask and distributed, which are not installed: "
                                   f"pip install 'omniprof[distributed]' (or drop the executor to analyse here)"
                                   ) from None
    try:
        return Client(address, timeout=timeout_s, set_as_default=False), True
    except (OSError, TimeoutError) as e:
        raise InvalidArgumentError(
            f"cannot reach a Dask scheduler at {address} within {timeout_s:g} s ({type(e).__name__}): start one "
            f"there (`dask scheduler` and `dask worker {address}`) or fix the address, or drop --executor to "
            f"analyse on this machine") from None


def _visible(path: str) -> list[tuple[str, str, int | None]] | None:
    """On a worker: the rank files it sees under ``path`` (None where it sees no such directory)."""
    from omniprof.formats.rankdir import rank_inputs

    if not Path(path).is_dir():
        return None
    try:
        return rank_inputs(path)
    except TraceReadError:
        return None


def iter_reduce_ranks(path: str | os.PathLike[str], executor: Any, *,
                      timeout_s: float = CONNECT_TIMEOUT_S) -> Iterator[RankSummary]:
    """Every rank under ``path`` (as the workers see it) read and reduced on a worker that sees it,
    each summary yielded as soon as it is back (in any order) and released on the cluster then, so
    neither the workers nor this process hold the summaries already handed on.

    Raises:
        InvalidArgumentError: a bad or unreachable address, or dask not installed.
        TraceReadError: no worker sees rank files under ``path``, or a rank's file is unreadable
            (the worker's message, naming the file).
    """
    from omniprof.analysis.crossrank.pool import reduce_file

    client, owned = _client(executor, timeout_s)
    try:
        from distributed import as_completed

        seen: dict[str, Any] = client.run(_visible, str(path))
        where: dict[tuple[str, str, int | None], list[str]] = {}
        for worker, inputs in sorted(seen.items()):
            for x in inputs or ():
                where.setdefault(tuple(x), []).append(worker)  # type: ignore[arg-type]
        if not where:
            raise TraceReadError(f"{path}: none of the {len(seen)} Dask worker(s) at {client.scheduler.address} sees "
                                 f"rank files there; give the run directory's path as the workers see it (a shared "
                                 f"filesystem, or the same path on each host)")
        futures = [client.submit(reduce_file, *x, workers=ws, allow_other_workers=False, pure=False,
                                 key=f"omniprof-reduce-{i}-{Path(x[0]).name}")
                   for i, (x, ws) in enumerate(sorted(where.items()))]
        done = as_completed(futures, loop=client.loop)
        del futures  # as_completed holds them now, and lets each go once it is handed on
        for f in done:
            s = f.result()
            f.release()
            yield s
    finally:
        if owned:
            client.close()


def map_reduce_ranks(path: str | os.PathLike[str], executor: Any, *,
                     timeout_s: float = CONNECT_TIMEOUT_S) -> list[RankSummary]:
    """:func:`iter_reduce_ranks` as a list, in rank order."""
    return sorted(iter_reduce_ranks(path, executor, timeout_s=timeout_s), key=lambda s: s.rank)
