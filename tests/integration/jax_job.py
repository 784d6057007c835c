"""A tiny multi-process JAX job for the distributed tests: one OS process per rank, started by
:func:`spawn` with ``python -m tests.integration.jax_job``; ``jax.distributed.initialize`` with the
coordinator on 127.0.0.1 and jax's gloo CPU collectives, so each step's ``psum`` really crosses
processes. Rank ``slow_rank`` sleeps in every step; rank ``skew_rank`` profiles with a clock
``skew_ns`` ahead. Each rank writes what it measured itself to ``<logdir of rank 0>/truth_rank<N>.json``
(its sleeps, pid, the run dir it was told), the reference the tests compare with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

STEPS = 4          # schedule wait=1, active=2: steps 1 and 2 recorded
SLEEP_S = 0.05


def run_rank(rank: int, world: int, port: int, logdir: str, slow_rank: int, skew_rank: int, skew_ns: int,
             backends: list[str], chunk_bytes: int = 0) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=world, process_id=rank,
                               initialization_timeout=120)
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import omniprof
    from omniprof.backends.xla import collectives as odist
    from omniprof.testing.fakes import SkewedClock

    if chunk_bytes:  # payloads over jax's key-value store in many small pieces
        odist.JAX_CHUNK_BYTES = chunk_bytes

    mesh = Mesh(jax.devices(), ("x",))
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("x")),
                                               jnp.full((1, 32), rank + 1.0, jnp.float32))
    w = jnp.ones((32, 32), jnp.float32) / 32
    # Each process holds one row; the sum over rows is an all-reduce across the processes.
    step_fn = jax.jit(lambda a: jnp.tanh(a @ w).sum(axis=0), out_shardings=NamedSharding(mesh, PartitionSpec()))
    step_fn(x).block_until_ready()  # compiled before profiling
    clock = SkewedClock(skew_ns) if rank == skew_rank else None
    sleeps: dict[int, int] = {}
    out = None
    prof = omniprof.Profiler(backend=backends, logdir=logdir.format(rank=rank), distributed=True, clock=clock,
                             options={"host_tracer_level": 2, "python_tracer_level": 0},
                             schedule=omniprof.schedule(wait=1, active=STEPS - 2, repeat=1))
    with prof:
        for _ in range(STEPS):
            if rank == slow_rank:
                t0 = time.perf_counter_ns()
                time.sleep(SLEEP_S)
                sleeps[prof.step_num] = time.perf_counter_ns() - t0
            with omniprof.annotate("train_step"):
                out = step_fn(x)
                out.block_until_ready()
            prof.step()
    # What the coordination left in the coordinator's key-value store once every rank is done.
    client = jax._src.distributed.global_state.client
    client.wait_at_barrier("jax_job_done", 60_000)
    left = len(client.key_value_dir_get("omniprof/"))
    truth = {"rank": rank, "keys_left": left, "sleep_ns": sleeps, "run_dir": str(prof.run_dir), "pid": os.getpid(),
             "merged": prof.merged_result is not None, "psum": float(out[0]) if out is not None else None,
             "process_index": jax.process_index(), "process_count": jax.process_count()}
    Path(logdir.format(rank=0), f"truth_rank{rank}.json").write_text(json.dumps(truth))
    jax.distributed.shutdown()


def spawn(world: int, port: int, logdir: str, slow_rank: int = -1, skew_rank: int = -1, skew_ns: int = 0,
          backends: tuple[str, ...] = ("xla", "cpu"), chunk_bytes: int = 0, timeout_s: float = 300) -> None:
    """Run the job: ``world`` processes, each ``python -m tests.integration.jax_job``; raises with
    every rank's stderr tail when one fails."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
    Path(logdir.format(rank=0)).mkdir(parents=True, exist_ok=True)
    args = [str(world), str(port), logdir, str(slow_rank), str(skew_rank), str(skew_ns), ",".join(backends), str(chunk_bytes)]
    procs = [subprocess.Popen([sys.executable, "-m", "tests.integration.jax_job", str(r), *args], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    outs = []
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [(r, p.returncode, outs[r][1][-3000:] if r < len(outs) else "") for r, p in enumerate(procs)
              if p.returncode != 0]
    if failed:
        raise RuntimeError("jax job failed: " + "\n".join(f"rank {r} exit {rc}:\n{err}" for r, rc, err in failed))


if __name__ == "__main__":
    r, world, port, logdir, slow, skew, skew_ns, backends, chunk = sys.argv[1:10]
    run_rank(int(r), int(world), int(port), logdir, int(slow), int(skew), int(skew_ns), backends.split(","), int(chunk))
