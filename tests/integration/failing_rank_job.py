"""A distributed job whose rank 1 raises inside its ``Profiler(distributed=True)`` (issue 31, F8).
Run by torchrun, 2 ranks, gloo on 127.0.0.1: ``python -m torch.distributed.run --nproc-per-node 2
... failing_rank_job.py OUT``. Rank 1 raises
``RuntimeError('rank 1 failed on purpose')`` after recording a little, while rank 0 waits for it
in a collective of its own (a training step's), never reaching its stop."""

from __future__ import annotations

import sys
from pathlib import Path


def main(out: Path) -> None:
    import torch.distributed as dist

    import omniprof

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with omniprof.Profiler(backend="cpu", logdir=str(out / "prof"), distributed=True) as prof:
        out.joinpath(f"run_dir{rank}.txt").write_text(str(prof.run_dir))
        sum(i * i for i in range(200_000))
        if rank == 1:
            raise RuntimeError("rank 1 failed on purpose")
        dist.barrier()  # rank 0 goes on in lockstep, waiting for rank 1 as a training step would
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
