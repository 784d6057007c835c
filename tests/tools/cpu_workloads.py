"""Workloads of the cpu sampler's accuracy checks, with their independently measured truths.

One module for the three places that profile them: ``benchmarks/cpu_accuracy.py`` (tight figures,
beside py-spy and pyinstrument), ``tests/integration/test_cpu_native.py`` (wide tolerances) and
``tests/tools/native_engine_check.py`` (the bare engine under every CPython 3.10-3.13, without
omniprof's dependencies). It imports the standard library only and is loaded by path (it lies
outside the ``omniprof`` package on purpose: the sampler drops frames of omniprof's own files).

Each ``w_*`` function runs one workload for about ``sec`` seconds; each ``truth_*`` function measures
the same pieces alone (timed one by one, never by a profiler). Lines whose share matters end with a
``# TAG`` comment: :func:`tagged_lines` finds them in this file's source.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import random
import threading
import time

HERE = os.path.abspath(__file__)


@functools.lru_cache(maxsize=None)
def tagged_lines(tag: str) -> tuple[int, ...]:
    """Line numbers (1-based) of this file's lines that end with ``# TAG``."""
    with open(HERE) as f:
        return tuple(i + 1 for i, ln in enumerate(f.read().splitlines()) if ln.rstrip().endswith(f"# {tag}"))


def _timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def best_of(n: int, fn, *args) -> float:
    """The shortest of ``n`` timings: other processes on a shared machine only add time (pieces of
    about a millisecond want many tries on a loaded machine)."""
    return min(_timed(fn, *args) for _ in range(n))


def spin(sec: float) -> None:
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        pass


# -- straight-line functions ----------------------------------------------------------------------
def heavy(x):
    a = x * 3 + 1
    b = a * a - x
    c = b // 7 + a
    d = c * c % 1000003
    e = d + b - a
    f = e * 2
    g = f ^ 12345
    h = g + d
    i = h * 3
    j = i - 99
    k = j * j % 77
    m = k + 1
    n = m * 5
    o = n - j
    p = o * o % 997
    q = p + a
    r = q * 2
    s = r ^ 99
    t = s + 1
    return t


def tiny(x):
    return x + 1


def _loop(f, n):
    for i in range(n):
        f(i)


def w_heavy_tiny(sec: float) -> None:
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        for i in range(500):
            heavy(i)
            tiny(i)


def truth_heavy_tiny(n: int = 100_000) -> float:
    """heavy's share of heavy + tiny, each called ``n`` times alone."""
    th, tt = best_of(3, _loop, heavy, n), best_of(3, _loop, tiny, n)
    return th / (th + tt)


# -- line-level hot spot --------------------------------------------------------------------------
def hot_loop(n):
    s = 0
    x = 0
    for i in range(n):
        a = i + 1
        x = (a ** 3 ** 2) ** 2 % 1000003  # HOT
        s += a
    return s + x


def w_hot(sec: float) -> None:
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        hot_loop(20_000)


# -- C-heavy calls --------------------------------------------------------------------------------
C_DATA: dict[str, object] = {}


def c_data(n_floats: int = 600_000, blob_bytes: int = 40 * 2**20):
    """The inputs (made once per process): ``(floats, bytes)``."""
    if "data" not in C_DATA:
        rng = random.Random(1)
        C_DATA["data"] = [rng.random() for _ in range(n_floats)]
        C_DATA["blob"] = os.urandom(blob_bytes)
    return C_DATA["data"], C_DATA["blob"]


def c_heavy(data, blob):
    a = sorted(data)  # SORT
    b = hashlib.sha256(blob).digest()  # SHA
    s = 0  # LOOP
    for i in range(400_000):  # LOOP
        s += i  # LOOP
    return a, b, s


def w_c(sec: float) -> None:
    data, blob = c_data()
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        c_heavy(data, blob)


def _c_loop():
    s = 0
    for i in range(400_000):
        s += i
    return s


def truth_c() -> dict[str, float]:
    """Shares of sort / sha / loop, each timed alone (best of 3)."""
    data, blob = c_data()
    t = {"sort": best_of(3, sorted, data), "sha": best_of(3, lambda: hashlib.sha256(blob).digest()),
         "loop": best_of(3, _c_loop)}
    tot = sum(t.values())
    return {k: v / tot for k, v in t.items()}


