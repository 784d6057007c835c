"""Distributed coordination pieces that run without a job: launcher environments, the NTP estimate,
the clock exchange, merging ranks, and the errors a misconfigured job gets."""

from __future__ import annotations

import queue
import random
import threading
import time
from pathlib import Path

import pytest

import omniprof
from omniprof.core import distributed as dist
from omniprof.core.results import BackendResult, ClockInfo, ErrorRecord, ProfileResult, RunMetadata, Span, Track
from omniprof.analysis.timeline import merge
from omniprof.errors import DistributedError, InvalidArgumentError
from omniprof.reporters.perfetto import layout
from omniprof.testing.fakes import SkewedClock


@pytest.mark.parametrize(("env", "want"), [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, dist.RankInfo(3, 8, 1, "torchrun")),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1"}, dist.RankInfo(5, 6, 1, "slurm")),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, dist.RankInfo(0, 2, None, "mpi")),
    ({"PMI_RANK": "1", "PMI_SIZE": "4"}, dist.RankInfo(1, 4, None, "mpi")),
    ({"RANK": "1"}, None),
    ({}, None),
])
def test_detect_environment(env: dict, want: dist.RankInfo | None) -> None:
    """Each launcher's variables give rank, world size and local rank; a lone RANK is not a job."""
    assert dist.detect_environment(env) == want


@pytest.mark.parametrize("env", [{"RANK": "x", "WORLD_SIZE": "2"}, {"RANK": "2", "WORLD_SIZE": "2"}])
def test_detect_environment_rejects_bad_values(env: dict) -> None:
    """A non-integer or out-of-range rank is one clear error naming the variable."""
    with pytest.raises(InvalidArgumentError, match="RANK"):
        dist.detect_environment(env)


def test_estimate_offset_bounds_the_true_offset() -> None:
    """With random one-way delays, the least-delay round's estimate is within its uncertainty of
    the offset the exchanges were built with, and that uncertainty is the smallest half-delay."""
    rng = random.Random(7)
    true = -123_456_789
    samples = []
    for _ in range(20):
        t1 = rng.randrange(10**9)
        up, turn, down = rng.randrange(1, 10**6), rng.randrange(0, 1000), rng.randrange(1, 10**6)
        t2 = t1 + up + true
        samples.append((t1, t2, t2 + turn, t1 + up + turn + down))
    est = dist.estimate_offset(samples)
    assert abs(est.offset_ns - true) <= est.uncertainty_ns
    assert est.delay_ns == min((t4 - t1) - (t3 - t2) for t1, t2, t3, t4 in samples)
    assert est.rounds == 20
    with pytest.raises(InvalidArgumentError):
        dist.estimate_offset([])


class _PairCollectives:
    """Two ranks in one process, talking over queues (point-to-point only, as sync_clock needs)."""

    def __init__(self, rank: int, boxes: dict) -> None:
        self.rank, self.world_size, self.boxes = rank, 2, boxes

    def send_ints(self, values, peer):  # type: ignore[no-untyped-def]
        self.boxes[(self.rank, peer)].put(list(values))

    def recv_ints(self, count, peer):  # type: ignore[no-untyped-def]
        return self.boxes[(peer, self.rank)].get(timeout=10)


