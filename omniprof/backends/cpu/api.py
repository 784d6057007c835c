"""``omniprof.cpu``: Julia's ``Profile`` module, for Python.

The ``cpu`` backend records into one process-wide buffer that accumulates across sessions until
:func:`clear` (as Julia's does); each session's result also holds its own samples.

>>> import omniprof
>>> omniprof.cpu.init()                      # (max_samples, interval_s)
(1000000, 0.001)

Functions: :func:`init`, :func:`fetch`, :func:`retrieve`, :func:`clear`, :func:`print`,
:func:`callers`, :func:`enable_peek`, :func:`disable_peek`, :func:`set_peek_duration`,
:func:`peek_duration`, and ``peek_report`` (Julia's ``Profile.peek_report[]``).

.. versionadded:: 0.1
"""

from __future__ import annotations

import builtins
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Any

import attrs

from omniprof.backends.cpu.backend import CpuOptions
from omniprof.backends.cpu.buffer import buffer, default_interval_s, default_max_samples, set_defaults
from omniprof.backends.cpu.sampler import BYTES_PER_SAMPLE, Sampler
from omniprof.backends.cpu.stacks import NO_CUT, StackCut
from omniprof.core.clock import DEFAULT_CLOCK, strftime
from omniprof.core.results import BackendResult, ClockInfo, Frame, ProfileResult, RunMetadata, Track
from omniprof.analysis.stackreport import GroupReport, PrintOptions, build_report, format_report, print_options
from omniprof.analysis.stackreport import callers as _callers
from omniprof.errors import InvalidArgumentError, ProfilerStateError

__all__ = ["init", "fetch", "retrieve", "clear", "print", "callers", "report_groups", "RawBuffer",
           "enable_peek", "disable_peek", "set_peek_duration", "peek_duration", "peek_report", "PeekReport",
           "default_peek_report", "PrintOptions", "BYTES_PER_SAMPLE"]



def init(max_samples: int | None = None, interval_s: float | None = None, *, n: int | None = None,
         delay: float | None = None) -> tuple[int, float]:
    """Set the default buffer size and sampling interval of the ``cpu`` backend (Julia's
    ``Profile.init(n, delay)``; ``n=`` and ``delay=`` are accepted as Julia spells them); returns
    the current ``(max_samples, interval_s)``.

    Backend options given explicitly (``backend_options={"cpu": {...}}``, ``-O cpu.interval_s=``)
    still win over these defaults.
    """
    if n is not None:
        if max_samples is not None:
            raise InvalidArgumentError("init(): give 'max_samples' or Julia's 'n', not both")
        max_samples = n
    if delay is not None:
        if interval_s is not None:
            raise InvalidArgumentError("init(): give 'interval_s' or Julia's 'delay', not both")
        interval_s = delay
    if max_samples is not None or interval_s is not None:
        # Validate with the backend's own validators (same messages as -O cpu.KEY=...).
        CpuOptions(max_samples=default_max_samples() if max_samples is None else max_samples,
                   interval_s=default_interval_s() if interval_s is None else interval_s)
    set_defaults(max_samples, interval_s)
    return default_max_samples(), default_interval_s()


@attrs.frozen
class RawBuffer:
    """A copy of the raw buffer (Julia's ``fetch()``): meaningful only in this process, because
    stacks hold ``id(code)`` keys and bytecode offsets. Use :func:`retrieve` for portable data.

    Attributes:
        t_ns, thread_ids, task_ids, stack_ids, weights_ns: one entry per sample (task -1: none).
        stacks: raw stacks (leaf-first ``(code_key, offset, ...)``), indexed by ``stack_ids``.
        dropped: samples not taken because the buffer was full.
    """

    t_ns: tuple[int, ...]
    thread_ids: tuple[int, ...]
    task_ids: tuple[int, ...]
    stack_ids: tuple[int, ...]
    weights_ns: tuple[int, ...]
    stacks: tuple[tuple[Any, ...], ...]
    dropped: int


