"""The sampling engine: ``(stack_source, clock) -> bounded sample buffer``.

Pure logic, no timers: a trigger (signal timer or thread, see :mod:`.backend`) calls
:meth:`Sampler.sample`. Tests drive it with synthetic stacks and a FakeClock for exact counts.

Storage: one sample is five machine words in ``array`` buffers (time, thread, task, stack id,
weight: 40 bytes) plus, per *distinct* stack, one interned tuple. Samples accumulate across
sessions (Julia's buffer) until :meth:`Sampler.clear`; a session exports only its own slice.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from array import array
from collections.abc import Callable
from typing import Any

from omniprof.backends.cpu.stacks import GC_KEY, NO_CUT, CodeTable, RawStack, StackCut, StackSource, resolve_stack, walk
from omniprof.core.clock import Clock
from omniprof.core.results import Frame, Loss, StackSample, TaskInfo, ThreadInfo
from omniprof.errors import DataLossWarning

__all__ = ["Sampler", "BYTES_PER_SAMPLE", "NO_TASK", "FLAG_IDLE", "current_tasks"]

OVERFLOW_HINT = ("Raise 'max_samples' (backend option, or omniprof.cpu.init(max_samples=...)), lower the "
                 "sampling rate ('interval_s'), or call omniprof.cpu.clear() between sessions.")

#: Bytes of buffer per stored sample (5 int64 arrays and a flags byte), excluding the per-distinct-stack table.
BYTES_PER_SAMPLE = 5 * 8 + 1
#: ``flags`` bit: the thread was idle (not on a CPU) when sampled (native engine).
FLAG_IDLE = 1
NO_TASK = -1


def current_tasks() -> dict[int, Any]:
    """``thread ident -> running asyncio.Task`` for every thread whose event loop runs a task now.

    Reads asyncio's own ``_current_tasks`` table (loop -> task) and each loop's ``_thread_id``;
    costs one dict lookup when asyncio is not imported or no task is running.
    """
    mod = sys.modules.get("asyncio.tasks")
    if mod is None:
        return {}
    table = getattr(mod, "_current_tasks", None)
    if not table:
        return {}
    out = {}
    for loop, task in list(table.items()):
        tid = getattr(loop, "_thread_id", None)
        if tid is not None and task is not None:
            out[tid] = task
    return out


#: A tick this far past the previous one (and at least ``STOP_GAP_TICKS`` intervals) while the
#: whole process used under a tenth of the gap in CPU time means the process was not running
#: (SIGSTOP, Ctrl-Z, a debugger, a frozen container): the time is counted as a loss, never given
#: to the function that happened to run next. The native engine applies the same rule.
STOP_GAP_MIN_NS = 50_000_000
STOP_GAP_TICKS = 50


def stopped_loss(stopped_ns: int, stops: int) -> Loss:
    """The :class:`Loss` for time the process spent stopped while sampling."""
    return Loss(source="cpu", kind="process_stopped", count=stopped_ns, unit="ns",
                detail=f"the process was stopped {stops} time(s) (SIGSTOP, Ctrl-Z, a debugger) for "
                       f"{stopped_ns / 1e9:.3f} s in all; that time is left out of every sample")


class Sampler:
    """Records stacks into a bounded buffer.

    Each sample is weighted by the time since that thread's previous sample (or since the session
    began, for its first), so a sample that stands for several coalesced timer ticks, as in a long
    C call, counts for its full time.

    Args:
        source: the stack source (may be replaced per session by :meth:`begin`).
        clock: ``now_ns()`` provider.
        max_samples: buffer capacity; when full, recording stops, every sample not taken is
            counted in :attr:`dropped` and one :class:`DataLossWarning` is issued (once per
            session). The program is never stopped.
        tasks: a callable returning ``{thread_id: task}`` (default :func:`current_tasks`).
    """

    def __init__(self, source: StackSource | None, clock: Clock, max_samples: int,
                 on_full: Callable[[], None] | None = None,
                 on_new_thread: Callable[[int], None] | None = None,
                 tasks: Callable[[], dict[int, Any]] | None = current_tasks) -> None:
        self.source = source
        self.clock = clock
        self.max_samples = max_samples
        self.on_full = on_full
        self.on_new_thread = on_new_thread
        self.tasks_source = tasks
        self.t_ns = array("q")
        self.thread_ids = array("Q")
        self.task_ids = array("q")
        self.stack_ids = array("q")
        self.weights_ns = array("q")
        self.flags = array("B")
        self.stack_index: dict[RawStack, int] = {}
        self.stack_list: list[RawStack] = []
        self.code_table = CodeTable()
        self.threads: dict[int, ThreadInfo] = {}
        self.task_info: dict[int, TaskInfo] = {}
        self._task_ids: Any = None  # WeakKeyDictionary task -> id, made on first task seen
        self.dropped = 0
        self.ticks = 0
        #: ticks whose sample failed (an error inside the sampler), and the first one's message
        self.errors = 0
        self.first_error: str | None = None
        self.warned = False
        self.self_time_ns = 0
        self._last: dict[int, int] = {}
        self._debt: dict[int, int] = {}
        self._pending: list[tuple[int, int, int, RawStack, int]] = []  # gc samples from other threads
        #: GC time per ``<gc gen N>`` sample (record_gc); the backend sets the sampling interval
        self.gc_quantum_ns = 0
        self._gc_acc: dict[tuple[int, int], int] = {}
        self._t_begin = 0
        self._busy = False
        #: the tick interval of the session (0: not known, stops are not looked for)
        self.interval_ns = 0
        #: time the process was stopped in this session (see STOP_GAP_MIN_NS), and how often
        self.stopped_ns = 0
        self.stops = 0
        self._tick_prev_ns = 0
        self._cpu_prev_ns = 0
        #: ``(first sample index, StackCut)`` of each session that recorded here, in order: a
        #: session's samples are exported with its own cut (the runner's launcher frames, or none)
        self.cuts: list[tuple[int, StackCut]] = []

    # -- session -------------------------------------------------------------------------------
    def begin(self, source: StackSource | None = None, clock: Clock | None = None, cut: StackCut = NO_CUT,
              interval_ns: int = 0) -> int:
        """Start a session whose stacks are cut at ``cut`` when exported, ticking every
        ``interval_ns`` (0: unknown, stops not detected); returns the buffer index where its
        samples begin."""
        start = len(self.t_ns)
        if self.cuts and self.cuts[-1][0] == start:
            self.cuts[-1] = (start, cut)  # the previous session recorded nothing
        elif (self.cuts[-1][1] if self.cuts else NO_CUT) is not cut:
            self.cuts.append((start, cut))
        if source is not None:
            self.source = source
        if clock is not None:
            self.clock = clock
        self._t_begin = self.clock.now_ns()
        self._last = {}
        self._debt = {}
        self._gc_acc = {}
        self.interval_ns = interval_ns
        self.stopped_ns = self.stops = 0
        self._tick_prev_ns = 0
        self.warned = False  # a session that loses samples warns once, even if an earlier one did
        return start

    def __len__(self) -> int:
        return len(self.t_ns)

    # -- hot path ------------------------------------------------------------------------------
    def sample(self) -> None:
        """Take one sample of every thread the source returns."""
        if self._busy:  # re-entered (a gc callback or a nested signal): skip, counted as a tick
            self.ticks += 1
            return
        self._busy = True
        clock = self.clock
        t0 = clock.now_ns()
        try:
            self.ticks += 1
            if self.interval_ns:
                self._leave_out_stop(t0)
            if self._pending:
                self._flush_pending()
            self.record(self.source(), t0)  # type: ignore[misc]
        except Exception as e:
            # Never into the program (the signal engine samples inside its main thread) and never a
            # thread that dies silently (the thread engine): counted, reported as a loss at stop.
            self.errors += 1
            if self.first_error is None:
                self.first_error = f"{type(e).__name__}: {e}"[:200]
        finally:
            self._busy = False
            self.self_time_ns += clock.now_ns() - t0

    def _leave_out_stop(self, t0: int) -> None:
        cpu = time.process_time_ns()
        gap = t0 - self._tick_prev_ns
        if self._tick_prev_ns and gap > max(STOP_GAP_MIN_NS, STOP_GAP_TICKS * self.interval_ns) and \
                (cpu - self._cpu_prev_ns) * 10 < gap:
            skip = gap - self.interval_ns  # the process was stopped: no thread's time
            self.stopped_ns += skip
            self.stops += 1
            self._t_begin += skip
            for tid in self._last:
                self._last[tid] += skip
        self._tick_prev_ns = t0
        self._cpu_prev_ns = cpu

    def record(self, stacks: Any, t0: int) -> None:
        """Store one tick's ``(thread_id, frame_or_raw_stack)`` pairs taken at ``t0``."""
        last = self._last
        tasks = self.tasks_source() if self.tasks_source is not None else None
        index = self.stack_index
        for tid, f in stacks:
            if len(self.t_ns) >= self.max_samples:
                self.dropped += 1
                last[tid] = t0
                if not self.warned:
                    self._warn_full()
                continue
            raw = f if type(f) is tuple else walk(f)
            sid = index.get(raw)
            if sid is None:
                sid = self._new_stack(raw, f)
            prev = last.get(tid)
            if prev is None:
                # First sample of this thread in this session: (re)read its name, since the OS
                # reuses thread idents once threads end.
                prev = self._t_begin
                self._new_thread(tid)
            w = t0 - prev
            if self._debt:
                debt = self._debt.pop(tid, 0)
                w = max(w - debt, 0)
            last[tid] = t0
            self.t_ns.append(t0)
            self.thread_ids.append(tid)
            self.task_ids.append(self._task_id(tasks.get(tid), tid) if tasks else NO_TASK)
            self.stack_ids.append(sid)
            self.weights_ns.append(w)
            self.flags.append(0)

    def add(self, t_ns: int, tid: int, raw: RawStack, weight_ns: int, task_id: int = NO_TASK, flags: int = 0) -> bool:
        """Store one ready-made sample (out-of-process engines); False when the buffer is full."""
        full = len(self.t_ns) >= self.max_samples  # a dropped sample interns no stack
        return self.add_sid(t_ns, tid, -1 if full else self.intern(raw), weight_ns, task_id, flags)

    def intern(self, raw: RawStack) -> int:
        """The stack id of ``raw`` (added when new; code objects registered by the caller)."""
        sid = self.stack_index.get(raw)
        return self._new_stack(raw, raw) if sid is None else sid

    def add_sid(self, t_ns: int, tid: int, sid: int, weight_ns: int, task_id: int = NO_TASK, flags: int = 0) -> bool:
        """Store one sample of an interned stack (the native engine's drain); False when the buffer is full."""
        if len(self.t_ns) >= self.max_samples:
            self.dropped += 1
            if not self.warned:
                self._warn_full()
            return False
        self.t_ns.append(t_ns)
        self.thread_ids.append(tid)
        self.task_ids.append(task_id)
        self.stack_ids.append(sid)
        self.weights_ns.append(weight_ns)
        self.flags.append(flags)
        return True

    def _new_stack(self, raw: RawStack, frame: Any) -> int:
        sid = self.stack_index[raw] = len(self.stack_list)
        self.stack_list.append(raw)
        if type(frame) is not tuple:
            self.code_table.register(frame)
        return sid

    def _new_thread(self, tid: int) -> None:
        t = threading._active.get(tid)  # type: ignore[attr-defined]  # O(1), safe in a signal handler
        if t is not None:
            self.threads[tid] = ThreadInfo(tid, t.name, getattr(t, "native_id", None))
        if self.on_new_thread is not None:
            self.on_new_thread(tid)

    def new_task(self, name: str, tid: int) -> int:
        """A new task id named ``name``, first seen on thread ``tid`` (the native engine's tasks)."""
        tid_ = len(self.task_info) + 1
        self.task_info[tid_] = TaskInfo(tid_, name, tid)
        return tid_

    def _task_id(self, task: Any, tid: int) -> int:
        if task is None:
            return NO_TASK
        if self._task_ids is None:
            import weakref

            self._task_ids = weakref.WeakKeyDictionary()
        try:
            tid_ = self._task_ids.get(task)
        except TypeError:
            return NO_TASK
        if tid_ is None:
            name = task.get_name() if hasattr(task, "get_name") else f"Task-{len(self.task_info) + 1}"
            tid_ = self._task_ids[task] = self.new_task(str(name), tid)
        return tid_

    # -- gc (host_tracer_level 3) -------------------------------------------------------------
    def record_gc(self, tid: int, frame: Any, generation: int, t_start: int, t_end: int) -> None:
        """Record a collection that ran in thread ``tid`` from ``t_start`` to ``t_end`` (the in-process
        engines cannot sample during one: no Python code runs).

        GC time is shown as time, in samples like the others: a thread's collections of one
        generation add up, and each whole ``gc_quantum_ns`` (the sampling interval) of it becomes one
        sample of that weight whose leaf is a ``<gc gen N>`` frame; the thread's next sample gives
        that time back. So ``<gc>`` rows have as many samples as their time is worth, as sampled
        rows do (one collection of 50 us is not one sample of a 1 ms profile, one of 9 ms is nine).
        What has not made a whole quantum when the session stops stays in the thread's next sample,
        as the signal engine would have charged it (the exact GC time is in the gc spans and
        ``gc_time_ns``). ``gc_quantum_ns`` 0: one sample per collection."""
        key = (tid, generation)
        acc = self._gc_acc.get(key, 0) + t_end - t_start
        q = self.gc_quantum_ns
        n = acc // q if q > 0 else 1
        if n == 0:
            self._gc_acc[key] = acc
            return
        self._gc_acc[key] = acc - n * q if q > 0 else 0
        raw = (GC_KEY, generation, *walk(frame))
        if raw not in self.stack_index:
            self.code_table.register(frame)
        w = q if q > 0 else acc
        self._pending.extend((t_end, tid, w, raw, 0) for _ in range(n))
        if not self._busy and threading.get_ident() == threading.main_thread().ident:
            self._flush_pending()

    def _flush_pending(self) -> None:
        pending, self._pending = self._pending, []
        for t_end, tid, dur, raw, _ in pending:
            if len(self.t_ns) >= self.max_samples:
                self.dropped += 1
                continue
            sid = self.stack_index.get(raw)
            if sid is None:
                sid = self.stack_index[raw] = len(self.stack_list)
                self.stack_list.append(raw)
            if tid not in self.threads:
                self._new_thread(tid)
            self.t_ns.append(t_end)
            self.thread_ids.append(tid)
            self.task_ids.append(NO_TASK)
            self.stack_ids.append(sid)
            self.weights_ns.append(dur)
            self.flags.append(0)
            if tid in self._last:
                self._debt[tid] = self._debt.get(tid, 0) + dur

    # -- buffer --------------------------------------------------------------------------------
    def _warn_full(self) -> None:
        self.warned = True
        warnings.warn(
            f"omniprof cpu sampler: the sample buffer is full ({self.max_samples} samples); recording has "
            f"stopped (the program goes on) and the samples not taken are counted in the result. {OVERFLOW_HINT}",
            DataLossWarning, stacklevel=2)
        if self.on_full is not None:
            self.on_full()

    def clear(self) -> None:
        """Forget every sample (the buffer keeps its capacity)."""
        for a in (self.t_ns, self.thread_ids, self.task_ids, self.stack_ids, self.weights_ns, self.flags):
            del a[:]
        self.stack_index.clear()
        self.stack_list.clear()
        self.cuts.clear()
        self.code_table.clear()
        self.task_info.clear()
        self._task_ids = None
        self.dropped = 0
        self.ticks = 0
        self.errors = 0
        self.first_error = None
        self.warned = False
        self.self_time_ns = 0
        self._last = {}
        self._debt = {}
        self._gc_acc = {}
        self._pending = []

    def nbytes(self) -> int:
        """Bytes held by the sample arrays (not counting the distinct-stack table)."""
        return sum(a.itemsize * len(a) for a in (self.t_ns, self.thread_ids, self.task_ids, self.stack_ids,
                                                  self.weights_ns, self.flags))

    def export(self, start: int = 0, end: int | None = None, *, dropped: int | None = None, offsets: bool = True,
               flush: bool = True, cut: StackCut | None = None
               ) -> tuple[tuple[Frame, ...], tuple[tuple[int, ...], ...], tuple[StackSample, ...], tuple[Loss, ...]]:
        """Resolve raw frames of samples ``[start, end)`` and return ``(frames, stacks, samples, losses)``.

        Only stacks used by those samples are exported, renumbered densely. ``offsets=False`` merges
        frames on one line (no ``Frame.offset``). ``flush=False`` reads without touching the
        buffer (a checkpoint taken from another thread while sampling goes on). Stacks are cut
        at ``cut``, or (None) at the cut of the session that recorded each sample (:meth:`begin`).
        """
        if flush and self._pending:
            self._flush_pending()
        end = len(self.t_ns) if end is None else end
        codes = self.code_table.codes
        memo: dict[tuple[Any, int], Frame] = {}
        frame_ids: dict[Frame, int] = {}
        frames: list[Frame] = []
        stacks: list[tuple[int, ...]] = []
        stack_dedup: dict[tuple[int, ...], int] = {}
        samples = []
        sl = self.stack_list
        t_ns, tids, tasks, sids, ws, fl = (self.t_ns, self.thread_ids, self.task_ids, self.stack_ids, self.weights_ns,
                                           self.flags)
        # the cut per sample: ``cut`` for all, or each session's own; a raw stack is resolved once per cut
        segments = [(0, cut)] if cut is not None else self.cuts
        if not segments or segments[0][0] > 0:
            segments = [(0, NO_CUT), *segments]
        maps: dict[int, dict[int, int]] = {}  # id(cut) -> raw stack id -> exported stack id
        seg, next_at = -1, start  # the first sample finds its segment
        for i in range(start, end):
            if i >= next_at:
                while seg + 1 < len(segments) and segments[seg + 1][0] <= i:
                    seg += 1
                cur = segments[seg][1]
                next_at = segments[seg + 1][0] if seg + 1 < len(segments) else end
                stack_map = maps.setdefault(id(cur), {})
            raw_sid = sids[i]
            sid = stack_map.get(raw_sid)
            if sid is None:
                ids = []
                for fr in resolve_stack(sl[raw_sid], codes, memo, offsets, cur):
                    fid = frame_ids.get(fr)
                    if fid is None:
                        fid = frame_ids[fr] = len(frames)
                        frames.append(fr)
                    ids.append(fid)
                key = tuple(ids)
                sid = stack_dedup.get(key)
                if sid is None:
                    sid = stack_dedup[key] = len(stacks)
                    stacks.append(key)
                stack_map[raw_sid] = sid
            task = tasks[i]
            samples.append(StackSample(t_ns[i], tids[i], sid, ws[i], None if task == NO_TASK else task,
                                       bool(fl[i] & FLAG_IDLE)))
        n_dropped = self.dropped if dropped is None else dropped
        losses: tuple[Loss, ...] = ()
        if n_dropped:
            losses = (Loss(source="cpu", kind="samples_dropped", count=n_dropped, unit="samples",
                           detail=f"sample buffer full at {self.max_samples} samples; {OVERFLOW_HINT}"),)
        return tuple(frames), tuple(stacks), tuple(samples), losses

