"""The native engine: a C thread reads every Python thread's stack at each tick (see ``_nativesampler.c``).

This module is its Python half, run under the GIL: a drain thread (``omniprof-native-drain``, never
sampled) moves the engine's samples into the :class:`~.sampler.Sampler` every ``DRAIN_INTERVAL_S``
and soon after the engine meets a new code object, turns code addresses into code objects (validated
again, then kept alive by the sampler's code table so an address is never reused while the buffer
holds it, and a short-lived code object is still named at the end), names threads while they live,
tells asyncio tasks apart by their coroutine's frame, and drops samples taken inside omniprof's own
code (their time is counted apart as ``own_samples``).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import weakref
import struct
from typing import Any

from omniprof.backends.cpu.sampler import Sampler
from omniprof.core.clock import perf_counter_ns, process_time_ns, thread_time_ns
from omniprof.core.results import ThreadInfo

__all__ = ["NativeEngine", "native_available", "MODES"]

MODES = ("wall", "cpu", "gil")
DRAIN_INTERVAL_S = 0.05
#: Drains woken by new code objects come at most this often (the periodic ones every DRAIN_INTERVAL_S).
MIN_DRAIN_GAP_NS = 5_000_000
#: deepest stack recorded; a deeper one is counted as torn (a cycle read mid-change looks infinite)
MAX_DEPTH = 2048
_perf_ns = perf_counter_ns
_thread_ns = thread_time_ns
#: one engine record: time, thread id, weight, stack index and flags, generator frame (native int64s)
_RECORDS = struct.Struct("=5q")
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep

try:
    if os.environ.get("OMNIPROF_NO_NATIVE"):
        raise ImportError("OMNIPROF_NO_NATIVE is set")
    from omniprof.backends.cpu import _nativesampler as _ns
except ImportError as e:  # not built (no compiler), or switched off
    _ns = None
    _IMPORT_ERROR = str(e)
else:
    _IMPORT_ERROR = ""


def native_available() -> tuple[bool, str]:
    """Whether the native engine runs here, and how (or why not)."""
    if _ns is None:
        return False, (f"the _nativesampler extension is not available ({_IMPORT_ERROR}); build it with a C "
                       f"compiler (pip install reinstalls it)")
    ok, how = _ns.available()
    return bool(ok), str(how)


def _registry_set(mod: Any) -> Any:
    """The WeakSet every new asyncio task is added to (``_scheduled_tasks`` from 3.12, ``_all_tasks``
    before); both the C and the Python Task call its ``add`` by name, so an instance attribute sees
    every task as it is created."""
    for name in ("_scheduled_tasks", "_all_tasks"):
        ws = getattr(mod, name, None)
        if ws is not None and hasattr(ws, "__dict__"):
            return ws
    return None


def _live_tasks(mod: Any, everything: bool) -> list[Any]:
    """Tasks that exist now: all of them (``everything``), else only those running or running eagerly
    (3.12's eager tasks are added to a plain set by C code, out of the hook's sight)."""
    out: list[Any] = []
    names = ("_all_tasks", "_scheduled_tasks", "_eager_tasks") if everything else ("_eager_tasks",)
    for name in names:
        s = getattr(mod, name, None)
        if s is not None:
            out.extend(list(s))
    cur = getattr(mod, "_current_tasks", None)
    if cur:
        out.extend(list(cur.values()))
    return out


class TaskRegistry:
    """Which asyncio task a sample's root-most coroutine frame belongs to.

    The engine records, per sample, the address of the root-most coroutine frame. Tasks are noted
    as they are created (a hook on asyncio's task set: ``log``), so a task that starts and ends
    between two drains is still named; each address keeps the history of the tasks that used it
    (``t_reg_ns`` ordered) until no future sample can name the older ones, and a finished task's
    address is forgotten once the samples taken before it ended are drained. Tasks are held only
    from their creation to the next drain (to read their name, set after registration on 3.10-3.11).
    """

    def __init__(self, gen_offset: int, new_task: Any) -> None:
        self.gen_offset = gen_offset
        self.new_task = new_task  # (name, thread ident) -> task id
        self.log: list[tuple[int, int, Any, int]] = []  # (t_reg_ns, frame address, task, thread ident)
        self.dead: list[int] = []                       # addresses whose task was freed
        #: address -> [[t_reg_ns, weakref, name, thread ident, task id or 0], ...], oldest first
        self.by_addr: dict[int, list[list[Any]]] = {}
        self._multi: set[int] = set()  # addresses with more than one task in their history
        self._ws: Any = None
        self._hook: Any = None

    def install(self) -> None:
        """Hook task creation once ``asyncio`` is imported (noting the tasks that already exist)."""
        if self._ws is not None or self.gen_offset < 0:
            return
        mod = sys.modules.get("asyncio.tasks")
        ws = _registry_set(mod) if mod is not None else None
        if ws is None or "add" in ws.__dict__:
            return
        log, off, now, ident = self.log, self.gen_offset, _perf_ns, threading.get_ident
        add = type(ws).add

        def hook(task: Any, _ws: Any = ws) -> None:
            add(_ws, task)
            try:
                log.append((now(), id(task.get_coro()) + off, task, ident()))
            except Exception:  # noqa: BLE001 - a foreign task type: it is only left unnamed
                pass

        ws.add = hook
        self._ws, self._hook = ws, hook
        for task in _live_tasks(mod, everything=True):
            addr = self._addr(task)
            if addr is not None:
                log.append((0, addr, task, 0))

    def uninstall(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None and ws.__dict__.get("add") is self._hook:
            del ws.add
        self._hook = None

    def _addr(self, task: Any) -> int | None:
        """The address the engine records for ``task``: its coroutine's frame (None: no coroutine)."""
        coro = getattr(task, "get_coro", lambda: None)()
        return None if coro is None else id(coro) + self.gen_offset

    def before_drain(self) -> list[int]:
        """Called before the engine's buffer is taken: moves the creation log into the history and
        returns the addresses freed so far (all their samples are in the buffer about to be drained)."""
        mod = sys.modules.get("asyncio.tasks")
        if mod is not None and self._ws is not None:
            hist = self.by_addr
            for task in _live_tasks(mod, everything=False):
                addr = self._addr(task)
                if addr is None:
                    continue
                entries = hist.get(addr)
                if not (entries and entries[-1][1]() is task):
                    self.log.append((_perf_ns() if entries else 0, addr, task, 0))
        n = len(self.log)
        items = self.log[:n]
        del self.log[:n]  # only what was read: a task created meanwhile stays for the next drain
        dead, cb = self.dead, self.dead.append
        for t_reg, addr, task, thread in items:
            try:
                ref = weakref.ref(task, lambda _r, a=addr: cb(a))
                name = str(task.get_name()) if hasattr(task, "get_name") else ""
            except TypeError:
                continue
            entries = self.by_addr.setdefault(addr, [])
            if entries:
                self._multi.add(addr)
            entries.append([t_reg, ref, name, thread, 0])
        n = len(dead)
        freed = dead[:n]
        del dead[:n]
        return freed

    def task_id(self, addr: int, t_ns: int, tid: int) -> int:
        """The task id of a sample at ``t_ns`` whose root-most coroutine frame is ``addr`` (-1: none)."""
        entries = self.by_addr.get(addr)
        if not entries:
            return -1
        e = entries[0]
        if len(entries) > 1:
            for cand in entries:
                if cand[0] > t_ns:
                    break
                e = cand
        if not e[4]:
            task = e[1]()
            name = str(task.get_name()) if task is not None and hasattr(task, "get_name") else e[2]
            e[4] = self.new_task(name or f"Task@{addr:#x}", e[3] or tid)
        return e[4]

    def after_drain(self, freed: list[int]) -> None:
        """Forget what no future sample can name: older tasks at a reused address, freed tasks."""
        hist = self.by_addr
        for addr in self._multi:
            entries = hist.get(addr)
            if entries:
                del entries[:-1]
        self._multi.clear()
        for addr in freed:
            entries = hist.get(addr)
            if entries and entries[-1][1]() is None:
                del hist[addr]


@functools.lru_cache(maxsize=1)
def _lifecycle_codes() -> frozenset[Any]:
    """The code objects of the Profiler's start, stop and step paths."""
    from omniprof.core.profiler import LIFECYCLE_METHODS, Profiler

    return frozenset(getattr(Profiler, n).__code__ for n in LIFECYCLE_METHODS)


class NativeEngine:
    """Runs the C engine for one session, feeding ``sampler``."""

    def __init__(self, sampler: Sampler, interval_s: float, mode: str = "wall", offset_ns: int = 0) -> None:
        if _ns is None:
            raise RuntimeError(native_available()[1])
        self.sampler = sampler
        self.offset_ns = offset_ns  # the session clock minus CLOCK_MONOTONIC (perf_counter_ns), added to each stamp
        self.interval_ns = max(1, round(interval_s * 1e9))
        self.mode = mode
        self.stats: dict[str, Any] = {}
        self.own_samples = 0
        self.own_ns = 0
        #: CPU time spent in :meth:`drain` (under the GIL: the program's Python threads wait meanwhile)
        self.drain_cpu_ns = 0
        #: the whole process's CPU time from start() to stop() (every thread, the engine's included)
        self.process_cpu_ns = 0
        self.stale_codes = 0
        self.empty_samples = 0
        self._stacks: dict[int, Any] = {}      # engine stack index -> raw stack, or None (omniprof's own)
        self._codes: dict[int, Any] = {}       # address -> code object (None: stale, not resolved)
        self._stop = threading.Event()
        self._cpu0 = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.gen_offset = int(getattr(_ns, "GEN_FRAME_OFFSET", -1))
        self.tasks = TaskRegistry(self.gen_offset, sampler.new_task)
        self._natives: dict[int, int] = {}
        self._orig_set_native: Any = None

    def _hook_native_ids(self) -> None:
        """CPython 3.10's thread states lack the native thread id (needed for the per-thread CPU
        clock): a thread started during the session gives it to the engine as it starts."""
        if sys.version_info >= (3, 11) or self._orig_set_native is not None:
            return
        orig = threading.Thread._set_native_id  # type: ignore[attr-defined]
        natives = self._natives

        def _set_native_id(th: threading.Thread) -> None:
            orig(th)
            if th.ident is not None and th.native_id:
                natives[th.ident] = th.native_id
                _ns.set_native_ids(dict(natives))

        self._orig_set_native = orig
        threading.Thread._set_native_id = _set_native_id  # type: ignore[attr-defined]

    def start(self) -> None:
        self._hook_native_ids()
        mode = {"wall": _ns.MODE_WALL, "cpu": _ns.MODE_CPU, "gil": _ns.MODE_GIL}[self.mode]
        self._thread = threading.Thread(target=self._run, name="omniprof-native-drain", daemon=True)
        self._thread.start()
        self._note_threads()
        self.tasks.install()  # again at each drain, for a program that imports asyncio later
        excl = [t.ident for t in threading.enumerate() if t.name.startswith("omniprof-") and t.ident]
        self._cpu0 = process_time_ns()
        _ns.start(self.interval_ns, mode, MAX_DEPTH, 1 << 24, excl)

    def _run(self) -> None:
        # Drains every DRAIN_INTERVAL_S, and soon after the engine meets a code object it has not seen:
        # resolving it keeps it alive (``code_table``), so a short-lived one (a short script's module
        # code, freed when runpy returns, before the final drain) is named, not reported stale.
        last = 0
        while not self._stop.is_set():
            _ns.wait_new_codes(DRAIN_INTERVAL_S)
            if self._stop.is_set():
                break
            gap = MIN_DRAIN_GAP_NS - (_perf_ns() - last)
            if gap > 0 and self._stop.wait(gap / 1e9):  # a program making code objects all the time
                break
            try:
                self.drain()
            except Exception:  # noqa: BLE001 - never disturb the program; stop() drains again and reports
                pass
            last = _perf_ns()

    def stop(self) -> None:
        if self._orig_set_native is not None:
            threading.Thread._set_native_id = self._orig_set_native  # type: ignore[attr-defined]
            self._orig_set_native = None
        self._stop.set()
        _ns.stop()  # also ends the drain thread's wait
        self.process_cpu_ns = process_time_ns() - self._cpu0
        if self._thread is not None:
            self._thread.join()
        self.drain()
        self.tasks.uninstall()

    def _note_threads(self) -> None:
        s = self.sampler
        natives = {}
        for t in threading.enumerate():
            if t.ident is None:
                continue
            if t.name.startswith("omniprof-"):
                _ns.exclude(t.ident)
                continue
            nid = getattr(t, "native_id", None)
            if nid:
                natives[t.ident] = nid
                self._natives[t.ident] = nid
            info = s.threads.get(t.ident)
            if info is None or info.name != t.name:
                s.threads[t.ident] = ThreadInfo(t.ident, t.name, nid)
        _ns.set_native_ids(natives)

    def drain(self) -> None:
        """Move the engine's samples into the sampler (under the GIL); its CPU time adds to ``drain_cpu_ns``."""
        with self._lock:
            t0 = _thread_ns()
            try:
                self._drain()
            finally:
                self.drain_cpu_ns += _thread_ns() - t0

    def _drain(self) -> None:
        self._note_threads()
        self.tasks.install()
        freed = self.tasks.before_drain()
        data, stacks, codes, stats = _ns.drain()
        self.stats = stats
        if codes:
            table = self.sampler.code_table.codes
            for addr, code in zip(codes, _ns.resolve_codes(codes)):
                self._codes[addr] = code
                if code is None:
                    self.stale_codes += 1
                else:
                    table.setdefault(addr, code)  # keeps it alive: the address is never reused meanwhile
        lifecycle = _lifecycle_codes()
        for idx, raw in stacks:
            leaf = self._codes.get(raw[0]) if raw else None
            # omniprof's own: its code at the leaf, or anything under the Profiler's start,
            # stop or step (the standard library they call: signal.getsignal, Event.set)
            own = (leaf is not None and leaf.co_filename.startswith(_PKG_DIR)) or any(
                self._codes.get(raw[i]) in lifecycle for i in range(0, len(raw), 2))
            # None: omniprof's own; -1: a thread with no Python frame; else the sampler's stack id
            self._stacks[idx] = None if own else (-1 if not raw else self.sampler.intern(tuple(raw)))
        if data:
            s = self.sampler
            sh = _ns.FLAG_SHIFT
            mask = (1 << sh) - 1
            task_id = self.tasks.task_id
            off = self.offset_ns
            # five native int64 words a record, unpacked in C (slicing an array per record cost more
            # than the rest of the loop: this runs under the GIL, the program's threads wait)
            for t, tid, w, sf, gen in _RECORDS.iter_unpack(data):
                t += off
                tid &= 0xFFFFFFFFFFFFFFFF
                sid = self._stacks.get(sf & mask)
                if sid is None:
                    self.own_samples += 1
                    self.own_ns += w
                    continue
                if sid < 0:  # a thread running no Python code (starting, ending, or C only): nothing to show
                    self.empty_samples += 1
                    continue
                s.add_sid(t, tid, sid, w, task_id(gen & 0xFFFFFFFFFFFFFFFF, t - off, tid) if gen else -1, sf >> sh)
        self.tasks.after_drain(freed)
