"""Remote capture through XLA's profiler service (the one ``jax.profiler.start_server`` runs and
``xprof``'s capture button and ``python -m jax.collect_profile`` talk to).

In the profiled process: ``omniprof.jax.start_server(port)`` / ``omniprof.jax.stop_server()``.
From anywhere that reaches it: ``omniprof collect ADDR[,ADDR...] --duration-ms N --logdir DIR`` or
:func:`collect`, which captures every address for the same window into one new run directory,
one ``<host>_<port>.xplane.pb`` per process, and reads them into one result.

XLA's profiler server listens on every network interface (``[::]:PORT``) and has no option to bind
one address: anyone who can reach the port can capture traces of the process, which include
function names and array shapes. :func:`start_server` says so with a warning, unless the caller
acknowledges it with ``all_interfaces_ok=True``; the safe way is a firewalled port reached through
an SSH tunnel (docs/backends/xla.md, "Remote capture").
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from omniprof.formats import xprof_runtime as _runtime
from omniprof.core.fileio import unique_run_dir
from omniprof.core.options import ProfileOptions
from omniprof.core.results import Loss, ProfileResult, RunMetadata
from omniprof.errors import BackendError, InvalidArgumentError, OmniprofWarning, ProfilerStateError

__all__ = ["start_server", "stop_server", "collect", "CollectResult", "parse_addresses", "ExposedServerWarning",
           "server_port"]

_ADDR = re.compile(r"^(?:grpc://)?(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(?P<port>\d+)$")

_server: Any = None
_server_port: int | None = None
_sink: Any = None
_stderr_filter: Any = None

#: What XLA's profiler service prints in the profiled process on every capture (kept off its stderr).
QUIET_PATTERNS = (b"Profiling is late by",)


class ExposedServerWarning(OmniprofWarning):
    """A server was started that listens on every network interface."""


def _check_port(port: Any, name: str = "port") -> int:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise InvalidArgumentError(f"{name!r} must be an integer between 1 and 65535 (got {port!r})")
    return port


def start_server(port: int, *, all_interfaces_ok: bool = False) -> int:
    """Start XLA's profiler server in this process so ``omniprof collect`` can capture it.

    The port is checked first: XLA's gRPC server shares a port with another process's server
    (``SO_REUSEPORT``) and does not report a failed bind, so a busy port would "succeed" and
    captures would reach whichever process answers. A busy port is refused at once, naming the
    process that holds it. While the server runs, XLA's ``Profiling is late by N nanoseconds``
    lines are kept off this process's stderr (unless verbose).

    Args:
        port: TCP port (1-65535).
        all_interfaces_ok: XLA's server listens on every network interface; unless this is True an
            :class:`ExposedServerWarning` says so. Set it once the port is firewalled (reach it
            with ``ssh -L PORT:127.0.0.1:PORT host``).

    Returns:
        The port.

    Raises:
        ProfilerStateError: a server is already running in this process.
        BackendError: the port is in use (the message names the holder when it can be seen) or
            the server did not come up on it.

    .. versionadded:: 0.1
    """
    global _server, _server_port, _sink, _stderr_filter
    from omniprof.core.ports import port_holder, port_in_use

    _check_port(port)
    if _server is not None:
        raise ProfilerStateError(f"a profiler server is already running in this process on port {_server_port}; "
                                 f"call omniprof.jax.stop_server() first")
    jax = _runtime.import_jax()
    if port_in_use(port):
        holder = port_holder(port)
        raise BackendError(f"cannot start the profiler server: port {port} is already in use"
                           + (f" by {holder}" if holder else " (by a process this user cannot inspect)")
                           + f". XLA's server would share the port with it and captures would reach either process; "
                           f"stop that process or choose a free port (omniprof.jax.start_server(OTHER_PORT))",
                           plugin="xla")
    if not all_interfaces_ok:
        warnings.warn(
            f"the XLA profiler server listens on port {port} of EVERY network interface (it cannot bind only "
            f"127.0.0.1): anyone who reaches this port can capture traces of this process. Block the port from "
            f"other hosts (firewall) and collect through an SSH tunnel (ssh -L {port}:127.0.0.1:{port} HOST); "
            f"pass all_interfaces_ok=True to acknowledge and silence this warning",
            ExposedServerWarning, stacklevel=2)
    try:
        server = jax.profiler.start_server(port)
    except ValueError as e:  # jax: "Only one profiler server can be active at a time."
        raise ProfilerStateError(f"jax already runs a profiler server in this process ({e}); stop it with "
                                 f"jax.profiler.stop_server() first") from e
    except Exception as e:
        raise BackendError(f"cannot start the profiler server on port {port}: {type(e).__name__}: {e}. "
                           f"Choose a free port", plugin="xla") from e
    from omniprof.core.ports import listening_pids

    pids = listening_pids(port)
    if pids and os.getpid() not in pids:  # lost a race for the port: XLA says nothing, so we check
        with contextlib.suppress(Exception):
            jax.profiler.stop_server()
        raise BackendError(f"the profiler server did not bind port {port}: {port_holder(port)} took it first; "
                           f"choose a free port", plugin="xla")
    _server = server
    _server_port = port
    from omniprof.backends.xla.backend import acquire_sink

    _sink = acquire_sink(server=True)
    if not _runtime.is_verbose() and _stderr_filter is None:
        with contextlib.suppress(OSError):
            _stderr_filter = _runtime.StderrFilter(QUIET_PATTERNS)
    return port


def stop_server() -> None:
    """Stop the server :func:`start_server` started.

    .. versionadded:: 0.1
    """
    global _server, _server_port, _sink, _stderr_filter
    if _server is None:
        raise ProfilerStateError("no profiler server is running in this process "
                                 "(start one with omniprof.jax.start_server)")
    jax = _runtime.import_jax()
    try:
        jax.profiler.stop_server()
    finally:
        from omniprof.backends.xla.backend import release_sink

        if _sink is not None:
            release_sink(server=True)
        if _stderr_filter is not None:
            _stderr_filter.close()
        _server = None
        _server_port = None
        _sink = None
        _stderr_filter = None


def server_port() -> int | None:
    """The port of the server started by :func:`start_server`, or None."""
    return _server_port


def parse_addresses(addresses: str | Sequence[str]) -> list[str]:
    """``"host:port,host:port"`` or a list of them, validated; ``grpc://`` prefixes dropped."""
    items = [a.strip() for a in addresses.split(",")] if isinstance(addresses, str) else [str(a).strip() for a in addresses]
    items = [a for a in items if a]
    if not items:
        raise InvalidArgumentError("give at least one address to capture, as HOST:PORT (e.g. 127.0.0.1:9999)")
    out = []
    for a in items:
        m = _ADDR.match(a)
        if not m:
            raise InvalidArgumentError(f"address {a!r} must be HOST:PORT (e.g. 127.0.0.1:9999 or [::1]:9999)")
        _check_port(int(m.group("port")), f"port of {a}")
        out.append(f"{m.group('host')}:{m.group('port')}")
    if len(set(out)) != len(out):
        raise InvalidArgumentError(f"an address is listed twice: {', '.join(out)}")
    return out


