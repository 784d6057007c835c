"""The native engine: a C thread reads every Python thread's stack at each tick (see ``_nativesampler.c``).

This module is its Python half, run under the GIL: a drain thread (``omniprof-native-drain``, never
sampled) moves the engine's samples into the :class:`~.sampler.Sampler` every ``DRAIN_INTERVAL_S``,
turns code addresses into code objects (validated again, then kept alive by the sampler's code
table so an address is never reused while the buffer holds it), names threads while they live,
tells asyncio tasks apart by their coroutine's frame, and drops samples taken inside omniprof's own
code (their time is counted apart as ``own_samples``).
"""

from __future__ import annotations

import os
import sys
import threading
from array import array
from typing import Any

from omniprof.backends.cpu.sampler import Sampler
from omniprof.core.results import ThreadInfo

__all__ = ["NativeEngine", "native_available", "MODES"]

MODES = ("wall", "cpu", "gil")
DRAIN_INTERVAL_S = 0.05
#: deepest stack recorded; a deeper one is counted as torn (a cycle read mid-change looks infinite)
MAX_DEPTH = 2048
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


def _task_sets() -> list[Any]:
    mod = sys.modules.get("asyncio.tasks")
    if mod is None:
        return []
    out: list[Any] = []
    for name in ("_all_tasks", "_scheduled_tasks", "_eager_tasks"):
        s = getattr(mod, name, None)
        if s is not None:
            out.append(s)
    cur = getattr(mod, "_current_tasks", None)
    if cur:
        out.append(list(cur.values()))
    return out


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
        self.stale_codes = 0
        self.empty_samples = 0
        self._stacks: dict[int, Any] = {}      # engine stack index -> raw stack, or None (omniprof's own)
        self._codes: dict[int, Any] = {}       # address -> code object (None: stale, not resolved)
        self._tasks: dict[int, Any] = {}       # coroutine frame address -> task
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.gen_offset = int(getattr(_ns, "GEN_FRAME_OFFSET", -1))
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
        excl = [t.ident for t in threading.enumerate() if t.name.startswith("omniprof-") and t.ident]
        _ns.start(self.interval_ns, mode, MAX_DEPTH, 1 << 24, excl)

    def _run(self) -> None:
        while not self._stop.wait(DRAIN_INTERVAL_S):
            try:
                self.drain()
            except Exception:  # noqa: BLE001 - never disturb the program; stop() drains again and reports
                pass

    def stop(self) -> None:
        if self._orig_set_native is not None:
            threading.Thread._set_native_id = self._orig_set_native  # type: ignore[attr-defined]
            self._orig_set_native = None
        _ns.stop()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.drain()

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

    def _note_tasks(self) -> None:
        if self.gen_offset < 0:
            return
        for group in _task_sets():
            for task in list(group):
                coro = getattr(task, "get_coro", lambda: None)()
                if coro is not None:
                    self._tasks[id(coro) + self.gen_offset] = task

    def drain(self) -> None:
        """Move the engine's samples into the sampler (under the GIL)."""
        with self._lock:
            self._note_threads()
            self._note_tasks()
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
            for idx, raw in stacks:
                leaf = self._codes.get(raw[0]) if raw else None
                own = leaf is not None and leaf.co_filename.startswith(_PKG_DIR)
                # None: omniprof's own; -1: a thread with no Python frame; else the sampler's stack id
                self._stacks[idx] = None if own else (-1 if not raw else self.sampler.intern(tuple(raw)))
            if not data:
                return
            words = array("q")
            words.frombytes(data)
            s = self.sampler
            sh = _ns.FLAG_SHIFT
            mask = (1 << sh) - 1
            tasks = self._tasks
            task_id = s._task_id
            off = self.offset_ns
            for i in range(0, len(words), 5):
                t, tid, w, sf, gen = words[i:i + 5]
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
                task = tasks.get(gen & 0xFFFFFFFFFFFFFFFF) if gen else None
                s.add_sid(t, tid, sid, w, task_id(task, tid) if task is not None else -1, sf >> sh)