def c_line_kind(line: int) -> str | None:
    """'sort', 'sha', 'loop' or None for a line of :func:`c_heavy`."""
    for kind in ("sort", "sha", "loop"):
        if line in tagged_lines(kind.upper()):
            return kind
    return None


# -- busy threads, late threads ---------------------------------------------------------------------
def w_threads(sec: float, n: int = 3) -> None:
    ts = [threading.Thread(target=spin, args=(sec,), name=f"busy{i}") for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


LATE: dict[str, float] = {}


def late_worker(sec: float) -> None:
    t = time.perf_counter()
    spin(sec)
    LATE["lived_s"] = time.perf_counter() - t  # truth: the thread's own measure of its life


def w_late_thread(sec: float) -> None:
    """Main spins 40% of ``sec``, then a thread named ``late`` spins 20% while main joins it, then main
    spins 40% again. Truth: the thread's lifetime as it measured it (``LATE['lived_s']``)."""
    spin(0.4 * sec)
    t = threading.Thread(target=late_worker, args=(0.2 * sec,), name="late")
    t.start()
    t.join()
    spin(0.4 * sec)


# -- asyncio tasks ------------------------------------------------------------------------------------
def task_work(n):
    s = 0
    for i in range(n):
        s += i * i % 7
    return s


def small_task_work(n):
    return task_work(n)


def big_task_work(n):
    return task_work(n)


ASYNC_N = 20_000


async def _crunch(fn, rounds, n):
    for _ in range(rounds):
        fn(n)
        await asyncio.sleep(0)


def w_asyncio(sec: float) -> None:
    """Two tasks interleaved on one loop: ``small`` does n, ``big`` 3n per step."""
    async def main():
        end = time.perf_counter() + sec
        while time.perf_counter() < end:
            await asyncio.gather(asyncio.create_task(_crunch(small_task_work, 10, ASYNC_N), name="small"),
                                 asyncio.create_task(_crunch(big_task_work, 10, 3 * ASYNC_N), name="big"))

    asyncio.run(main())


def truth_asyncio() -> float:
    """big's share of big + small, each task's work timed alone."""
    ts, tb = best_of(15, small_task_work, ASYNC_N), best_of(15, big_task_work, 3 * ASYNC_N)
    return tb / (tb + ts)


# -- nested calls -----------------------------------------------------------------------------------
def w_nested(sec: float) -> None:
    """``s += tiny(heavy(i))``: two calls on one line, each callee's frame at the other's address."""
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        s = 0
        for i in range(2000):
            s += tiny(heavy(i))


def codes_by_id(*extra) -> dict:
    """``id(code) -> code`` for every function here, the functions in ``extra`` and the code nested in
    them (generator expressions): what the in-thread reference's code addresses are matched with."""
    out = {}

    def walk(co):
        out[id(co)] = co
        for c in co.co_consts:
            if hasattr(c, "co_code"):
                walk(c)

    for v in [*globals().values(), *extra]:
        if hasattr(v, "__code__"):
            walk(v.__code__)
    return out


# -- generators -----------------------------------------------------------------------------------------
def produce(n):
    for i in range(n):
        yield heavy(i)  # GEN


def consume(n):
    s = 0
    for v in produce(n):
        s += tiny(v)  # CONSUME
    return s


def w_generators(sec: float) -> None:
    """A generator doing heavy() per item feeding a loop doing tiny() per item; plus ``sum`` over a
    generator expression (a C caller resuming a generator, the case of the root-level
    ``<genexpr>`` rows)."""
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        consume(2_000)
        sum(len(str(i)) for i in range(2_000))


def truth_generators(n: int = 100_000) -> float:
    """The generator's share (heavy) of generator + consumer (tiny), each timed alone."""
    return truth_heavy_tiny(n)


# -- deep recursion ---------------------------------------------------------------------------------------
DEPTH = 120


def recurse(n, leaf_n):
    if n == 0:
        return recursion_leaf(leaf_n)
    s = 0
    for i in range(50):  # per-level work
        s += i
    return recurse(n - 1, leaf_n) + s


def recursion_leaf(n):
    s = 0
    for i in range(n):
        s += i * i % 13
    return s


LEAF_N = 20_000


def w_deep(sec: float) -> None:
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        recurse(DEPTH, LEAF_N)


def truth_deep() -> float:
    """The leaf's share of one recursion: the leaf timed alone over the whole timed alone."""
    return best_of(15, recursion_leaf, LEAF_N) / best_of(15, recurse, DEPTH, LEAF_N)