def fetch(*, include_meta: bool = True) -> RawBuffer:
    """A copy of the raw sample buffer (see :class:`RawBuffer`); ``print(fetch())`` prints it.

    ``include_meta=False`` (Julia's keyword) leaves out the per-sample metadata (times, threads,
    tasks): only stacks and weights."""
    b = buffer()
    n = len(b.t_ns)
    if not include_meta:
        return RawBuffer((), (), (), tuple(b.stack_ids), tuple(b.weights_ns), tuple(b.stack_list), b.dropped)
    return RawBuffer(tuple(b.t_ns[:n]), tuple(b.thread_ids[:n]), tuple(b.task_ids[:n]), tuple(b.stack_ids[:n]),
                     tuple(b.weights_ns[:n]), tuple(b.stack_list), b.dropped)


def retrieve(*, record_offsets: bool = True) -> ProfileResult:
    """Every buffered sample, frames resolved to file/function/line: a portable
    :class:`ProfileResult` (``.save(path)``; ``omniprof.load(path)`` on any machine).

    With ``record_offsets`` (default) frames keep their bytecode offsets, so ``print(...,
    combine=False)`` can tell apart operations on one line; pass False to merge them.
    """
    import platform
    import socket

    from omniprof.core.host import platform_string

    b = buffer()
    frames, stacks, samples, losses = b.export(offsets=record_offsets)
    tids = sorted({s.thread_id for s in samples})
    threads = [b.threads.get(t) for t in tids]
    from omniprof.core.results import ThreadInfo

    threads = [t if t is not None else ThreadInfo(tid, f"thread {tid}") for t, tid in zip(threads, tids)]
    used_tasks = {s.task_id for s in samples if s.task_id is not None}
    tasks = [t for k, t in sorted(b.task_info.items()) if k in used_tasks]
    start = samples[0].t_ns if samples else 0
    end = samples[-1].t_ns if samples else 0
    part = BackendResult(
        backend="cpu", clock=ClockInfo(name=DEFAULT_CLOCK.name), start_ns=start, end_ns=end, frames=frames,
        stacks=stacks, samples=samples, threads=threads, tasks=tasks, losses=losses,
        tracks=[Track(id=f"thread:{t.thread_id}", name=t.name, kind="thread", tid=t.native_id) for t in threads],
        summaries={"overhead": {"engine": "buffer", "samples": len(samples), "ticks": b.ticks,
                                "sampler_time_ns": b.self_time_ns, "samples_dropped": b.dropped,
                                "bytes_per_sample": BYTES_PER_SAMPLE, "buffer_bytes": b.nbytes()}},
        metadata={"source": "omniprof.cpu.retrieve"})
    md = RunMetadata(host=socket.gethostname(), pid=os.getpid(), python=platform.python_version(),
                     platform=platform_string(), backends=("cpu",), start_ns=start, end_ns=end)
    return ProfileResult(metadata=md, parts=(part,))


def clear() -> None:
    """Forget every buffered sample (Julia's ``Profile.clear()``)."""
    from omniprof.core import profiler as profiler_mod

    if profiler_mod._active.get("cpu") is not None:
        raise ProfilerStateError("the cpu backend is recording; stop the Profiler before omniprof.cpu.clear()")
    buffer().clear()


def _result_or_buffer(result: Any) -> Any:
    if result is None:
        return retrieve()
    if isinstance(result, RawBuffer):
        return _from_raw(result)
    return result


def _from_raw(raw: RawBuffer) -> BackendResult:
    """A result from a :func:`fetch` copy (code ids resolved through this process's buffer)."""
    from array import array

    b = buffer()
    n = len(raw.stack_ids)
    s = Sampler(None, DEFAULT_CLOCK, max(n, 1))
    s.t_ns = array("q", raw.t_ns or [0] * n)
    s.thread_ids = array("Q", raw.thread_ids or [0] * n)
    s.task_ids = array("q", raw.task_ids or [-1] * n)
    s.stack_ids = array("q", raw.stack_ids)
    s.weights_ns = array("q", raw.weights_ns)
    s.flags = array("B", bytes(n))
    s.stack_list = list(raw.stacks)
    s.code_table.codes = b.code_table.codes
    s.cuts = list(b.cuts)  # a copy of this buffer: its sessions' cuts, by sample index
    s.dropped = raw.dropped
    frames, stacks, samples, losses = s.export()
    from omniprof.core.results import ThreadInfo

    tids = sorted({x.thread_id for x in samples})
    threads = [b.threads.get(t) or ThreadInfo(t, f"thread {t}") for t in tids]
    return BackendResult(backend="cpu", frames=frames, stacks=stacks, samples=samples, threads=threads,
                         tasks=[t for k, t in sorted(b.task_info.items())], losses=losses,
                         metadata={"source": "omniprof.cpu.fetch"})


