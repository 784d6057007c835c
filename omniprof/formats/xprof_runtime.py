"""Lazy, quiet access to jax, jaxlib's profiler bindings and xprof.

jax, XLA and xprof log through absl to the process's stderr, and xprof reads its log level once,
when it is imported. ``TF_CPP_MIN_LOG_LEVEL=3`` set before that import keeps the terminal quiet;
``verbose=True`` (``OMNIPROF_VERBOSE=1``, ``omniprof run --verbose``) leaves the level alone so
the lines show. Some calls of the profiler service also print straight to fd 1/2 from C++;
:func:`native_output` captures those and hands them back (shown when verbose or on failure).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from omniprof.errors import BackendUnavailableError

__all__ = ["import_jax", "import_xprof_convert", "import_profiler_plugin", "native_output", "quiet_env",
           "is_verbose"]

_LOG_ENV = "TF_CPP_MIN_LOG_LEVEL"
VERBOSE_ENV = "OMNIPROF_VERBOSE"


def is_verbose(verbose: bool = False) -> bool:
    return verbose or os.environ.get(VERBOSE_ENV, "") not in ("", "0", "false", "no")


#: The value ``import jax`` sets when the variable is unset; we treat it as "nobody chose".
_JAX_DEFAULT_LEVEL = "1"


def quiet_env(verbose: bool = False) -> None:
    """Quiet: absl's minimum log level FATAL-only; verbose: everything (INFO up).

    A level the user set stays, except jax's own default ("1", set by ``import jax`` when the
    variable is unset), which would still let xprof's warnings and errors through.
    """
    current = os.environ.get(_LOG_ENV)
    if current is not None and current != _JAX_DEFAULT_LEVEL:
        return
    os.environ[_LOG_ENV] = "0" if is_verbose(verbose) else "3"


def import_jax(verbose: bool = False) -> Any:
    """``jax`` (imported quietly), or BackendUnavailableError naming the fix."""
    quiet_env(verbose)
    try:
        import jax
        import jax.profiler  # noqa: F401
    except ImportError as e:
        raise BackendUnavailableError(f"jax is not installed ({e})", "Install it with: pip install 'omniprof[jax]'",
                                      plugin="xla") from e
    if not is_verbose(verbose):
        import logging

        # jax's own Python loggers (compilation cache, profiler) stay at WARNING.
        logging.getLogger("jax").setLevel(max(logging.getLogger("jax").level, logging.WARNING))
    return jax


def import_profiler_bindings() -> tuple[Any, Any]:
    """jaxlib's ``_profiler`` (sessions, TraceMe, server) and ``_profile_data`` (xplane reader)."""
    import_jax()
    try:
        from jax._src.lib import _profile_data, _profiler
    except ImportError as e:  # pragma: no cover - jaxlib layout changed
        raise BackendUnavailableError(f"this jaxlib has no profiler bindings ({e})",
                                      "Install a jax/jaxlib release supported by omniprof[jax]", plugin="xla") from e
    return _profiler, _profile_data


def import_xprof_convert(verbose: bool = False) -> Any:
    """``xprof.convert.raw_to_tool_data`` (imported quietly), or BackendUnavailableError."""
    quiet_env(verbose)
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError as e:
        raise BackendUnavailableError(f"xprof is not installed ({e})", "Install it with: pip install 'omniprof[jax]'",
                                      plugin="xla") from e
    return raw_to_tool_data


def import_profiler_plugin(verbose: bool = False) -> Any:
    """xprof's profiler-service client (``_pywrap_profiler_plugin``: ``trace`` captures remote processes)."""
    quiet_env(verbose)
    try:
        from xprof.convert import _pywrap_profiler_plugin
    except ImportError as e:
        raise BackendUnavailableError(f"xprof is not installed ({e})", "Install it with: pip install 'omniprof[jax]'",
                                      plugin="xla") from e
    return _pywrap_profiler_plugin


class NativeOutput:
    """Text a native call wrote to fd 1 and 2 while captured (``text`` after the block ends)."""

    text: str = ""


@contextlib.contextmanager
def native_output(verbose: bool = False) -> Iterator[NativeOutput]:
    """Capture what C++ code prints to stdout/stderr during the block (unless verbose).

    Python's own ``sys.stdout``/``sys.stderr`` are flushed first so nothing of theirs is swallowed.
    """
    out = NativeOutput()
    if is_verbose(verbose):
        yield out
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        fds = (sys.__stdout__.fileno(), sys.__stderr__.fileno())  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        yield out
        return
    with tempfile.TemporaryFile() as tmp:
        saved = [os.dup(fd) for fd in fds]
        try:
            for fd in fds:
                os.dup2(tmp.fileno(), fd)
            yield out
        finally:
            for fd, s in zip(fds, saved):
                os.dup2(s, fd)
                os.close(s)
            tmp.seek(0)
            out.text = tmp.read().decode("utf-8", "replace")


class StderrFilter:
    """Drops lines matching ``patterns`` from what this process writes to fd 2; passes the rest on.

    XLA's log level is read once, when jaxlib loads, and ``import jax`` has set it to let warnings
    through by then: the profiler server's ``Profiling is late by N nanoseconds`` would reach the
    profiled program's stderr on every remote capture. fd 2 goes through a pipe to a thread that
    forwards every other byte at once (a partial line after 50 ms of quiet). :meth:`close` restores
    fd 2 and forwards what is left; it also runs at exit.
    """

    def __init__(self, patterns: tuple[bytes, ...]) -> None:
        import atexit
        import threading

        self.patterns = patterns
        self.dropped = 0
        for stream in (sys.stderr, sys.__stderr__):
            with contextlib.suppress(Exception):
                stream.flush()  # type: ignore[union-attr]
        self._saved = os.dup(2)
        r, w = os.pipe()
        os.dup2(w, 2)
        os.close(w)
        self._read = r
        self._thread = threading.Thread(target=self._pump, name="omniprof-stderr-filter", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _emit(self, data: bytes) -> None:
        while data:
            try:
                n = os.write(self._saved, data)
            except OSError:
                return
            data = data[n:]

    def _pass(self, line: bytes) -> None:
        if any(p in line for p in self.patterns):
            self.dropped += 1
        else:
            self._emit(line)

    def _pump(self) -> None:
        import select

        from omniprof.core.clock import monotonic

        pending = b""
        since = 0.0
        while True:
            wait = max(0.0, since + 0.05 - monotonic()) if pending else None
            ready, _, _ = select.select([self._read], [], [], wait)
            if not ready:
                self._pass(pending)  # a partial line (a progress bar, a prompt) waits at most 50 ms
                pending = b""
                continue
            try:
                chunk = os.read(self._read, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                if pending:
                    self._pass(pending)
                return
            if not pending:
                since = monotonic()
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._pass(line + b"\n")
            if pending and not lines:
                continue
            since = monotonic()

    def close(self) -> None:
        saved, self._saved_closed = self._saved, getattr(self, "_saved_closed", False)
        if self._saved_closed:
            return
        self._saved_closed = True
        for stream in (sys.stderr, sys.__stderr__):
            with contextlib.suppress(Exception):
                stream.flush()  # type: ignore[union-attr]
        os.dup2(saved, 2)  # the pipe's last writer is gone: the thread drains it and ends
        self._thread.join(1.0)
        if self._thread.is_alive():  # a child process inherited the pipe: keep forwarding its output
            return
        with contextlib.suppress(OSError):
            os.close(self._read)
        with contextlib.suppress(OSError):
            os.close(saved)
