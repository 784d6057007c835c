"""Profiling a multi-process job: every rank profiles the same steps into one run directory.

``Profiler(..., distributed=True)`` inside a job launched by ``torchrun`` / ``torch.distributed``
(env:// rendezvous; SLURM and Open MPI launchers too, once the job has called
``torch.distributed.init_process_group``), or a JAX job once every process called
``jax.distributed.initialize``, coordinates the ranks through the job's own communication layer
(:func:`job_collectives`: the torch process group, else the key-value store of jax's distributed
runtime; the adapters, behind :class:`omniprof.core.collectives.Collectives`, live with the torch
and xla backends), so no shared filesystem is needed:

* **One schedule.** At ``start()`` the ranks compare their schedule and backends (an all-gather
  of JSON bytes, :meth:`Collectives.all_gather_object`); a mismatch raises
  :class:`~omniprof.errors.DistributedError` on every rank. Each recording session starts at the
  same step number on every rank (checked again).
* **One run directory.** Rank 0 names ``<logdir>/plugins/profile/<run>/`` once and tells the
  others (the same collective); rank ``N`` writes its part to ``<run>/rank<N>/`` (its
  ``omniprof.result.json`` and its native artifacts such as the Kineto trace), and its xplane to
  ``<run>/<host>_rank<N>.xplane.pb`` (:func:`place_xplanes`: XProf's multi-host layout, one host
  per rank).
* **Clock offsets.** After the backends stop, each rank exchanges timestamps with rank 0 over the
  process group (NTP-style, :data:`CLOCK_ROUNDS` rounds of point-to-point messages) and keeps the
  round with the least delay: ``offset = ((t2 - t1) + (t3 - t4)) / 2`` maps the rank's reference
  clock onto rank 0's, within ``uncertainty = delay / 2``. Both are recorded in the rank's
  ``metadata.distributed``.
* **One result.** Rank 0 gathers every rank's result (:meth:`Collectives.gather_object`), writes
  the parts it lacks under ``rank<N>/`` and the merged result (:func:`merge_ranks`) as
  ``<run>/omniprof.result.json``.
  The xplanes rank 0 cannot see (no shared filesystem) are sent to it next, over the same layer.

torch (or jax) is used only when a distributed session starts, and only if the job imported it.
A process group whose default backend is not gloo (NCCL) gets a gloo group of its own for this
coordination (``new_group``), created once, at the first ``start()``, by every rank together.

.. versionadded:: 0.2
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from omniprof.core.collectives import Collectives
from omniprof.core.results import BackendResult, ClockInfo, ErrorRecord, ProfileResult, RunMetadata
from omniprof.core.rundir import PARTIAL_FILENAME, RANK_DIR_PREFIX, RESULT_FILENAME, rank_dir
from omniprof.errors import DistributedError, InvalidArgumentError

if TYPE_CHECKING:
    from omniprof.core.registry import Registry

__all__ = [
    "RankInfo", "ClockSync", "Collectives", "detect_environment", "estimate_offset",
    "sync_clock", "merge_ranks", "rank_dir", "RANK_DIR_PREFIX", "CLOCK_ROUNDS", "load_run", "find_rank_results",
    "job_collectives", "COLLECTIVES_BACKENDS", "xplane_host_name", "place_xplanes", "XPLANE_SUFFIX",
]

#: timestamp exchanges per rank with rank 0; the least-delayed one is kept.
CLOCK_ROUNDS = 8


@attrs.frozen
class RankInfo:
    """Where this process sits in the job.

    Attributes:
        rank, world_size: global rank and number of ranks.
        local_rank: rank on this host (None when the launcher does not say).
        launcher: what told us: ``"torch.distributed"``, ``"torchrun"`` (``RANK``/``WORLD_SIZE``),
            ``"slurm"`` (``SLURM_PROCID``/``SLURM_NTASKS``) or ``"mpi"`` (``OMPI_COMM_WORLD_*``,
            ``PMI_RANK``/``PMI_SIZE``).
    """

    rank: int
    world_size: int
    local_rank: int | None = None
    launcher: str = ""


def _env_int(environ: Mapping[str, str], *names: str) -> tuple[str, int] | None:
    for name in names:
        raw = environ.get(name)
        if raw is not None and raw.strip():
            try:
                return name, int(raw)
            except ValueError:
                raise InvalidArgumentError(f"environment variable {name}={raw!r} must be an integer rank or size; "
                                           f"check the launcher's settings") from None
    return None


_LAUNCHERS = (
    ("torchrun", ("RANK",), ("WORLD_SIZE",), ("LOCAL_RANK",)),
    ("slurm", ("SLURM_PROCID",), ("SLURM_NTASKS", "SLURM_NPROCS"), ("SLURM_LOCALID",)),
    ("mpi", ("OMPI_COMM_WORLD_RANK", "PMI_RANK"), ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
     ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")),
)


def detect_environment(environ: Mapping[str, str] | None = None) -> RankInfo | None:
    """The rank and world size a launcher put in the environment (torchrun, SLURM, Open MPI/PMI),
    or None when none did.

    >>> detect_environment({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"})
    RankInfo(rank=3, world_size=8, local_rank=1, launcher='torchrun')
    >>> detect_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}).launcher
    'slurm'
    """
    environ = os.environ if environ is None else environ
    for launcher, rank_vars, size_vars, local_vars in _LAUNCHERS:
        rank = _env_int(environ, *rank_vars)
        size = _env_int(environ, *size_vars)
        if rank is None or size is None:
            continue
        local = _env_int(environ, *local_vars)
        if not 0 <= rank[1] < size[1]:
            raise InvalidArgumentError(f"{rank[0]}={rank[1]} is not a rank of a job of {size[0]}={size[1]} ranks; "
                                       f"check the launcher's settings")
        return RankInfo(rank[1], size[1], local[1] if local else None, launcher)
    return None


# -- clock offsets ---------------------------------------------------------------------------------
@attrs.frozen
class ClockSync:
    """How this rank's reference clock maps onto rank 0's: ``t_rank0 = t + offset_ns``.

    Attributes:
        offset_ns: the estimate from the least-delayed round.
        uncertainty_ns: half that round's round-trip delay: the true offset lies within
            ``offset_ns ± uncertainty_ns`` whatever the split of the delay between the two ways.
        delay_ns: that round's round-trip delay (rank 0's own turnaround excluded).
        rounds: exchanges made.
    """

    offset_ns: int = 0
    uncertainty_ns: int = 0
    delay_ns: int = 0
    rounds: int = 0

    def to_dict(self) -> dict[str, int]:
        return attrs.asdict(self)


def estimate_offset(samples: Sequence[tuple[int, int, int, int]]) -> ClockSync:
    """NTP's estimate from ``(t1, t2, t3, t4)`` exchanges: ``t1`` sent and ``t4`` received on this
    rank's clock, ``t2`` received and ``t3`` sent on rank 0's. The round with the least delay
    ``(t4 - t1) - (t3 - t2)`` wins (least disturbed by scheduling and queueing).

    >>> estimate_offset([(100, 1_150, 1_160, 220), (300, 1_310, 1_311, 330)])
    ClockSync(offset_ns=995, uncertainty_ns=15, delay_ns=29, rounds=2)
    """
    if not samples:
        raise InvalidArgumentError("estimate_offset needs at least one (t1, t2, t3, t4) exchange")
    best: tuple[int, int] | None = None
    for t1, t2, t3, t4 in samples:
        delay = (t4 - t1) - (t3 - t2)
        offset = ((t2 - t1) + (t3 - t4)) // 2
        if best is None or delay < best[0]:
            best = (delay, offset)
    assert best is not None  # samples is not empty
    delay, offset = best
    delay = max(delay, 0)
    return ClockSync(offset_ns=offset, uncertainty_ns=(delay + 1) // 2, delay_ns=delay, rounds=len(samples))


def sync_clock(coll: Collectives, now_ns: Callable[[], int], rounds: int = CLOCK_ROUNDS) -> ClockSync:
    """Estimate this rank's clock offset to rank 0 (every rank calls it together; rank 0 gets 0).

    Rank 0 serves the ranks one after another, ``rounds`` exchanges each, so no two ranks queue
    on it at once.
    """
    if coll.world_size <= 1:
        return ClockSync()
    if coll.rank == 0:
        for peer in range(1, coll.world_size):
            for _ in range(rounds):
                coll.recv_ints(1, peer)
                t2 = now_ns()
                t3 = now_ns()
                coll.send_ints((t2, t3), peer)
        return ClockSync(rounds=rounds)
    samples = []
    for _ in range(rounds):
        t1 = now_ns()
        coll.send_ints((t1,), 0)
        t2, t3 = coll.recv_ints(2, 0)
        t4 = now_ns()
        samples.append((t1, t2, t3, t4))
    return estimate_offset(samples)


#: The backends whose frameworks can carry a distributed session's coordination, in the order asked
#: (torch wins when both run a job): each hands out its adapter through ``Backend.job_collectives()``.
COLLECTIVES_BACKENDS = ("torch", "xla")


def job_collectives(registry: Registry | None = None) -> Collectives:
    """The job's communication layer: ``torch.distributed`` when a process group is initialised
    here, else jax's distributed runtime when ``jax.distributed.initialize`` was called (torch wins
    when both are; neither framework is imported by this check). Each adapter comes from its
    backend class (:data:`COLLECTIVES_BACKENDS`, through ``registry``)."""
    from omniprof.core.registry import get_registry
    from omniprof.errors import OmniprofError

    registry = registry or get_registry()
    for name in COLLECTIVES_BACKENDS:
        try:
            cls = registry.backend(name)
        except OmniprofError:  # not installed, switched off, or broken: that framework cannot carry it
            continue
        coll = cls.job_collectives()
        if coll is not None:
            return coll
    env = detect_environment()
    where = f" The environment says this is rank {env.rank} of {env.world_size} ({env.launcher})." if env else ""
    raise DistributedError(
        "distributed=True needs the job's communication layer, and there is none: call "
        "torch.distributed.init_process_group(...) (e.g. backend='gloo' or 'nccl', init_method='env://' under "
        "torchrun) or jax.distributed.initialize(...) before starting the Profiler, or leave distributed=False to profile this process alone." + where)


# -- the run directory and the merged result -------------------------------------------------------
#: XProf reads ``<run>/<host>.xplane.pb`` as one host of a multi-host run.
XPLANE_SUFFIX = ".xplane.pb"


def xplane_host_name(host: str, rank: int) -> str:
    """The host name rank ``N``'s xplane goes by in the run: ``<host>_rank<N>``, so ranks sharing a
    machine stay apart in XProf's host list, and each host's entry says its rank.

    >>> xplane_host_name("node7", 3)
    'node7_rank3'
    """
    return f"{host or 'localhost'}_{RANK_DIR_PREFIX}{rank}"


def place_xplanes(parts: Sequence[BackendResult], run_dir: Path, host: str, rank: int) -> list[BackendResult]:
    """Move this rank's xplanes from its ``rank<N>/`` directory to ``<run>/<host>_rank<N>.xplane.pb``
    (the XProf multi-host layout: one run, one file per host) and point the parts' artifacts there.
    A second xplane of the rank gets ``_1``, ``_2``... A file that cannot be moved stays where it
    is, with a warning."""
    import warnings

    from omniprof.errors import OmniprofWarning

    out = []
    k = 0
    for p in parts:
        arts = []
        for a in p.artifacts:
            src = Path(a.path)
            if a.kind != "xplane" or not src.is_file() or src.parent == run_dir:
                arts.append(a)
                continue
            stem = xplane_host_name(host, rank) + (f"_{k}" if k else "")
            k += 1
            dst = run_dir / f"{stem}{XPLANE_SUFFIX}"
            try:
                os.replace(src, dst)
            except OSError as e:
                warnings.warn(f"rank {rank}: the xplane {src} could not be moved to {dst} ({e}); XProf will not list "
                              f"it as a host of the run", OmniprofWarning, stacklevel=2)
                arts.append(a)
                continue
            arts.append(attrs.evolve(a, path=str(dst)))
        out.append(attrs.evolve(p, artifacts=arts) if arts != list(p.artifacts) else p)
    return out


def xplanes_missing(run_dir: Path, results: Sequence[ProfileResult]) -> dict[int, list[str]]:
    """Rank -> names of its xplanes that are not in ``run_dir`` here (no shared filesystem)."""
    out: dict[int, list[str]] = {}
    for r in results:
        for p in r.parts:
            for a in p.artifacts:
                name = Path(a.path).name
                if a.kind == "xplane" and name.endswith(XPLANE_SUFFIX) and not (run_dir / name).is_file():
                    out.setdefault(int(r.metadata.distributed.get("rank", 0)), []).append(name)
    return out


def xplane_bytes(parts: Sequence[BackendResult], names: Sequence[str]) -> dict[str, bytes]:
    """The named xplanes of this rank's parts, read for sending to rank 0."""
    wanted = set(names)
    out: dict[str, bytes] = {}
    for p in parts:
        for a in p.artifacts:
            if a.kind == "xplane" and Path(a.path).name in wanted:
                out[Path(a.path).name] = Path(a.path).read_bytes()
    return out