def test_sync_clock_recovers_an_injected_skew() -> None:
    """Rank 1 runs 3 s ahead; the exchange over real threads finds -3 s within the uncertainty."""
    boxes = {(0, 1): queue.Queue(), (1, 0): queue.Queue()}
    out = {}

    def rank(r: int, now) -> None:  # type: ignore[no-untyped-def]
        out[r] = dist.sync_clock(_PairCollectives(r, boxes), now)

    threads = [threading.Thread(target=rank, args=(0, time.perf_counter_ns)),
               threading.Thread(target=rank, args=(1, SkewedClock(3_000_000_000).now_ns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out[0] == dist.ClockSync(rounds=dist.CLOCK_ROUNDS)
    assert abs(out[1].offset_ns + 3_000_000_000) <= out[1].uncertainty_ns + 1
    assert out[1].rounds == dist.CLOCK_ROUNDS


def _rank_result(rank: int, offset: int, pid: int, host: str = "h") -> ProfileResult:
    part = BackendResult(backend="torch", clock=ClockInfo("kineto", 100), start_ns=0, end_ns=50,
                         tracks=[Track("t", "main", pid=pid, tid=pid)],
                         spans=[Span("op", "t", 10, 5, "cpu_op")])
    md = RunMetadata(host=host, pid=pid, start_ns=0, end_ns=60,
                     distributed={"rank": rank, "world_size": 3, "clock_offset_ns": offset,
                                  "clock_uncertainty_ns": 7, "run": "r1"})
    return ProfileResult(metadata=md, parts=(part,), errors=(ErrorRecord("torch", "stop", "E", "m"),) if rank else ())


def test_merge_ranks_shifts_each_rank_onto_rank0s_clock() -> None:
    """Parts keep their own offset plus their rank's; rank, host and pid land in part metadata;
    errors are prefixed by rank; a rank that sent nothing is named."""
    merged = dist.merge_ranks([_rank_result(1, -1000, 11), _rank_result(0, 0, 10)])
    assert [p.metadata["rank"] for p in merged.parts] == [0, 1]
    assert [p.clock.offset_ns for p in merged.parts] == [100, 100 - 1000]
    assert merged.metadata.distributed["missing_ranks"] == [2] and merged.partial
    assert [e.source for e in merged.errors] == ["rank 1/torch", "omniprof"]
    assert merged.metadata.start_ns == -1000 and merged.metadata.end_ns == 60
    tl = merge(merged)
    assert [(s.track, s.start_ns) for s in tl.spans] == [("rank1/torch/t", 10 + 100 - 1000), ("rank0/torch/t", 110)]
    assert ProfileResult.from_dict(merged.to_dict()) == merged
    with pytest.raises(InvalidArgumentError, match="two results for one rank"):
        dist.merge_ranks([_rank_result(0, 0, 1), _rank_result(0, 0, 2)])


def test_perfetto_layout_gives_each_rank_its_process() -> None:
    """'host / rank N' per rank, its threads under it; equal pids on two hosts get apart."""
    merged = dist.merge_ranks([_rank_result(0, 0, 10, "a"), _rank_result(1, 0, 10, "b"), _rank_result(2, 0, 12, "b")])
    lay = layout(merged)
    procs = [(t.name, t.pid) for t in lay.tracks if t.kind == "process"]
    assert [n for n, _ in procs] == ["a / rank 0", "b / rank 1", "b / rank 2"]
    assert len({p for _, p in procs}) == 3 and procs[0][1] == 10 and procs[2][1] == 12
    rows = [lay.span_tracks[(i, "t")] for i in range(3)]
    assert [r.pid for r in rows] == [p for _, p in procs]


def test_distributed_profiler_needs_a_process_group() -> None:
    """Without torch.distributed initialised, start() says how to fix it and nothing runs."""
    pytest.importorskip("torch")
    prof = omniprof.Profiler(backend="cpu", distributed=True)
    with pytest.raises(DistributedError, match="init_process_group"):
        prof.start()
    assert not prof.is_running
    with pytest.raises(InvalidArgumentError, match="distributed"):
        omniprof.Profiler(backend="cpu", distributed="yes")  # type: ignore[arg-type]


class _Everyone:
    """all_gather_object answers as if other ranks had sent ``others``."""

    rank, world_size = 0, 2

    def __init__(self, others: list) -> None:
        self.others = others

    def all_gather_object(self, obj):  # type: ignore[no-untyped-def]
        return [obj, *self.others]


def test_ranks_must_agree_on_schedule_backends_and_step() -> None:
    """A rank with another schedule, or reaching a session at another step, fails every rank."""
    s = omniprof.schedule(wait=1, active=2)
    dist.check_agreement(_Everyone([{"backends": ["torch"], "schedule": s.to_dict()}]), ["torch"], s)
    with pytest.raises(DistributedError, match="disagree"):
        dist.check_agreement(_Everyone([{"backends": ["torch"], "schedule": None}]), ["torch"], s)
    assert dist.agree_session(_Everyone([(3, None)]), 3, "run") == "run"
    with pytest.raises(DistributedError, match="different step"):
        dist.agree_session(_Everyone([(4, None)]), 3, "run")


JAX_ONE_PROCESS = '''
import socket, sys
import jax
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1, process_id=0)
from omniprof.core import distributed as dist
from omniprof.errors import DistributedError
coll = dist.job_collectives()
print("kind", type(coll).__name__, coll.rank, coll.world_size)
big = bytes(range(256)) * 40_000                     # 10 MB: three 4 MiB pieces
print("roundtrip", coll.all_gather_object(big) == [big], coll.gather_object({"a": 1}) == [{"a": 1}])
coll.send_ints([5, -7], 0)
print("p2p", coll.recv_ints(2, 0))
client = jax._src.distributed.global_state.client
print("left", len(client.key_value_dir_get("omniprof/")))
from omniprof.backends.xla.collectives import JaxCollectives
slow = JaxCollectives(timeout_s=1)
try:
    slow.recv_ints(2, 1)
except DistributedError as e:
    print("error", e)
jax.distributed.shutdown()
'''


def test_jax_collectives_round_trip_clean_up_and_time_out(tmp_path: Path) -> None:
    """Over a real jax coordination service (one process): a 10 MB object in pieces comes back
    whole, integers go point to point, no key is left behind, and a rank that never answers is a
    DistributedError naming it after the timeout."""
    import os
    import subprocess
    import sys

    pytest.importorskip("jax")
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", JAX_ONE_PROCESS], capture_output=True, text=True, env=env,
                         timeout=180, cwd=tmp_path).stdout.splitlines()
    assert out[:4] == ["kind JaxCollectives 0 1", "roundtrip True True", "p2p [5, -7]", "left 0"], out
    assert out[4].startswith("error rank 0: waiting for rank 1 over jax's key-value store failed"), out
    assert "lags more than 1 s" in out[4]


def test_xplanes_move_to_the_run_dir_under_their_rank_name(tmp_path: Path) -> None:
    """place_xplanes moves rank<N>/<host>.xplane.pb to <run>/<host>_rank<N>.xplane.pb and points
    the artifact there; other artifacts stay; what rank 0 lacks is named and repointed."""
    from omniprof.core.results import Artifact

    run = tmp_path / "run"
    (run / "rank3").mkdir(parents=True)
    (run / "rank3" / "h.xplane.pb").write_bytes(b"x1")
    (run / "rank3" / "t.json").write_text("{}")
    part = BackendResult(backend="xla", artifacts=[Artifact("xplane", str(run / "rank3" / "h.xplane.pb")),
                                                   Artifact("trace_json", str(run / "rank3" / "t.json"))])
    (moved,) = dist.place_xplanes([part], run, "h", 3)
    assert [a.path for a in moved.artifacts] == [str(run / "h_rank3.xplane.pb"), str(run / "rank3" / "t.json")]
    assert (run / "h_rank3.xplane.pb").read_bytes() == b"x1" and not (run / "rank3" / "h.xplane.pb").exists()
    res = ProfileResult(metadata=RunMetadata(distributed={"rank": 3}), parts=(moved,))
    elsewhere = tmp_path / "rank0s_run"
    elsewhere.mkdir()
    assert dist.xplanes_missing(run, [res]) == {}
    assert dist.xplanes_missing(elsewhere, [res]) == {3: ["h_rank3.xplane.pb"]}
    assert dist.xplane_bytes(res.parts, ["h_rank3.xplane.pb"]) == {"h_rank3.xplane.pb": b"x1"}
    again = dist.repoint_artifacts(res, elsewhere, ["h_rank3.xplane.pb"])
    assert [a.path for a in again.parts[0].artifacts] == [str(elsewhere / "h_rank3.xplane.pb"),
                                                          str(run / "rank3" / "t.json")]
