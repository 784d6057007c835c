"""Sample a running CPython process from outside into a :class:`~omniprof.core.results.ProfileResult`.

At each tick every thread's stack is read (:class:`~omniprof.live.reader.PythonProcess`) and kept as
(code address, offset) pairs; code objects are decoded once and checked again by their name and file
pointers. A sample weighs the real time since that thread's previous sample (a late tick on a busy
machine weighs more, so time is not lost); a thread whose stack changed while read is counted as a
torn sample (a ``Loss``), never recorded wrong. The target is never stopped.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable

import attrs

from omniprof.core.results import (BackendResult, ClockInfo, Frame, Loss, ProfileResult, RunMetadata, StackSample,
                                   ThreadInfo, Track)
from omniprof.errors import InvalidArgumentError, LiveTargetError
from omniprof.live.memory import TornRead
from omniprof.live.reader import PythonProcess

__all__ = ["AttachOptions", "attach"]

_now = time.perf_counter_ns  # CLOCK_MONOTONIC on Linux: the same clock as the target's perf_counter_ns


def _positive(inst: object, attr: attrs.Attribute, value: float) -> None:
    if not value > 0:
        raise InvalidArgumentError(f"{attr.name!r} must be > 0 (got {value!r})")


@attrs.frozen
class AttachOptions:
    """How to sample: ``interval_s`` between ticks; ``duration_s`` None runs until ``stop`` is set."""

    interval_s: float = attrs.field(default=0.005, validator=_positive)
    duration_s: float | None = attrs.field(default=None, validator=attrs.validators.optional(_positive))


class _ThreadStates:
    """Whether the kernel has a thread running or runnable ('R'), from ``/proc/PID/task/N/stat``
    (one descriptor kept per thread: one pread a sample)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fds: dict[int, int] = {}

    def running(self, native: int | None) -> bool | None:
        """True/False, or None when unknown (3.10 keeps no kernel thread id)."""
        if not native:
            return None
        try:
            fd = self.fds.get(native)
            if fd is None:
                fd = self.fds[native] = os.open(f"/proc/{self.pid}/task/{native}/stat", os.O_RDONLY | os.O_CLOEXEC)
            data = os.pread(fd, 512, 0)
        except OSError:
            return None
        i = data.rfind(b")")
        return data[i + 2:i + 3] == b"R"

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


class _Recorder:
    """Interns frames and stacks; holds the samples."""

    def __init__(self, proc: PythonProcess) -> None:
        self.proc = proc
        self.frames: list[Frame] = []
        self.frame_ids: dict[tuple[int, int], int] = {}  # (code address, offset) -> frame index
        self.frame_index: dict[Frame, int] = {}
        self.code_ptrs: dict[int, tuple[int, int]] = {}   # code address -> (name ptr, file ptr) when decoded
        self.stacks: list[tuple[int, ...]] = []
        self.stack_ids: dict[tuple[int, ...], int] = {}
        self.samples: list[StackSample] = []
        self.threads: dict[int, ThreadInfo] = {}
        self.names: dict[int, str] = {}
        self.torn = 0
        self.truncated = 0

    def stack_id(self, raw: list[tuple[int, int]]) -> int:
        # every code object's header is read again (one system call for the stack): a code object
        # freed and another made at its address shows other name/file pointers, and is decoded anew
        codes = self.proc.codes([code for code, _ in raw])
        ids = []
        for code, at in reversed(raw):  # root first
            c = codes[code]
            if self.code_ptrs.get(code) != (c.name_ptr, c.file_ptr):
                if code in self.code_ptrs:
                    for k in [k for k in self.frame_ids if k[0] == code]:
                        del self.frame_ids[k]
                self.code_ptrs[code] = (c.name_ptr, c.file_ptr)
            key = (code, at)
            fid = self.frame_ids.get(key)
            if fid is None:  # one frame per (function, line): offsets on one line are one frame
                fr = self.proc.frames([key])[0]
                fid = self.frame_index.get(fr)
                if fid is None:
                    fid = self.frame_index[fr] = len(self.frames)
                    self.frames.append(fr)
                self.frame_ids[key] = fid
            ids.append(fid)
        t = tuple(ids)
        sid = self.stack_ids.get(t)
        if sid is None:
            sid = self.stack_ids[t] = len(self.stacks)
            self.stacks.append(t)
        return sid


def attach(pid: int, options: AttachOptions = AttachOptions(), stop: threading.Event | None = None,
           on_tick: Callable[[int], None] | None = None) -> ProfileResult:
    """Sample process ``pid`` until ``options.duration_s`` or ``stop`` is set (or the process ends).

    Raises LiveTargetError when the process cannot be read at all (gone, not Python, no permission).
    """
    proc = PythonProcess(pid)
    states_now = _ThreadStates(pid)
    try:
        return _sample(proc, states_now, options, stop or threading.Event(), on_tick)
    finally:
        states_now.close()


