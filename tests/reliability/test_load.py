"""Load: many threads and tasks under the sampler, many short sessions in a row, and a short
bounded-memory soak (the 10-minute one is ``benchmarks/soak.py``)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import threading
import time
import tracemalloc

import pytest

import omniprof
from omniprof.core import annotations
from omniprof.core import profiler as profiler_mod


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(300))


def _thread_body(i: int, start: threading.Barrier, stop: threading.Event) -> None:
    start.wait()
    # A function of its own per thread, so each thread's stacks are told apart in the result.
    fn = {}
    exec(f"def worker_{i}(stop):\n    while not stop.is_set():\n        sum(range(200))\n", fn)  # noqa: S102
    fn[f"worker_{i}"](stop)


@pytest.mark.parametrize("engine", ["native", "signal", "thread"])
def test_64_threads_under_the_sampler(engine, tally):
    """64 busy threads are all sampled, each under its own name and function, and the program's
    threads all finish."""
    n = 64
    start = threading.Barrier(n + 1)
    stop = threading.Event()
    threads = [threading.Thread(target=_thread_body, args=(i, start, stop), name=f"load-{i}") for i in range(n)]
    for t in threads:
        t.start()
    with omniprof.Profiler(backend="cpu", backend_options={"cpu": {"engine": engine, "interval_s": 0.002}}) as prof:
        start.wait()
        _spin(3.0 if engine == "thread" else 2.0)
        stop.set()
        for t in threads:
            t.join()
    part = prof.result.part("cpu")
    names = {part.thread_name(s.thread_id) for s in part.samples}
    workers = {part.frames[i].name for s in part.samples for i in part.stacks[s.stack_id]}
    tally.check("load: 64 threads", f"{engine}: {len(part.samples)} samples, {len(names & {t.name for t in threads})} "
                                   f"threads seen")
    assert {t.name for t in threads} <= names
    # With 65 threads contending for the GIL the signal engine's handler runs only when the main
    # thread gets the GIL, so ticks are few (each still samples every thread): most workers show up.
    assert len({f"worker_{i}" for i in range(n)} & workers) >= 0.75 * n
    duration = part.end_ns - part.start_ns
    by_thread: dict[int, int] = {}
    for smp in part.samples:
        by_thread[smp.thread_id] = by_thread.get(smp.thread_id, 0) + smp.weight_ns
    for t in threads:  # each thread's sample weights cover the time it was sampled, not more
        assert by_thread[t.ident] <= 1.05 * duration
    assert not any(t.is_alive() for t in threads)


def test_1000_asyncio_tasks_under_the_sampler(tally):
    """1,000 asyncio tasks run to completion under the sampler with their results intact, and the
    event loop thread is sampled throughout."""

    async def task(i: int) -> int:
        total = 0
        for _ in range(20):
            total += sum(range(200 + i % 7))
            await asyncio.sleep(0)
        return total

    async def main() -> list[int]:
        return await asyncio.gather(*(task(i) for i in range(1000)))

    with omniprof.Profiler(backend="cpu") as prof:
        got = asyncio.run(main())
    expected = [20 * sum(range(200 + i % 7)) for i in range(1000)]
    assert got == expected
    part = prof.result.part("cpu")
    assert part.samples
    names = {f.name for f in part.frames}
    assert "task" in names or any(n.endswith("task") for n in names)
    tally.check("load: 1000 asyncio tasks", f"{len(part.samples)} samples")


def _fds() -> dict[int, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts file descriptors through /proc")
def test_many_short_sessions_leak_nothing(tmp_path, registry_with, monkeypatch, tally):
    """300 short sessions in a row (signal and thread engines, several backends with a logdir and
    checkpoints, some failing) leave no thread, signal handler, timer, file descriptor, profiler
    state or growing memory behind. (The cpu sessions use accumulate=false: with the default, the
    process-wide sample buffer keeps earlier sessions' samples on purpose, up to max_samples, until
    omniprof.cpu.clear(), which is checked at the end.)"""
    monkeypatch.setenv("OMNIPROF_CHECKPOINT_S", "0.01")
    reg = registry_with(("backend", "fake", "omniprof.testing.fakes:FakeBackend"))
    own = {"accumulate": False}

    def one(i: int) -> None:
        kind = i % 4
        try:
            if kind == 0:
                with omniprof.Profiler(backend="cpu", backend_options={"cpu": own}, registry=reg):
                    _spin(0.002)
            elif kind == 1:
                with omniprof.Profiler(backend="cpu", backend_options={"cpu": {**own, "engine": "thread"}},
                                       registry=reg):
                    _spin(0.002)
            elif kind == 2:
                with omniprof.Profiler(backend=["cpu", "fake"], logdir=tmp_path / "L", registry=reg,
                                       backend_options={"cpu": own}):
                    with omniprof.annotate("a"):
                        _spin(0.02)
            else:
                with omniprof.Profiler(backend=["cpu", "fake"], registry=reg, backend_options={"cpu": own}):
                    raise KeyError(i)
        except KeyError:
            pass

    for i in range(20):  # warm up: imports, caches, first-use allocations
        one(i)
    gc.collect()
    threads = {t.ident for t in threading.enumerate()}
    handlers = {s: signal.getsignal(s) for s in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT)}
    fds = _fds()
    tracemalloc.start()
    base = tracemalloc.take_snapshot()
    for i in range(300):
        one(i)
    gc.collect()
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(base, "filename"))
    tracemalloc.stop()
    tally.check("load: 300 short sessions", f"memory growth {grown / 1024:.1f} KiB")
    assert {t.ident for t in threading.enumerate()} == threads
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert sys.getprofile() is None
    assert not profiler_mod._active and not annotations.active_sinks()
    new_fds = {fd: t for fd, t in _fds().items() if fds.get(fd) != t}
    assert not new_fds, new_fds
    # 300 sessions of results are kept by nobody: what remains is bounded, not per-session
    assert grown < 2 * 1024 * 1024, f"memory grew by {grown} bytes over 300 sessions"
    with omniprof.Profiler(backend="cpu"):  # the default keeps samples across sessions...
        _spin(0.05)
    assert len(omniprof.cpu.fetch().t_ns) > 0
    omniprof.cpu.clear()  # ...until cleared
    assert len(omniprof.cpu.fetch().t_ns) == 0


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.skipif(not os.path.isfile("/proc/self/statm"), reason="reads RSS from /proc")
def test_short_soak_memory_bounded(tally):
    """20 s of sampling at 1 kHz with a 4,000-sample buffer: once the buffer is full, memory stays
    flat (within 8 MiB) although the program keeps allocating and freeing, and the samples not
    taken are counted."""
    seen = []
    cpu_opts = {"max_samples": 4000, "accumulate": False}  # this session's own budget
    with pytest.warns(omniprof.errors.DataLossWarning):
        with omniprof.Profiler(backend="cpu", backend_options={"cpu": cpu_opts}) as prof:
            end = time.perf_counter() + 20
            next_mark = time.perf_counter() + 8
            while time.perf_counter() < end:
                junk = [bytearray(1000) for _ in range(200)]
                del junk
                if time.perf_counter() >= next_mark:
                    gc.collect()
                    seen.append(_rss_bytes())
                    next_mark += 2
    growth = max(seen) - seen[0]
    lost = sum(x.count for x in prof.result.losses)
    tally.figure("short soak (20 s, 1 kHz, 4k buffer)", f"RSS growth after buffer full {growth / 2**20:.2f} MiB, "
                                                         f"samples kept {len(prof.result.part('cpu').samples)}, "
                                                         f"not taken {lost}")
    assert growth < 8 * 2**20, [x / 2**20 for x in seen]
    assert len(prof.result.part("cpu").samples) == 4000 and lost > 0