def repoint_artifacts(result: ProfileResult, run_dir: Path, names: Sequence[str]) -> ProfileResult:
    """``result`` with its artifacts called ``names`` pointing into ``run_dir`` (rank 0's copies)."""
    wanted = set(names)
    parts = [attrs.evolve(p, artifacts=[attrs.evolve(a, path=str(run_dir / Path(a.path).name))
                                        if Path(a.path).name in wanted else a for a in p.artifacts])
             for p in result.parts]
    return attrs.evolve(result, parts=tuple(parts))


def merge_ranks(results: Sequence[ProfileResult]) -> ProfileResult:
    """One result holding every rank's parts on rank 0's clock.

    Each rank's result carries ``metadata.distributed`` (``rank``, ``clock_offset_ns``, ...); its
    parts are copied with the rank's clock offset added to theirs and ``rank``, ``rank_host`` and
    ``rank_pid`` added to their metadata, which the timeline and the Perfetto layout use to keep
    ranks apart (one process per rank, ``host / rank N``). Errors are prefixed with their rank.
    """
    if not results:
        raise InvalidArgumentError("merge_ranks needs at least one rank's result")
    ordered = sorted(results, key=lambda r: int(r.metadata.distributed.get("rank", 0)))
    ranks = [int(r.metadata.distributed.get("rank", i)) for i, r in enumerate(ordered)]
    if len(set(ranks)) != len(ranks):
        raise InvalidArgumentError(f"merge_ranks got two results for one rank (ranks {ranks})")
    parts = []
    errors: list[ErrorRecord] = []
    rows = []
    starts, ends = [], []
    for rank, r in zip(ranks, ordered):
        d = r.metadata.distributed
        off = int(d.get("clock_offset_ns", 0))
        host, pid = r.metadata.host, r.metadata.pid
        rows.append({"rank": rank, "host": host, "pid": pid, "clock_offset_ns": off,
                     "clock_uncertainty_ns": int(d.get("clock_uncertainty_ns", 0)),
                     "local_rank": d.get("local_rank"), "partial": r.partial})
        for p in r.parts:
            parts.append(attrs.evolve(p, clock=ClockInfo(p.clock.name, p.clock.offset_ns + off),
                                      metadata={**p.metadata, "rank": rank, "rank_host": host, "rank_pid": pid}))
        errors += [attrs.evolve(e, source=f"rank {rank}/{e.source}") for e in r.errors]
        if r.metadata.start_ns or r.metadata.end_ns:
            starts.append(r.metadata.start_ns + off)
            ends.append(r.metadata.end_ns + off)
    first = ordered[0].metadata
    world = max([int(r.metadata.distributed.get("world_size", 0)) for r in ordered] + [len(ordered)])
    missing = sorted(set(range(world)) - set(ranks))
    dist_meta = {"merged": True, "world_size": world, "ranks": rows, "run": first.distributed.get("run", "")}
    if missing:
        dist_meta["missing_ranks"] = missing
        errors.append(ErrorRecord(source="omniprof", phase="merge", type="MissingRanks",
                                  message=f"no result from rank(s) {missing} of {world}"))
    md = attrs.evolve(first, distributed=dist_meta, start_ns=min(starts) if starts else first.start_ns,
                      end_ns=max(ends) if ends else first.end_ns)
    return ProfileResult(metadata=md, parts=tuple(parts), partial=any(r.partial for r in ordered) or bool(missing),
                         errors=tuple(errors))


