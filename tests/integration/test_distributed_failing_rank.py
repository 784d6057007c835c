"""A rank that raises inside ``Profiler(distributed=True)`` never hangs the job (issue 31, F8).

Before, the failing rank blocked in ``sync_clock`` at stop waiting for ranks that were waiting for
it elsewhere, its exception unprinted, and the job hung for gloo's 30-minute timeout. Now the rank
saves its part locally (marked partial), its exception propagates, and the launcher (real torchrun,
real gloo on 127.0.0.1) sees it fail and stops the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import omniprof
from omniprof.core.profiler import RESULT_FILENAME
from tests.tools import free_port

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("failing_rank_job.py")


@pytest.mark.slow
def test_a_failing_rank_ends_the_job_with_its_traceback_and_its_partial_part(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "KINETO_LOG_LEVEL": "4", "OMNIPROF_CHECKPOINT_S": "0"}
    # A hang (the bug) runs into this bound, far below gloo's own 30 minutes; the job's whole
    # process group (torchrun and its ranks) is then killed, so no rank outlives the test.
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(JOB), str(tmp_path)],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        out, err = job.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        raise
    proc = subprocess.CompletedProcess(job.args, job.returncode, out, err)
    assert proc.returncode != 0, proc.stderr[-3000:]
    # rank 1's own traceback, printed by the rank itself
    assert "RuntimeError: rank 1 failed on purpose" in proc.stderr, proc.stderr[-3000:]
    assert 'failing_rank_job.py", line' in proc.stderr
    run_dir = Path((tmp_path / "run_dir1.txt").read_text())
    part = run_dir / "rank1" / RESULT_FILENAME
    assert part.is_file(), sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    r = omniprof.load(part)
    assert r.partial and r.metadata.distributed["rank"] == 1
    assert [(e.source, e.type) for e in r.errors] == [("workload", "RuntimeError")]
    assert r.part("cpu").samples
