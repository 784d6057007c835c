"""Profiling a multi-process job: every rank profiles the same steps into one run directory.

``Profiler(..., distributed=True)`` inside a job launched by ``torchrun`` / ``torch.distributed``
(env:// rendezvous; SLURM and Open MPI launchers too, once the job has called
``torch.distributed.init_process_group``), or a JAX job once every process called
``jax.distributed.initialize``, coordinates the ranks through the job's own communication layer
(:func:`job_collectives`: the torch process group, else the key-value store of jax's distributed
runtime, :class:`JaxCollectives`), so no shared filesystem is needed:

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
from typing import Any, Protocol

import attrs

from omniprof.core.results import BackendResult, ClockInfo, ErrorRecord, ProfileResult, RunMetadata
from omniprof.errors import DistributedError, InvalidArgumentError

__all__ = [
    "RankInfo", "ClockSync", "Collectives", "TorchCollectives", "detect_environment", "estimate_offset",
    "sync_clock", "merge_ranks", "rank_dir", "RANK_DIR_PREFIX", "CLOCK_ROUNDS", "load_run", "find_rank_results",
    "JaxCollectives", "job_collectives", "xplane_host_name", "place_xplanes", "XPLANE_SUFFIX",
]

#: rank N's part of a run lives in ``<run>/rank<N>/``.
RANK_DIR_PREFIX = "rank"
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


class Collectives(Protocol):
    """What the coordination needs from a job's communication layer (torch.distributed here)."""

    rank: int
    world_size: int

    def all_gather_object(self, obj: Any) -> list[Any]: ...

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None: ...

    def send_ints(self, values: Sequence[int], peer: int) -> None: ...

    def recv_ints(self, count: int, peer: int) -> list[int]: ...


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


#: After a collective that gloo runs on its worker threads (all-gather, gather), how long the caller
#: waits for the worker to let go of the tensors it was given (normally microseconds). Tensors still
#: held after that stay referenced by this module until the process exits (see :class:`TorchCollectives`).
GLOO_RELEASE_WAIT_S = 2.0
#: Tensors handed to such a collective that a worker thread of the process group may still hold.
_gloo_held: list[Any] = []


def _keep_until_released(tensors: Sequence[Any], wait_s: float = GLOO_RELEASE_WAIT_S) -> None:
    """Drop our references to ``tensors`` only once no gloo worker thread holds them any more.

    ``ProcessGroupGloo`` runs an all-gather or a gather on one of its worker threads, which marks
    the work complete (waking the caller) and only then drops its own references to the work's
    tensors. If the caller has let go of a tensor first, the worker's release is the last one and
    must take the GIL to free the tensor's Python object. When the interpreter starts finalizing
    while the worker waits for the GIL, Python ends that thread with ``pthread_exit``, whose forced
    unwind meets the tensor's ``noexcept`` destructor: ``std::terminate``, "terminate called without
    an active exception", SIGABRT. A rank whose last collective is ours and that exits right after
    (``Profiler.stop()`` then the end of the script) hits that now and then on a loaded machine;
    torch does not guard against it (pytorch/pytorch#190489). Holding a reference until the worker
    has let go (``Tensor._use_count() == 1``) means the worker never frees a Python object: the main
    thread does. Tensors still held after ``wait_s`` (or on a torch without ``_use_count``) are kept
    here until the process exits, which is safe too: the interpreter frees them only once it is
    finalizing, when torch no longer takes the GIL to free them.
    """
    import time

    from omniprof.core.clock import monotonic

    _gloo_held.extend(tensors)
    deadline = monotonic() + wait_s
    while True:
        _gloo_held[:] = [t for t in _gloo_held if getattr(t, "_use_count", lambda: 2)() > 1]
        if not _gloo_held or monotonic() >= deadline:
            return
        time.sleep(0.0002)  # sleep, not spin: on a busy CPU the worker thread needs it to run


