"""A rank that exits right after its last collective, with gloo's worker threads held back:
the conditions of the SIGABRT at exit that docs/distributed.md's torchrun example hit now and then
(see ``omniprof.backends.torch.collectives._keep_until_released``). Run by torchrun, 2 ranks, gloo on 127.0.0.1.

``python -m torch.distributed.run --nproc-per-node 2 ... exit_job.py OUT MODE``: ``MODE`` is
``profiler`` (a ``Profiler(distributed=True)`` session is the last thing the ranks do together) or
``torch`` (``torch.distributed.all_gather_object`` is, with no omniprof at all: the control).

On rank 1 the two conditions of the race are made certain instead of left to the machine's load:

* gloo's worker threads (``pt_gloo_runloop``) run only when the main thread does not (SCHED_IDLE,
  on the main thread's CPU), so they drop their references to a collective's tensors late, as a
  descheduled worker does on a busy machine;
* the main thread's last act before the interpreter finalizes holds the GIL while it sleeps (an
  atexit callback registered first, so it runs last), so a worker that reaches for the GIL then is
  still waiting for it when finalization begins.

Rank 1 writes ``OUT/rank1.json``: how many worker threads it held back, and whether one still held
a tensor when an all-gather had returned (the race's precondition, measured on this torch).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import sys
from pathlib import Path

HOLD_US = 50_000
_KEEP: list = []  # the process group, held to the end (as a DDP model is): it outlives destroy_process_group
atexit.register(ctypes.PyDLL(None).usleep, HOLD_US)  # PyDLL: the call keeps the GIL


def _hold_back_gloo_workers(expected: int = 2, wait_s: float = 10.0) -> int:
    """Pin every thread to the main thread's CPU and make gloo's worker threads SCHED_IDLE. The
    workers name themselves once running: wait until ``expected`` (gloo's default) carry the name."""
    import time

    cpu = min(os.sched_getaffinity(0))
    deadline = time.monotonic() + wait_s
    while True:
        workers = []
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as fh:
                if fh.read().strip() == "pt_gloo_runloop":
                    workers.append(int(tid))
        if len(workers) >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), {cpu})
    for tid in workers:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    return len(workers)


def main(out: Path, mode: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    _KEEP.append(dist.distributed_c10d._get_default_group())
    if rank == 1:
        held = _hold_back_gloo_workers()
        t = torch.ones(4)
        dist.all_gather([torch.empty(4) for _ in range(2)], t)
        still_held = t._use_count() > 1
        out.joinpath("rank1.json").write_text(json.dumps({"workers_held_back": held, "worker_held_tensor": still_held}))
    else:
        dist.all_gather([torch.empty(4) for _ in range(2)], torch.ones(4))
    if mode == "torch":
        got: list = [None, None]
        dist.all_gather_object(got, {"rank": rank})
    else:
        import omniprof

        with omniprof.Profiler(backend="cpu", logdir=str(out / "prof"), distributed=True) as prof:
            sum(i * i for i in range(20_000))
        if rank == 0:
            out.joinpath("run_dir.txt").write_text(str(prof.run_dir))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
