"""A tiny DDP training job for the distributed tests: run by torch.multiprocessing.spawn, one
process per rank, gloo on 127.0.0.1. Rank ``slow_rank`` sleeps in every step; rank ``skew_rank``
profiles with a clock ``skew_ns`` ahead. Each rank writes what it measured itself (its sleeps) to
``<out>/truth_rank<N>.json``, the independent reference the tests compare the analysis with."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

STEPS = 5          # schedule wait=1, warmup=1, active=3: steps 2..4 recorded
RECORDED = {2, 3, 4}  # step 1 warms up: under load it carries ~0.5 s of start-up on every rank,
                      # which would swamp the straggler's 100 ms sleep in its own-time figures
SLEEP_S = 0.1


def run_rank(rank: int, world: int, port: int, logdir: str, slow_rank: int, skew_rank: int, skew_ns: int,
             backends: tuple[str, ...] = ("torch",)) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), KINETO_LOG_LEVEL="4")
    import torch
    import torch.distributed as dist

    import omniprof
    from omniprof.testing.fakes import SkewedClock

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        clock = SkewedClock(skew_ns) if rank == skew_rank else None
        sleeps: dict[int, int] = {}
        # "{rank}" in logdir: each rank its own directory, as on hosts without a shared filesystem.
        prof = omniprof.Profiler(backend=list(backends), options={"device_tracer_level": 0},
                                 logdir=logdir.format(rank=rank),
                                 distributed=True, clock=clock, schedule=omniprof.schedule(wait=1, warmup=1, active=STEPS - 2,
                                                                                          repeat=1))
        jax_step = None
        if "xla" in backends:  # a job that runs jax beside torch: the xla backend records its XSpace
            import jax
            import jax.numpy as jnp

            jax_step = jax.jit(lambda a: jnp.tanh(a @ a))
            jax_step(jnp.ones((8, 8))).block_until_ready()
        with prof:
            for _ in range(STEPS + 1):
                if jax_step is not None:
                    jax_step(jnp.ones((8, 8))).block_until_ready()
                if rank == slow_rank:
                    t0 = time.perf_counter_ns()
                    time.sleep(SLEEP_S)
                    sleeps[prof.step_num] = time.perf_counter_ns() - t0
                loss = model(torch.randn(4, 16)).sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
                prof.step()
        truth = {"rank": rank, "sleep_ns": sleeps, "run_dir": str(prof.run_dir),
                 "merged": prof.merged_result is not None, "pid": os.getpid()}
        Path(logdir.format(rank=0), f"truth_rank{rank}.json").write_text(json.dumps(truth))
    finally:
        dist.destroy_process_group()


def spawn(world: int, port: int, logdir: str, slow_rank: int = -1, skew_rank: int = -1, skew_ns: int = 0,
          backends: tuple[str, ...] = ("torch",)) -> None:
    import torch.multiprocessing as mp

    mp.spawn(run_rank, args=(world, port, logdir, slow_rank, skew_rank, skew_ns, backends), nprocs=world, join=True)