def _sample(proc: PythonProcess, states_now: _ThreadStates, options: AttachOptions, stop: threading.Event,
            on_tick: Callable[[int], None] | None) -> ProfileResult:
    pid = proc.pid
    rec = _Recorder(proc)
    interval_ns = int(options.interval_s * 1e9)
    start_unix_ns = time.time_ns()
    t_start = _now()
    end_at = t_start + int(options.duration_s * 1e9) if options.duration_s else None
    last: dict[int, int] = {}
    ticks = late = 0
    exited = False
    cpu0 = time.thread_time_ns()
    next_t = t_start
    while not stop.is_set():
        t = _now()
        if end_at is not None and t >= end_at:
            break
        ticks += 1
        try:
            states = proc.thread_states()
        except TornRead:
            rec.torn += 1
            states = []
        except LiveTargetError as e:
            if e.cause == "gone":
                exited = True
                break
            raise
        for ts, buf in states:
            tid = proc._u64(buf, "tstate.thread_id")
            native = proc._native(buf)
            prev = last.get(tid, t_start)
            try:
                raw, cut = proc.raw_stack(buf, ts)
                sid = rec.stack_id(raw)
            except TornRead:
                rec.torn += 1
                continue
            except LiveTargetError as e:
                if e.cause == "gone":
                    exited = True
                    break
                raise
            rec.truncated += cut
            last[tid] = t
            if tid not in rec.threads:  # named while it lives (a thread may end before the capture does)
                rec.names.update(proc.thread_names())
                rec.threads[tid] = ThreadInfo(tid, "", native)
            running = states_now.running(native)
            rec.samples.append(StackSample(t_ns=t, thread_id=tid, stack_id=sid, weight_ns=t - prev,
                                           idle=running is False))
        if exited:
            break
        if on_tick is not None:
            on_tick(ticks)
        next_t += interval_ns
        now = _now()
        if next_t < now:  # fell behind (a busy machine): skip ahead, the weights carry the time
            late += 1
            next_t = now + interval_ns
        stop.wait((next_t - now) / 1e9)
    end_ns = _now()
    return _result(proc, rec, pid, t_start, end_ns, start_unix_ns, ticks, late, exited,
                   time.thread_time_ns() - cpu0, options)


def _result(proc: PythonProcess, rec: _Recorder, pid: int, t_start: int, end_ns: int, start_unix_ns: int,
            ticks: int, late: int, exited: bool, cpu_ns: int, options: AttachOptions) -> ProfileResult:
    names = dict(rec.names)
    try:
        names.update(proc._names(proc.thread_states()))
    except (TornRead, LiveTargetError):
        pass
    threads = tuple(ThreadInfo(t.thread_id, names.get(t.thread_id) or f"thread {t.thread_id:#x}", t.native_id)
                    for t in rec.threads.values())
    tracks = tuple(Track(id=f"thread:{t.thread_id}", name=t.name, kind="thread", pid=pid, tid=t.native_id)
                   for t in threads)
    losses = []
    if rec.torn:
        losses.append(Loss(source="cpu", kind="torn_reads", count=rec.torn, unit="samples",
                           detail="a thread's stack changed while it was read from outside; the sample was "
                                  "dropped (its time goes to the thread's next sample)"))
    if rec.truncated:
        losses.append(Loss(source="cpu", kind="stack_truncated", count=rec.truncated, unit="samples",
                           detail="stacks deeper than the reader follows: the innermost frames kept"))
    duration_s = (end_ns - t_start) / 1e9
    summary = {"engine": f"attach: read from outside, pid {pid}", "ticks": ticks, "ticks_late": late,
               "samples": len(rec.samples), "torn": rec.torn, "requested_rate_hz": 1.0 / options.interval_s,
               "achieved_rate_hz": round(ticks / duration_s, 1) if duration_s > 0 else 0.0,
               "sampler_time_ns": cpu_ns, "reads": proc.mem.reads, "target_exited": exited,
               "sampler_time_note": ("the sampler runs in its own process (its CPU time, not the target's); "
                                     "the target is never stopped")}
    part = BackendResult(backend="cpu", clock=ClockInfo(name="perf_counter_ns", offset_ns=0), start_ns=t_start,
                         end_ns=end_ns, tracks=tracks, frames=tuple(rec.frames), stacks=tuple(rec.stacks),
                         threads=threads, samples=tuple(rec.samples), losses=tuple(losses),
                         summaries={"overhead": summary},
                         metadata={"engine": "attach", "target_pid": pid, "interval_s": options.interval_s})
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except OSError:
        argv = ()
    meta = RunMetadata(host=socket.gethostname(), pid=pid, argv=argv,
                       python=f"{proc.version[0]}.{proc.version[1]}", platform=sys.platform, backends=("cpu",),
                       options={"attach": True, "interval_s": options.interval_s}, start_unix_ns=start_unix_ns,
                       start_ns=t_start, end_ns=end_ns, label=f"attach {pid}")
    return ProfileResult(metadata=meta, parts=(part,))
