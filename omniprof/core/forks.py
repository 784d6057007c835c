"""What a forked child inherits from omniprof, and how it gives it back.

``fork()`` copies the whole process: signal handlers, the profiler's state, a half-recorded
session. Signal handlers and timers belong to the process that installed them, so in a forked
child (``os.fork()``, ``multiprocessing`` with the fork start method) every handler omniprof
installed is put back as it was before omniprof took it, every running session is abandoned
(the child writes, prints and saves nothing), and the child behaves as it would under plain
Python: ``Process.terminate()`` kills it with SIGTERM (-15), a ``Pool`` shuts down at once.

A child that wants a profile of its own starts a new :class:`~omniprof.Profiler` in it.

Putting a handler back in the child is not enough on its own: the kernel copies the handler
(Python's C-level one) into the child, and a signal sent to the child before its Python code has
run -- a ``Pool`` terminated while a worker it just forked has not been scheduled yet -- is
delivered the moment ``fork()`` returns, noted by Python's C handler and then dropped by the
interpreter's own after-fork cleanup, before any after-fork callback runs. The worker survives
``SIGTERM`` and the parent's ``join()`` waits forever. So every signal omniprof holds a handler
for is blocked in the forking thread across the fork (``os.register_at_fork`` ``before``); the
child puts the handlers back and only then unblocks, so a signal that arrived meanwhile meets the
disposition plain python would have given it (``SIGTERM``: death by -15). The parent unblocks
at once, losing nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["on_fork_child", "OwnedHandler", "in_child_of", "deferred_signals", "hold_across_fork",
           "release_across_fork"]

# Callbacks run in every forked child, in registration order. Weak: an object that is gone needs
# no reset. Bound methods are held through WeakMethod.
_callbacks: list[Any] = []

# Signals omniprof holds a Python handler for in this process (signum -> how many holders):
# blocked across every fork (see the module docs).
_held: dict[int, int] = {}
# The forking thread's signal mask before the fork, when omniprof blocked anything.
_mask_before_fork: list[Any] = []
# deferred_signals() blocks active in this process: (the ``note`` handler, {signum: handler it replaced}).
_deferring: list[tuple[Any, dict[int, Any]]] = []
_hooks_registered = False


def _register_hooks() -> None:
    global _hooks_registered
    if not _hooks_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent,
                            after_in_child=_after_fork_child)
        _hooks_registered = True


def hold_across_fork(signum: int) -> None:
    """Block ``signum`` across every fork while omniprof's handler for it is installed."""
    _held[signum] = _held.get(signum, 0) + 1
    _register_hooks()


def release_across_fork(signum: int) -> None:
    """The handler :func:`hold_across_fork` was called for is gone."""
    n = _held.get(signum, 0) - 1
    if n > 0:
        _held[signum] = n
    else:
        _held.pop(signum, None)


def _before_fork() -> None:
    sigs = set(_held)
    for _, saved in _deferring:
        sigs.update(saved)
    if not sigs or not hasattr(signal, "pthread_sigmask"):
        return
    with contextlib.suppress(OSError, ValueError):
        _mask_before_fork.append(signal.pthread_sigmask(signal.SIG_BLOCK, sigs))


def _unblock() -> None:
    if _mask_before_fork:
        old = _mask_before_fork.pop()
        _mask_before_fork.clear()
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _after_fork_parent() -> None:
    _unblock()


def on_fork_child(callback: Callable[[], None]) -> None:
    """Run ``callback()`` in each child forked from now on (until its owner is garbage collected).

    The callback must be quick and must not raise; exceptions are swallowed (the child is
    someone else's program).
    """
    ref: Any = weakref.WeakMethod(callback) if hasattr(callback, "__self__") else _Strong(callback)
    _callbacks[:] = [r for r in _callbacks if r() is not None and r != ref]  # no dead ones, no duplicates
    _callbacks.append(ref)
    _register_hooks()


class _Strong:
    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn

    def __call__(self) -> Callable[[], None]:
        return self.fn

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Strong) and other.fn is self.fn

    __hash__ = None  # type: ignore[assignment]


def _after_fork_child() -> None:
    try:
        # A fork inside a deferred_signals() block (another thread forking while the profiler
        # stops): the handlers it replaced come back first, so the owners below find theirs.
        for note, saved in reversed(_deferring):
            for sig, old in saved.items():
                with contextlib.suppress(BaseException):
                    if signal.getsignal(sig) is note:
                        signal.signal(sig, old)
        _deferring.clear()
        for ref in list(_callbacks):
            cb = ref()
            if cb is not None:
                with contextlib.suppress(BaseException):
                    cb()
        _callbacks[:] = []  # the child's own omniprof starts afresh; nothing of the parent's is reset twice
        _held.clear()
    finally:
        _unblock()  # only now: a signal sent to the child meanwhile meets the child's own handler


def in_child_of(pid: int) -> bool:
    """True when this process is not ``pid`` (it was forked from it)."""
    return os.getpid() != pid


class OwnedHandler:
    """A signal handler owned by the process that installed it.

    ``install()`` sets ``handler`` for ``signum`` and remembers the one it replaced; ``restore()``
    puts that one back if ours is still set. A forked child restores it at once.
    """

    def __init__(self, signum: int, handler: Callable[[int, Any], Any]) -> None:
        self.signum = signum
        self.handler = handler
        self.old: Any = None
        self.installed = False
        self.pid = os.getpid()

    def install(self) -> OwnedHandler:
        self.old = signal.signal(self.signum, self.handler)
        self.installed = True
        self.pid = os.getpid()
        hold_across_fork(self.signum)
        on_fork_child(self._forked)
        return self

    def restore(self) -> None:
        if not self.installed:
            return
        self.installed = False
        release_across_fork(self.signum)
        with contextlib.suppress(ValueError, TypeError, OSError):  # not the main thread / interpreter shutdown
            if signal.getsignal(self.signum) is self.handler:
                signal.signal(self.signum, self.old if self.old is not None else signal.SIG_DFL)

    def _forked(self) -> None:
        self.restore()


_DEFERRED = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP back while the block runs; deliver them after it.

    For work that must not stop half-way (stopping the profiler: disarming its timer, saving the
    result). A signal that arrives meanwhile is noted; when the block ends, the handlers are put
    back and each noted signal's handler is called as it would have been (``KeyboardInterrupt``
    for Ctrl-C). Only where Python lets handlers change (the main thread); a no-op elsewhere, and
    for a signal whose handler is not a Python function (default, ignored).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def note(signum: int, frame: Any) -> None:
        pending.append(signum)

    saved: dict[int, Any] = {}
    entry = (note, saved)
    _deferring.append(entry)
    _register_hooks()
    try:
        for sig in _DEFERRED:
            old = signal.getsignal(sig)
            if callable(old):
                saved[sig] = old
                signal.signal(sig, note)
    except (ValueError, OSError):  # not the main interpreter
        pass
    try:
        yield
    finally:
        _deferring[:] = [e for e in _deferring if e is not entry]
        for sig, old in saved.items():
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(sig) is note:
                    signal.signal(sig, old)
        for sig in dict.fromkeys(pending):  # each once, in arrival order
            old = saved.get(sig)
            if callable(old):
                old(sig, None)
