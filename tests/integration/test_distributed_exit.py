"""A rank that exits right after a distributed Profiler stops must exit cleanly (issue 17: the
docs' torchrun example lost rank 1 to SIGABRT, "terminate called without an active exception",
about once in ten runs on a loaded machine).

Cause: gloo's worker thread drops its references to an all-gather's tensors after the caller
returned; when that drop frees a tensor's Python object it takes the GIL, and if the interpreter
starts finalizing meanwhile, Python ends the thread with pthread_exit through a noexcept destructor:
std::terminate. ``tests/integration/exit_job.py`` makes both halves of that race certain on rank 1
(real gloo on 127.0.0.1, real torchrun, nothing mocked), so each run below is decisive:
torch's own ``all_gather_object`` as the last collective aborts (the control: the race is real on
this torch and the job triggers it), the Profiler's collectives do not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from omniprof.core.distributed import load_run
from tests.tools import free_port

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("exit_job.py")


def _torchrun(out: Path, mode: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "KINETO_LOG_LEVEL": "4"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(JOB), str(out), mode],
                          cwd=out, env=env, capture_output=True, text=True, timeout=300)


def _torchrun_raced(base: Path, mode: str, attempts: int = 5) -> tuple[subprocess.CompletedProcess, dict, Path]:
    """``_torchrun`` until rank 1 saw the race's precondition (a gloo worker still held the all-gather's
    tensor when it returned). The job makes it likely, not certain: a worker that drops its references
    before the woken main thread runs again leaves nothing to race (seen once in a quiet CI run), and
    such a run proves nothing either way. Each attempt runs in its own directory."""
    for i in range(attempts):
        out = base / f"attempt{i}"
        out.mkdir(parents=True)
        proc = _torchrun(out, mode)
        seen = json.loads((out / "rank1.json").read_text())
        assert seen["workers_held_back"] == 2, seen  # both of gloo's worker threads, found by name
        if seen["worker_held_tensor"]:
            return proc, seen, out
    pytest.fail(f"{mode}: in {attempts} runs no gloo worker still held the all-gather's tensor when it returned: "
                f"the race cannot be set up on this torch/machine")


def _rank1_exit(proc: subprocess.CompletedProcess) -> str:
    """What torchrun says about rank 1 (its exit code line), or '' when the job succeeded."""
    return "\n".join(ln for ln in proc.stderr.splitlines() if "local_rank: 1" in ln or "terminate called" in ln)


@pytest.mark.slow
def test_rank_exits_cleanly_right_after_a_distributed_profiler_stops(tmp_path: Path) -> None:
    # The control: the same exit with torch's all_gather_object as the last collective aborts.
    proc, seen, _ = _torchrun_raced(tmp_path / "torch", "torch")
    assert proc.returncode != 0, "torch's all_gather_object no longer aborts at exit: the race may be fixed upstream"
    assert "terminate called without an active exception" in proc.stderr, proc.stderr[-3000:]
    # rank 1 is the one made to race, but rank 0 may lose the same race first (seen in CI: rank 0
    # aborted, and torchrun then stopped rank 1 with SIGTERM)
    assert f"exitcode: -{int(signal.SIGABRT)}" in proc.stderr, proc.stderr[-3000:]

    # The Profiler's collectives, in the very same conditions: both ranks exit 0, the run is whole.
    proc, seen, fixed = _torchrun_raced(tmp_path / "profiler", "profiler")
    assert proc.returncode == 0, f"rank 1: {_rank1_exit(proc)}\n{proc.stderr[-3000:]}"
    assert "terminate called" not in proc.stderr
    run_dir = fixed / (fixed / "run_dir.txt").read_text()
    merged = load_run(run_dir)
    assert sorted(r["rank"] for r in merged.metadata.distributed["ranks"]) == [0, 1]
    assert not merged.partial, merged.errors


ROUND_TRIP = '''
import json, sys
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from omniprof.backends.torch import collectives as od
    coll = od.TorchCollectives()
    mine = {"rank": rank, 7: [1, None], "blob": bytes(range(256)) * (1 + 3000 * rank)}  # sizes differ by rank
    everyone = coll.all_gather_object(mine)
    held_after_all_gather = len(od._gloo_held)
    at_zero = coll.gather_object({"from": rank}, dst=0)
    open(f"{out}/rank{rank}.json", "w").write(json.dumps({"rank": rank, "blobs": [len(e["blob"]) for e in everyone],
                      "same": [e == {"rank": r, 7: [1, None], "blob": bytes(range(256)) * (1 + 3000 * r)}
                               for r, e in enumerate(everyone)],
                      "gathered": at_zero, "held": [held_after_all_gather, len(od._gloo_held)]}))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(rank_main, args=(int(sys.argv[1]), sys.argv[2]), nprocs=2, join=True)
'''


@pytest.mark.slow
def test_torch_collectives_exchange_objects_of_every_size_and_let_go_of_their_tensors(tmp_path: Path) -> None:
    """Over real gloo (2 processes): each rank's object, of a different size per rank, comes back
    whole on every rank (all-gather) or on rank 0 only (gather), int keys and bytes included, and no
    tensor is left held once gloo's worker thread has let go of it."""
    script = tmp_path / "round_trip.py"
    script.write_text(ROUND_TRIP)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(script), str(free_port()), str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [s["rank"] for s in seen] == [0, 1]
    for s in seen:
        assert s["blobs"] == [256, 256 * 3001] and s["same"] == [True, True], s
        assert s["held"] == [0, 0], s
    assert seen[0]["gathered"] == [{"from": 0}, {"from": 1}] and seen[1]["gathered"] is None