def report_groups(result: ProfileResult | BackendResult | None = None, **options: Any) -> list[GroupReport]:
    """The rows :func:`print` would format, per group (plain data, for tests and tools)."""
    return build_report(_result_or_buffer(result), print_options(options))


def print(result: ProfileResult | BackendResult | None = None, file: IO[str] | None = None, **options: Any) -> None:  # noqa: A001
    """Print a sampled profile as Julia's ``Profile.print`` does.

    Args:
        result: a :class:`ProfileResult`/:class:`BackendResult` (a saved one works too), or None
            for every sample in the buffer (:func:`retrieve`).
        file: where to write (default ``sys.stdout``).
        **options: :class:`~omniprof.analysis.stackreport.PrintOptions` fields: ``format`` ("tree" or
            "flat"), ``C``/``native``, ``combine``, ``maxdepth``, ``sortedby``, ``groupby``,
            ``noisefloor``, ``mincount``, ``recur``, ``threads``, ``tasks``, ``cols``, ``counts``
            (Julia's ``Count``/``Overhead`` with the time and % beside them; False: time only).
    """
    if result is not None and hasattr(result, "write") and not hasattr(file, "write"):
        result, file = file, result  # Julia's order: print(io, data)
    opts = print_options(options)
    if opts.cols is None and file is not None and not getattr(file, "isatty", lambda: False)():
        opts = attrs.evolve(opts, cols=120)
    lines = format_report(_result_or_buffer(result), opts)
    out = file if file is not None else sys.stdout
    out.write("\n".join(lines) + "\n")


def callers(funcname: str, result: ProfileResult | BackendResult | None = None, *, filename: str | None = None,
            linerange: range | tuple[int, int] | None = None) -> list[tuple[int, Frame]]:
    """Who called ``funcname`` and how often: ``[(samples, caller frame)]`` (Julia's ``Profile.callers``)."""
    return _callers(funcname, _result_or_buffer(result), filename=filename, linerange=linerange)


# -- peek ---------------------------------------------------------------------------------------
_peek: dict[str, Any] = {"duration_s": 1.0, "old": None, "signum": None, "running": False, "thread": None,
                         "cut": NO_CUT}


def default_peek_report(result: BackendResult, file: IO[str]) -> None:
    """The peek's report unless replaced: the tree grouped by thread and task (Julia's default)."""
    file.write("\n".join(format_report(result, PrintOptions(groupby=("thread", "task"), sortedby="count",
                                                            cols=120))) + "\n")


class PeekReport:
    """Julia's ``Profile.peek_report[]``: the callable a peek calls to write its report.

    It is called as ``fn(result, file)`` with the peek's :class:`BackendResult` and the stream
    (stderr) after the stack dump. Replace it to change the report, e.g. no grouping::

        omniprof.cpu.peek_report[...] = lambda result, file: omniprof.cpu.print(result, file)

    ``peek_report[...]`` (or ``.value``) reads or sets it, as Julia's ``peek_report[]``;
    :meth:`reset` restores the default. A callable that raises is reported on stderr; the program
    goes on.
    """

    def __init__(self) -> None:
        self.value: Any = default_peek_report

    def __getitem__(self, key: Any) -> Any:
        return self.value

    def __setitem__(self, key: Any, fn: Any) -> None:
        self.set(fn)

    def set(self, fn: Any) -> None:
        if not callable(fn):
            raise InvalidArgumentError(f"peek_report must be a callable fn(result, file) (got {type(fn).__name__}); "
                                       f"e.g. lambda result, file: omniprof.cpu.print(result, file)")
        self.value = fn

    def reset(self) -> None:
        self.value = default_peek_report

    def __call__(self, result: BackendResult, file: IO[str]) -> None:
        self.value(result, file)