def find_rank_results(run_dir: str | os.PathLike[str]) -> dict[int, Path]:
    """``rank -> <run>/rank<N>/omniprof.result.json`` for every rank part in a run directory."""

    out: dict[int, Path] = {}
    for d in Path(run_dir).iterdir():
        name = d.name
        if not (d.is_dir() and name.startswith(RANK_DIR_PREFIX) and name[len(RANK_DIR_PREFIX):].isdigit()):
            continue
        for fname in (RESULT_FILENAME, PARTIAL_FILENAME):
            if (d / fname).is_file():
                out[int(name[len(RANK_DIR_PREFIX):])] = d / fname
                break
    return dict(sorted(out.items()))


def load_run(run_dir: str | os.PathLike[str]) -> ProfileResult:
    """The merged result of a distributed run directory, rebuilt from its ``rank<N>/`` parts
    (the merged file rank 0 wrote is not needed: a run whose rank 0 died can still be read)."""
    from omniprof.core.results import load

    found = find_rank_results(run_dir)
    if not found:
        from omniprof.errors import TraceReadError

        raise TraceReadError(f"{run_dir}: no rank<N>/omniprof.result.json inside: not a distributed omniprof run "
                             f"directory")
    return merge_ranks([load(p) for p in found.values()])


def _describe_schedule(schedule: Any) -> Any:
    if schedule is None:
        return None
    to_dict = getattr(schedule, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return f"{getattr(schedule, '__module__', '?')}.{getattr(schedule, '__qualname__', type(schedule).__name__)}"


def check_agreement(coll: Collectives, backends: Sequence[str], schedule: Any) -> None:
    """Every rank profiles with the same backends and schedule; else all ranks raise the same error."""
    mine = {"backends": list(backends), "schedule": _describe_schedule(schedule)}
    everyone = coll.all_gather_object(mine)
    odd = [r for r, x in enumerate(everyone) if x != everyone[0]]
    if odd:
        raise DistributedError(
            f"ranks disagree on what to profile: rank 0 has {everyone[0]}, rank {odd[0]} has {everyone[odd[0]]} "
            f"({len(odd)} rank(s) differ). Give every rank the same backend list and schedule, so all record the "
            f"same steps")


def agree_session(coll: Collectives, step: int, run_name: str | None) -> str | None:
    """At a session's prepare: every rank is at the same step; returns rank 0's run name."""
    everyone = coll.all_gather_object((step, run_name))
    steps = [s for s, _ in everyone]
    if len(set(steps)) != 1:
        raise DistributedError(f"ranks reached a profiling session at different step numbers ({steps} by rank); "
                               f"every rank must call Profiler.step() once per training step")
    return everyone[0][1]


def rank_metadata(md: RunMetadata, info: dict[str, Any]) -> RunMetadata:
    return attrs.evolve(md, distributed=info)