class TorchCollectives:
    """:class:`Collectives` over ``torch.distributed`` (an initialised default process group).

    Object collectives and the clock exchange run on a gloo group: the default one when its backend
    includes gloo, else one created here with ``new_group(backend="gloo")`` (every rank must
    construct this object at the same point, as ``Profiler.start()`` does).

    Objects travel as :func:`encode_object` bytes (JSON, as over jax's key-value store; never
    pickle) in uint8 tensors this class creates and holds until gloo's worker thread has let go of
    them (:func:`_keep_until_released`), rather than through ``torch.distributed.all_gather_object``,
    whose internal tensors a worker thread may free as the process exits (a SIGABRT at exit).
    """

    def __init__(self) -> None:
        try:
            import torch.distributed as dist
        except ImportError as e:
            raise DistributedError("distributed=True needs torch.distributed (pip install 'omniprof[torch]'); "
                                   f"it cannot be imported: {e}") from e
        if not dist.is_available() or not dist.is_initialized():
            env = detect_environment()
            where = (f" The environment says this is rank {env.rank} of {env.world_size} ({env.launcher})."
                     if env else "")
            raise DistributedError(
                "distributed=True needs an initialised torch.distributed process group, and there is none." + where +
                " Call torch.distributed.init_process_group(...) (e.g. backend='gloo' or 'nccl', init_method='env://' "
                "under torchrun) before starting the Profiler, or leave distributed=False to profile this process alone")
        self._dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        backend = str(dist.get_backend())
        self.group = None if "gloo" in backend else dist.new_group(backend="gloo")
        self.backend = backend

    def _exchange(self, obj: Any, dst: int | None) -> list[Any] | None:
        """Every rank's ``obj``: on every rank (``dst`` None) or on rank ``dst`` only."""
        import torch

        data = encode_object(obj)
        size = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        self._dist.all_gather(sizes, size, group=self.group)
        _keep_until_released([size, *sizes])
        lengths = [int(s.item()) for s in sizes]
        padded = torch.zeros(max(lengths), dtype=torch.uint8)
        padded[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        outs: list[Any] | None = None
        if dst is None or self.rank == dst:
            outs = [torch.empty(max(lengths), dtype=torch.uint8) for _ in range(self.world_size)]
        if dst is None:
            self._dist.all_gather(outs, padded, group=self.group)
        else:
            self._dist.gather(padded, outs, dst=dst, group=self.group)
        _keep_until_released([padded, *(outs or ())])
        if outs is None:
            return None
        return [decode_object(o[:n].numpy().tobytes()) for o, n in zip(outs, lengths)]

    def all_gather_object(self, obj: Any) -> list[Any]:
        out = self._exchange(obj, None)
        assert out is not None  # every rank receives
        return out

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        return self._exchange(obj, dst)

    def send_ints(self, values: Sequence[int], peer: int) -> None:
        import torch

        # gloo's send and recv run on the caller's thread and let go of the tensor before returning.
        self._dist.send(torch.tensor(list(values), dtype=torch.int64), peer, group=self.group)

    def recv_ints(self, count: int, peer: int) -> list[int]:
        import torch

        buf = torch.zeros(count, dtype=torch.int64)
        self._dist.recv(buf, peer, group=self.group)
        return [int(x) for x in buf.tolist()]


#: how long a rank waits for the others in one coordination step over jax's key-value store.
JAX_TIMEOUT_S = 600
#: payloads over jax's key-value store go in pieces of at most this many bytes.
JAX_CHUNK_BYTES = 4 << 20
_jax_instances = 0


class JaxCollectives:
    """:class:`Collectives` over the key-value store of jax's distributed runtime: the coordination
    service ``jax.distributed.initialize`` started (on the coordinator, rank 0's process). No device
    computation runs, so nothing of the coordination lands in a trace, and no CPU collectives
    implementation is needed for it.

    Keys live under ``omniprof/<n>/`` (``n`` counts the instances made in this process; every rank
    makes its instances in the same order, as ``Profiler.start()`` does) and are deleted once read.
    A rank that does not arrive within :data:`JAX_TIMEOUT_S` fails the waiting ranks with a
    :class:`~omniprof.errors.DistributedError` naming it.
    """

    def __init__(self, timeout_s: float = JAX_TIMEOUT_S) -> None:
        global _jax_instances
        import sys

        jax = sys.modules.get("jax")
        if jax is None or not jax.distributed.is_initialized():
            raise DistributedError("distributed=True over jax needs jax.distributed.initialize(...) called first")
        try:
            from jax._src import distributed as jd

            client = jd.global_state.client
            self.rank, self.world_size = int(jd.global_state.process_id), int(jd.global_state.num_processes)
        except (ImportError, AttributeError) as e:  # a jax whose runtime moved: say what is missing
            raise DistributedError(f"this jax ({getattr(jax, '__version__', '?')}) does not expose its distributed "
                                   f"runtime's key-value store (jax._src.distributed.global_state.client): {e}") from e
        if client is None:
            raise DistributedError("jax.distributed is initialised but has no coordination client")
        self._client = client
        self._timeout_ms = int(timeout_s * 1000)
        self._prefix = f"omniprof/{_jax_instances}"
        _jax_instances += 1
        self._seq = 0
        self._sent: dict[int, int] = {}
        self._received: dict[int, int] = {}
        self.backend = "jax.distributed"

    def _call(self, what: str, peer: int | None, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:  # jax raises its runtime errors (DEADLINE_EXCEPTED, UNAVAILABLE) as one type
            who = "" if peer is None else f" {'to' if what == 'sending' else 'for'} rank {peer}"
            raise DistributedError(
                f"rank {self.rank}: {what}{who} over jax's key-value store failed: {type(e).__name__}: "
                f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}. Every rank must start, step and stop "
                f"its Profiler alike; a rank that died or lags more than {self._timeout_ms // 1000} s leaves the "
                f"others here") from e

    def _put(self, key: str, data: bytes) -> None:
        chunks = [data[i:i + JAX_CHUNK_BYTES] for i in range(0, len(data), JAX_CHUNK_BYTES)] or [b""]
        for i, c in enumerate(chunks):
            self._call("sending", None, self._client.key_value_set_bytes, f"{key}/{i}", c)
        self._call("sending", None, self._client.key_value_set, f"{key}/n", str(len(chunks)))

    def _get(self, key: str, peer: int) -> bytes:
        n = int(self._call("waiting", peer, self._client.blocking_key_value_get, f"{key}/n", self._timeout_ms))
        return b"".join(self._call("waiting", peer, self._client.blocking_key_value_get_bytes, f"{key}/{i}",
                                   self._timeout_ms) for i in range(n))

    def _exchange(self, obj: Any, readers: Sequence[int]) -> list[Any] | None:
        self._seq += 1
        base = f"{self._prefix}/{self._seq}"
        self._put(f"{base}/{self.rank}", encode_object(obj))
        if self.rank not in readers:
            return None
        out = [decode_object(self._get(f"{base}/{r}", r)) for r in range(self.world_size)]
        # The last reader removes the exchange's keys (the coordinator keeps them otherwise).
        if self._call("counting", None, self._client.key_value_increment, f"{base}/read", 1) == len(readers):
            self._call("cleaning up", None, self._client.key_value_delete, base)
        return out

    def all_gather_object(self, obj: Any) -> list[Any]:
        out = self._exchange(obj, range(self.world_size))
        assert out is not None  # every rank reads
        return out

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        return self._exchange(obj, (dst,))

    def send_ints(self, values: Sequence[int], peer: int) -> None:
        n = self._sent.get(peer, 0)
        self._sent[peer] = n + 1
        self._call("sending", peer, self._client.key_value_set, f"{self._prefix}/p2p/{self.rank}-{peer}/{n}",
                   ",".join(str(int(v)) for v in values))

    def recv_ints(self, count: int, peer: int) -> list[int]:
        n = self._received.get(peer, 0)
        self._received[peer] = n + 1
        key = f"{self._prefix}/p2p/{peer}-{self.rank}/{n}"
        raw = self._call("waiting", peer, self._client.blocking_key_value_get, key, self._timeout_ms)
        self._call("cleaning up", None, self._client.key_value_delete, key)
        values = [int(x) for x in raw.split(",")]
        if len(values) != count:
            raise DistributedError(f"rank {self.rank}: expected {count} integers from rank {peer}, got {len(values)}")
        return values


_BYTES_KEY, _ITEMS_KEY = "__omniprof_bytes__", "__omniprof_items__"


def _to_json(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray)):
        import base64

        return {_BYTES_KEY: base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not {_BYTES_KEY, _ITEMS_KEY} & set(obj):
            return {k: _to_json(v) for k, v in obj.items()}
        return {_ITEMS_KEY: [[_to_json(k), _to_json(v)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return [_to_json(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise InvalidArgumentError(f"cannot send a {type(obj).__name__} between ranks (JSON data, bytes and "
                               f"dicts with any keys only)")


def _from_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {_BYTES_KEY}:
            import base64

            return base64.b64decode(obj[_BYTES_KEY])
        if set(obj) == {_ITEMS_KEY}:
            return {_hashable(_from_json(k)): _from_json(v) for k, v in obj[_ITEMS_KEY]}
        return {k: _from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_json(v) for v in obj]
    return obj


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def encode_object(obj: Any) -> bytes:
    """What the ranks exchange over jax's key-value store, as JSON (never pickle: a peer's bytes are
    data, not code). Bytes travel as base64, dicts with non-string keys as key/value pairs; tuples
    come back as lists.

    >>> decode_object(encode_object({"a": (1, None), 3: b"\\x00\\xff"}))
    {'a': [1, None], 3: b'\\x00\\xff'}
    """
    import json

    return json.dumps(_to_json(obj), separators=(",", ":")).encode()


def decode_object(data: bytes) -> Any:
    """The inverse of :func:`encode_object`."""
    import json

    return _from_json(json.loads(data))


def job_collectives() -> Collectives:
    """The job's communication layer: ``torch.distributed`` when a process group is initialised
    here, else jax's distributed runtime when ``jax.distributed.initialize`` was called (torch wins
    when both are; neither module is imported by this check)."""
    import sys

    tdist = sys.modules.get("torch.distributed")
    if tdist is not None and tdist.is_available() and tdist.is_initialized():
        return TorchCollectives()
    jax = sys.modules.get("jax")
    if jax is not None and jax.distributed.is_initialized():
        return JaxCollectives()
    env = detect_environment()
    where = f" The environment says this is rank {env.rank} of {env.world_size} ({env.launcher})." if env else ""
    raise DistributedError(
        "distributed=True needs the job's communication layer, and there is none: call "
        "torch.distributed.init_process_group(...) (e.g. backend='gloo' or 'nccl', init_method='env://' under "
        "torchrun) or jax.distributed.initialize(...) before starting the Profiler, or leave distributed=False to profile this process alone." + where)


# -- the run directory and the merged result -------------------------------------------------------
def rank_dir(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """``<run>/rank<N>``: where rank ``N``'s part of a distributed run lives."""
    return Path(run_dir) / f"{RANK_DIR_PREFIX}{rank}"


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
    from omniprof.core.profiler import PARTIAL_FILENAME, RESULT_FILENAME

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
