"""Exact Python call/return tracing (``python_tracer_level=1``), as jax's python tracer does.

A ``sys.setprofile`` hook records every Python call and every call of a builtin (C function) in
the thread that starts profiling and in threads started afterwards (``threading.setprofile``;
threads already running are not traced: Python 3.11 has no hook for them). Each finished call is
one span of category ``"python"`` on its thread's track. The event buffer is bounded; calls past it
are counted as a loss, never dropped silently. Overhead is that of any deterministic profiler
(2-4x on call-heavy code, measured in ``benchmarks/cpu_sampler.py``).
"""

from __future__ import annotations

import os
import sys
import threading
from types import CodeType
from typing import Any

from omniprof.core.clock import Clock
from omniprof.core.results import Loss, Span

__all__ = ["PythonTracer"]

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


class PythonTracer:
    """Records ``(thread, callee, start_ns, end_ns, depth)`` for every call while installed."""

    def __init__(self, clock: Clock, max_events: int, ignore_codes: frozenset[CodeType] = frozenset(),
                 launcher_codes: frozenset[CodeType] = frozenset()) -> None:
        self.clock = clock
        self.max_events = max_events
        self.ignore = ignore_codes
        #: the frames that hand over to the target (``omniprof run``'s runpy ``_run_code`` and
        #: ``call_function``): what they call is the program's, though omniprof's own code called them
        self.launchers = launcher_codes
        self.events: list[tuple[int, Any, int, int, int]] = []
        self.dropped = 0
        self._stacks: dict[int, list[tuple[Any, int]]] = {}
        self._prev_profile: Any = None
        self._prev_thread_profile: Any = None
        self.installed = False
        self._own: dict[CodeType, bool] = {}

    def _is_own(self, code: CodeType) -> bool:
        """True for omniprof's own code (the Profiler starting/stopping, the sampler): its calls,
        and what they call, are not the program's."""
        own = self._own.get(code)
        if own is None:
            own = self._own[code] = code in self.ignore or code.co_filename.startswith(_PKG_DIR)
        return own

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        now = self.clock.now_ns()
        tid = threading.get_ident()
        stack = self._stacks.get(tid)
        if stack is None:
            stack = self._stacks[tid] = []
        if event == "call" or event == "c_call":
            if stack and stack[-1][0] is None and not (
                    event == "call" and frame.f_back is not None and frame.f_back.f_code in self.launchers):
                stack.append((None, now))  # inside omniprof's own code: not the program's calls
            elif event == "c_call":
                stack.append((None if self._is_own(frame.f_code) else arg, now))
            else:
                code = frame.f_code
                back = frame.f_back
                own = self._is_own(code) or (back is not None and self._is_own(back.f_code)
                                             and back.f_code not in self.launchers)
                stack.append((None if own else code, now))
        elif event in ("return", "c_return", "c_exception"):
            if not stack:
                return  # a frame entered before tracing began
            callee, t0 = stack.pop()
            if callee is None:
                return
            if len(self.events) >= self.max_events:
                self.dropped += 1
                return
            self.events.append((tid, callee, t0, now, len(stack)))

    def install(self) -> None:
        self._prev_profile = sys.getprofile()
        self._prev_thread_profile = getattr(threading, "_profile_hook", None)
        threading.setprofile(self._hook)
        sys.setprofile(self._hook)
        self.installed = True

    def uninstall(self) -> None:
        if not self.installed:
            return
        sys.setprofile(self._prev_profile)
        threading.setprofile(self._prev_thread_profile)  # type: ignore[arg-type]
        self.installed = False

    def spans(self, end_ns: int) -> tuple[list[Span], list[Loss]]:
        """Finished calls as spans; calls still open at the end are closed at ``end_ns``."""
        events = list(self.events)
        for tid, stack in self._stacks.items():
            for depth, (callee, t0) in enumerate(stack):
                if callee is not None:
                    events.append((tid, callee, t0, end_ns, depth))
        names: dict[int, tuple[str, dict[str, Any]]] = {}
        out = []
        for tid, callee, t0, t1, depth in events:
            key = id(callee)
            info = names.get(key)
            if info is None:
                info = names[key] = _describe(callee)
            name, args = info
            out.append(Span(name=name, track=f"thread:{tid}", start_ns=t0, dur_ns=max(t1 - t0, 0), category="python",
                            args={**args, "depth": depth}))
        out.sort(key=lambda s: (s.track, s.start_ns, -s.dur_ns))
        losses = []
        if self.dropped:
            losses.append(Loss(source="cpu", kind="events_dropped", count=self.dropped, unit="calls",
                               detail=f"python tracer buffer full at {self.max_events} calls; raise 'max_python_events'"))
        return out, losses


def _describe(callee: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(callee, CodeType):
        return getattr(callee, "co_qualname", callee.co_name), {"file": callee.co_filename,
                                                                   "line": callee.co_firstlineno}
    mod = getattr(callee, "__module__", None) or getattr(getattr(callee, "__self__", None), "__name__", None)
    name = getattr(callee, "__qualname__", None) or getattr(callee, "__name__", repr(callee))
    return name, {"native": True, **({"module": str(mod)} if mod else {})}