peek_report = PeekReport()


def set_peek_duration(seconds: float) -> None:
    """How long a peek profiles after SIGUSR1 (default 1 s)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 3600:
        raise InvalidArgumentError(f"'seconds' must be > 0 and <= 3600 (got {seconds!r})")
    _peek["duration_s"] = float(seconds)
    if _peek.get("native") and _peek["signum"] is not None:
        from omniprof.backends.cpu import _nativesampler as ns

        ns.peek_arm(_peek["signum"], int(seconds * 1e9), round(default_interval_s() * 1e9), ns.MODE_WALL)


def peek_duration() -> float:
    """The current peek duration in seconds."""
    return float(_peek["duration_s"])


def enable_peek(signum: int | None = None, *, launcher_codes: Any = ()) -> None:
    """On SIGUSR1 (Linux), print every thread's stack to stderr, profile for the peek duration
    and print the report (grouped by thread and task) to stderr. The program is not disturbed:
    the handler only starts a sampler thread and returns.

    ``launcher_codes``: code objects at which the peek's sampled stacks are cut (``omniprof run
    --peek`` passes its launcher's frames, as to its Profiler). Must be called from the main thread
    (Python installs signal handlers there only).
    """
    if not hasattr(signal, "SIGUSR1"):
        raise InvalidArgumentError("peek needs SIGUSR1, which this platform lacks (Linux and macOS have it)")
    if threading.current_thread() is not threading.main_thread():
        raise ProfilerStateError("enable_peek() must be called from the main thread (signal handlers live there)")
    sig = signal.SIGUSR1 if signum is None else signum
    if _peek["signum"] is not None:
        return
    _peek["cut"] = StackCut(launcher_codes) if launcher_codes else NO_CUT
    from omniprof.backends.cpu.native import native_available

    if native_available()[0]:
        # A C-level handler wakes the native engine, which samples at full rate even while the main
        # thread is inside a long C call; a Python thread prints the report afterwards.
        from omniprof.backends.cpu import _nativesampler as ns

        ns.peek_arm(sig, int(_peek["duration_s"] * 1e9), round(default_interval_s() * 1e9), ns.MODE_WALL)
        _peek["native"] = True
        _peek["stop"] = threading.Event()
        t = threading.Thread(target=_native_peek_loop, args=(_peek["stop"],), name="omniprof-peek", daemon=True)
        _peek["thread"] = t
        t.start()
        _peek["signum"] = sig
        from omniprof.core.forks import hold_across_fork, on_fork_child

        hold_across_fork(sig)  # blocked across fork(): the child's C handler is reset before it can run
        on_fork_child(_peek_forked)  # the engine's atfork handler gave the signal its old handler back
        return
    _peek["native"] = False
    from omniprof.core.forks import hold_across_fork, on_fork_child

    _peek["old"] = signal.signal(sig, _on_peek)
    _peek["signum"] = sig
    hold_across_fork(sig)
    on_fork_child(_peek_forked)


def _peek_forked() -> None:
    """A forked child gets its own handler back (peek is the parent's)."""
    sig, old = _peek["signum"], _peek["old"]
    _peek.update(signum=None, old=None, running=False, thread=None, native=False)
    if sig is not None and signal.getsignal(sig) is _on_peek:
        signal.signal(sig, old if old is not None else signal.SIG_DFL)


def disable_peek(timeout_s: float | None = None) -> None:
    """Restore the signal handler that :func:`enable_peek` replaced, after waiting for a peek in
    progress to print its report (at most ``timeout_s``; default: the peek duration + 5 s)."""
    if _peek.get("native") and _peek["signum"] is not None:
        from omniprof.backends.cpu import _nativesampler as ns

        _peek["stop"].set()
        t = _peek.get("thread")
        if t is not None and t.is_alive():
            t.join(peek_duration() + 5.0 if timeout_s is None else timeout_s)
        ns.peek_disarm()
        from omniprof.core.forks import release_across_fork

        release_across_fork(_peek["signum"])
        _peek["signum"] = None
        _peek["native"] = False
        return
    t = _peek.get("thread")
    if t is not None and t.is_alive():
        t.join(peek_duration() + 5.0 if timeout_s is None else timeout_s)
    sig = _peek["signum"]
    if sig is None:
        return
    from omniprof.core.forks import release_across_fork

    old = _peek["old"]
    signal.signal(sig, old if old is not None else signal.SIG_DFL)
    release_across_fork(sig)
    _peek["signum"] = None
    _peek["old"] = None


def _native_peek_loop(stop: threading.Event) -> None:
    from omniprof.backends.cpu import _nativesampler as ns
    from omniprof.backends.cpu.native import NativeEngine

    ns.exclude(threading.get_ident())
    while not stop.is_set():
        got = ns.peek_wait(0.2)
        if got == 2:  # a profiling session runs the engine: peek with the thread engine beside it
            try:
                _peek["running"] = True
                main = sys._current_frames().get(threading.main_thread().ident)  # type: ignore[arg-type]
                _peek_run(_format_all_stacks(main), _peek["duration_s"])
            finally:
                ns.peek_release()
            continue
        if got != 1:
            continue
        err = sys.stderr
        try:
            sampler = Sampler(None, DEFAULT_CLOCK, default_max_samples(), tasks=None)
            sampler.begin()
            eng = NativeEngine(sampler, default_interval_s())
            try:
                eng.drain()
            finally:
                # drain() hooks asyncio's task set to name tasks; left there, it would keep a later
                # session's engine from hooking it (its tasks unnamed)
                eng.tasks.uninstall()
            _print_peek(sampler, eng.stats, err)
            _peek_heap_snapshot(err)
        except Exception as e:  # never disturb the program: report and go on
            with _suppress():
                err.write(f"omniprof peek failed: {type(e).__name__}: {e}\n")
        finally:
            ns.peek_release()


def _print_peek(sampler: Sampler, stats: dict[str, Any], err: Any) -> None:
    frames, stack_table, samples, losses = sampler.export(cut=_peek["cut"])
    if not samples:
        err.write(f"omniprof peek: pid {os.getpid()} received a peek request; no samples\n")
        return
    start_ns, end_ns = samples[0].t_ns, samples[-1].t_ns
    names = {t.thread_id: t.name for t in sampler.threads.values()}
    parts = [f"omniprof peek: pid {os.getpid()} received a peek request; a {peek_duration():g} s profile follows\n"]
    # the first tick's samples: each is stamped as its stack is read (microseconds apart); the next
    # tick comes at least half an interval later (the engine's jitter)
    first_tick_ns = start_ns + int(default_interval_s() * 1e9) // 2
    first = [s for s in samples if s.t_ns < first_tick_ns]
    for smp in first:  # every thread's stack at the first tick, most recent call last
        parts.append(f"\nThread {smp.thread_id} ({names.get(smp.thread_id, '?')}), most recent call last:\n")
        for i in stack_table[smp.stack_id]:
            fr = frames[i]
            parts.append(f'  File "{fr.file}", line {fr.line}, in {fr.name}\n')
    err.write("".join(parts))
    threads = [sampler.threads[t] for t in sorted({s.thread_id for s in samples}) if t in sampler.threads]
    dur = max(end_ns - start_ns, 1) / 1e9
    ticks = int(stats.get("ticks", 0))
    part = BackendResult(
        backend="cpu", start_ns=start_ns, end_ns=end_ns, frames=frames, stacks=stack_table, samples=samples,
        threads=threads, losses=losses,
        summaries={"overhead": {"engine": "native (peek)", "samples": len(samples), "ticks": ticks,
                                "interval_s": default_interval_s(),
                                "requested_rate_hz": 1.0 / default_interval_s(),
                                "achieved_rate_hz": ticks / dur, "sampler_time_ns": int(stats.get("engine_cpu_ns", 0)),
                                "sampler_overhead_pct": 100.0 * int(stats.get("engine_cpu_ns", 0)) / (dur * 1e9)}})
    err.write(f"\nomniprof peek: profile of {dur:.2f} s\n")
    peek_report(part, err)
    err.flush()


def _on_peek(signum: int, frame: Any) -> None:
    if _peek["running"]:
        return
    _peek["running"] = True
    stacks = _format_all_stacks(frame)
    t = threading.Thread(target=_peek_run, args=(stacks, _peek["duration_s"]), name="omniprof-peek", daemon=True)
    _peek["thread"] = t
    t.start()


def _format_all_stacks(main_frame: Any) -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    main_id = threading.main_thread().ident
    parts = [f"omniprof peek: pid {os.getpid()} received a peek request; a {peek_duration():g} s profile follows\n"]
    for tid, frame in sys._current_frames().items():
        if tid == main_id:
            frame = main_frame
        parts.append(f"\nThread {tid} ({names.get(tid, '?')}), most recent call last:\n")
        parts.append("".join(traceback.format_stack(frame)))
    return "".join(parts)


PEEK_HEAP_SNAPSHOT_ENV = "OMNIPROF_PEEK_HEAP_SNAPSHOT"


def _peek_heap_snapshot(err: Any) -> None:
    """With ``OMNIPROF_PEEK_HEAP_SNAPSHOT`` set (as Julia's ``JULIA_PROFILE_PEEK_HEAP_SNAPSHOT``), a peek
    also writes a heap snapshot to the current directory: ``1``/``true``/``yes`` a whole
    ``.heapsnapshot``, ``streaming`` the parts of a streaming snapshot (join them with
    ``omniprof.memory.assemble_snapshot``). Read when the peek happens, so it can be set late."""
    mode = os.environ.get(PEEK_HEAP_SNAPSHOT_ENV, "").strip().lower()
    if mode in ("", "0", "false", "no"):
        return
    from omniprof.backends.memory.heapsnapshot import take_heap_snapshot

    streaming = mode in ("stream", "streaming")
    path = Path.cwd() / f"omniprof-peek-{os.getpid()}-{strftime('%Y%m%d-%H%M%S')}.heapsnapshot"
    written = take_heap_snapshot(path, streaming=streaming)
    what = "heap snapshot parts" if streaming else "heap snapshot"
    err.write(f"omniprof peek: {what} written to {written}{'.*' if streaming else ''}\n")
    err.flush()


def _peek_run(stacks_text: str, duration_s: float) -> None:
    from omniprof.backends.cpu.stacks import python_stacks

    err = sys.stderr
    try:
        err.write(stacks_text)
        err.flush()
        me = threading.get_ident()
        sampler = Sampler(python_stacks(exclude=lambda: (me,)), DEFAULT_CLOCK, default_max_samples())
        interval = default_interval_s()
        t_start = sampler.begin()
        del t_start
        start_ns = DEFAULT_CLOCK.now_ns()
        ev = threading.Event()
        deadline = start_ns + int(duration_s * 1e9)
        while DEFAULT_CLOCK.now_ns() < deadline:
            sampler.sample()
            ev.wait(interval)
        end_ns = DEFAULT_CLOCK.now_ns()
        frames, stack_table, samples, losses = sampler.export(cut=_peek["cut"])
        threads = [sampler.threads[t] for t in sorted({s.thread_id for s in samples}) if t in sampler.threads]
        tasks = [t for k, t in sorted(sampler.task_info.items())]
        dur = max(end_ns - start_ns, 1) / 1e9
        part = BackendResult(
            backend="cpu", start_ns=start_ns, end_ns=end_ns, frames=frames, stacks=stack_table, samples=samples,
            threads=threads, tasks=tasks, losses=losses,
            summaries={"overhead": {"engine": "thread (peek)", "samples": len(samples), "ticks": sampler.ticks,
                                    "interval_s": interval, "requested_rate_hz": 1.0 / interval,
                                    "achieved_rate_hz": sampler.ticks / dur, "sampler_time_ns": sampler.self_time_ns,
                                    "sampler_overhead_pct": 100.0 * sampler.self_time_ns / (dur * 1e9)}})
        err.write(f"\nomniprof peek: profile of {dur:.2f} s\n")
        peek_report(part, err)
        err.flush()
        _peek_heap_snapshot(err)
    except Exception as e:  # never disturb the program: report and go on
        with _suppress():
            err.write(f"omniprof peek failed: {type(e).__name__}: {e}\n")
    finally:
        _peek["running"] = False


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


del builtins