@attrs.frozen
class CollectResult:
    """What :func:`collect` captured and saved.

    Attributes:
        run_dir: the new run directory (``<logdir>/plugins/profile/<run>/``).
        files: one ``.xplane.pb`` per address that answered.
        result: the capture read into a :class:`ProfileResult` (also saved as ``omniprof.result.json``).
        perfetto_trace: ``perfetto_trace.json.gz`` when written (serve it with
            ``omniprof.viewers.serve.serve_perfetto_link`` or ``omniprof view --perfetto``).
        missing: addresses that sent no trace.
        result_file: the saved ``omniprof.result.json``.
    """

    run_dir: Path
    files: tuple[Path, ...]
    result: ProfileResult = attrs.field(repr=False)
    perfetto_trace: Path | None = None
    missing: tuple[str, ...] = ()
    result_file: Path | None = None

    @property
    def saved(self) -> tuple[Path, ...]:
        """Every file this capture saved."""
        extra = [p for p in (self.result_file, self.perfetto_trace) if p is not None]
        return (*self.files, *extra)


def _host_file_name(addr: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", addr.replace(":", "_").strip("[]"))


def collect(addresses: str | Sequence[str], duration_ms: int, logdir: str | os.PathLike[str] | None = None, *,
            options: ProfileOptions | None = None, perfetto_trace: bool = True, num_tracing_attempts: int = 3,
            verbose: bool = False) -> CollectResult:
    """Capture ``duration_ms`` of every process at ``addresses`` into one new run directory.

    The saved xplanes hold what the result holds: ``device_tracer_level=0`` removes device
    activity from them as the local backend does, and omniprof's annotation marks are stripped.
    Serving a Perfetto link is the caller's step, once this returned (everything is saved by then).

    Args:
        addresses: ``HOST:PORT`` of profiler servers (``omniprof.jax.start_server`` in each process).
        duration_ms: capture window.
        logdir: XProf logdir; the run goes to ``<logdir>/plugins/profile/<unique run>/``.
            None: a new temporary directory, kept (it holds the capture) and named in the result.
        options: tracer levels and advanced configuration sent to every process.
        perfetto_trace: also write ``perfetto_trace.json.gz`` of all hosts.
        num_tracing_attempts: how often to ask before giving up (``omniprof collect --attempts``).

    Raises:
        BackendError: no server answered (the message names the addresses and the fix), or the
            capture could not be read or saved (the message names the files saved so far).

    .. versionadded:: 0.1
    """
    from omniprof.backends.xla.backend import write_perfetto_trace
    from omniprof.backends.xla.strip import strip_device_activity, strip_marks
    from omniprof.core.fileio import atomic_write_bytes
    from omniprof.analysis.xla_ops import op_stats_table
    from omniprof.formats.xplane import part_from_files

    addrs = parse_addresses(addresses)
    if not isinstance(duration_ms, int) or isinstance(duration_ms, bool) or not 1 <= duration_ms <= 3_600_000:
        raise InvalidArgumentError(f"'duration_ms' must be an integer between 1 and 3600000 (got {duration_ms!r})")
    if not isinstance(num_tracing_attempts, int) or not 1 <= num_tracing_attempts <= 100:
        raise InvalidArgumentError(f"'num_tracing_attempts' must be an integer between 1 and 100 (got {num_tracing_attempts!r})")
    opts = options if options is not None else ProfileOptions()
    if not isinstance(opts, ProfileOptions):
        opts = ProfileOptions.from_dict(opts)
    plugin = _runtime.import_profiler_plugin(verbose)
    request: dict[str, Any] = {"host_tracer_level": opts.host_tracer_level,
                               "device_tracer_level": opts.device_tracer_level,
                               "python_tracer_level": opts.python_tracer_level}
    request.update(dict(opts.advanced_configuration))
    include_device = opts.device_tracer_level == 1
    if not include_device:
        mode = request.get("tpu_trace_mode")
        if mode not in (None, "TRACE_ONLY_HOST"):
            raise InvalidArgumentError(
                f"device_tracer_level=0 leaves device activity out, but advanced_configuration['tpu_trace_mode'] is "
                f"{mode!r}, which traces the device; use device_tracer_level=1, or tpu_trace_mode='TRACE_ONLY_HOST'")
        request["tpu_trace_mode"] = "TRACE_ONLY_HOST"
    # Absolute: the profiler server writes the capture into the directory named in the request, so
    # a relative one was taken from the profiled process's working directory (the capture "returned
    # no trace file" and its files were left there).
    base = Path(os.path.abspath(logdir)) if logdir is not None else Path(tempfile.mkdtemp(prefix="omniprof-collect-"))
    staging = Path(tempfile.mkdtemp(prefix=".omniprof-capture-", dir=_staging_parent(base)))
    names: set[str] = set()
    left_out = 0
    try:
        with _runtime.native_output(verbose) as native:
            try:
                plugin.trace(",".join(addrs), str(staging), "", True, duration_ms, num_tracing_attempts, request)
                error = None
            except Exception as e:
                error = e
        if error is not None:
            detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            closed = [a for a in addrs if not _reachable(a)]
            who = (f"nothing listens at {', '.join(closed)}" if closed
                   else "no profiler server answered with a trace")
            printed = _our_flags(native.text.strip()[-500:])
            raise BackendError(
                f"capture from {', '.join(addrs)} failed after {num_tracing_attempts} attempt(s): {who} "
                f"({_our_flags(detail)}). Start one in each profiled process with omniprof.jax.start_server(PORT) (or "
                f"jax.profiler.start_server), check HOST:PORT, and that the process runs jax work during the "
                f"{duration_ms} ms window; more attempts: omniprof collect --attempts N"
                + (f". Profiler output: {printed}" if printed else ""),
                plugin="xla") from error
        produced = sorted(staging.glob("plugins/profile/*/*.xplane.pb"))
        if not produced:
            raise BackendError(f"capture from {', '.join(addrs)} returned no trace file; try a longer --duration-ms",
                               plugin="xla")
        run_dir = unique_run_dir(base / "plugins" / "profile")
        files = []
        for f in produced:
            dest = run_dir / f.name
            data = f.read_bytes()
            if not include_device:  # as the local backend: the saved file holds what the result holds
                data, removed = strip_device_activity(data)
                left_out += removed
            data, marked = strip_marks(data)
            names |= marked
            atomic_write_bytes(dest, data)
            files.append(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    saved = ", ".join(str(f) for f in files)
    names_found = {f.name for f in files}
    missing = tuple(a for a in addrs if f"{_host_file_name(a)}.xplane.pb" not in names_found)
    try:
        part, start_unix = part_from_files(files, include_device=include_device, verbose=verbose,
                                           annotation_names=names, op_table=op_stats_table)
    except Exception as e:
        raise BackendError(f"the capture was saved ({saved}) but could not be read: {type(e).__name__}: {e}",
                           plugin="xla") from e
    if left_out:
        part = attrs.evolve(part, metadata={**part.metadata, "device_events_left_out":
                                            part.metadata.get("device_events_left_out", 0) + left_out})
    if missing and len(files) < len(addrs):
        part = attrs.evolve(part, losses=(*part.losses, Loss(source="xla", kind="hosts_missing", count=len(missing),
                                                               unit="hosts", detail="no trace from " + ", ".join(missing))))
        warnings.warn(f"no trace came back from {', '.join(missing)}; the run has the other hosts only",
                      OmniprofWarning, stacklevel=2)
    pids = dict(part.metadata.get("pids") or {})
    result = ProfileResult(
        metadata=RunMetadata(host=",".join(addrs), pid=next(iter(pids.values())) if len(pids) == 1 else 0,
                             backends=("xla",), options=opts.to_dict(), start_unix_ns=start_unix,
                             versions=dict(part.metadata.get("versions") or {}),
                             start_ns=0, end_ns=part.end_ns, label=f"omniprof collect {','.join(addrs)}"),
        parts=(part,))
    from omniprof.core.profiler import RESULT_FILENAME

    result_file = run_dir / RESULT_FILENAME
    try:
        result.save(result_file)
    except OSError as e:
        raise BackendError(f"the capture was saved ({saved}) but {result_file} could not be written: "
                           f"{e.strerror or e}", plugin="xla") from e
    ptrace = None
    if perfetto_trace:
        try:
            ptrace = write_perfetto_trace(files, run_dir / "perfetto_trace.json.gz", verbose)
        except Exception as e:  # the capture and its result are saved: a missing Perfetto file is a warning
            warnings.warn(f"perfetto_trace.json.gz not written ({type(e).__name__}: {e}); saved: {saved}, "
                          f"{result_file}", OmniprofWarning, stacklevel=2)
    return CollectResult(run_dir=run_dir, files=tuple(files), result=result, perfetto_trace=ptrace,
                         missing=missing, result_file=result_file)


def _our_flags(text: str) -> str:
    """XLA's capture client suggests its own flag; ours is --attempts."""
    return re.sub(r"--?num_tracing_attempts", "--attempts", text)


def _reachable(addr: str, timeout_s: float = 1.0) -> bool:
    """Whether a TCP connection to ``addr`` opens (to name the addresses that are down)."""
    import socket

    host, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def _staging_parent(base: Path) -> Path:
    # Stage on the same file system as the run directory so moving the files is a rename.
    try:
        base.mkdir(parents=True, exist_ok=True)
        return base
    except OSError:
        return Path(tempfile.gettempdir())
