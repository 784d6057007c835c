"""Backend ``xla``: jax's profiler (XLA's profiler session) read back with jaxlib and xprof.

Levels (every ``ProfileOptions`` field goes to jax explicitly; see docs/backends/xla.md):
    * ``host_tracer_level`` 0-3: passed through (0 nothing on host threads, 1 user annotations
      only, 2 plus XLA's high-level execution events and ops, 3 plus verbose low-level events).
    * ``python_tracer_level`` 0-1: passed through explicitly (jax's real default is 1, not 0).
    * ``device_tracer_level`` 0-1: jax has no such field. 1 records device activity. 0 leaves it out:
      on TPU it sets ``tpu_trace_mode=TRACE_ONLY_HOST`` so the device is never traced; everywhere the
      device planes and the XLA ops the device executed are removed from the saved xplane itself
      (:mod:`.strip`) and so from the result (how many is said in ``metadata.device_events_left_out``).
    * ``advanced_configuration``: validated by :class:`~omniprof.ProfileOptions`, then passed through.

The xplane is written atomically as ``<session_dir>/<host>.xplane.pb``: the Profiler's unique run
directory (jax's own run directories are named to the second, so two traces in one second would
overwrite each other; ours never do), or a fresh temporary directory when no logdir was given.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from omniprof.plugin import Backend, Capability
from omniprof.formats import xprof_runtime as _runtime
from omniprof.formats.xplane import OMNIPROF_MARK, part_from_files, run_tool
from omniprof.backends.xla.strip import strip_device_activity
from omniprof.core import validators as v
from omniprof.core.fileio import atomic_write_bytes, hostname, process_temp_dir
from omniprof.core.results import Artifact, BackendResult, ClockInfo, Loss
from omniprof.errors import (
    BackendError,
    BackendUnavailableError,
    DataLossWarning,
    InvalidArgumentError,
    OmniprofWarning,
)

__all__ = ["XlaBackend", "XlaOptions", "jax_profile_options", "write_perfetto_trace", "serve_perfetto"]

log = logging.getLogger("omniprof.xla")


@attrs.frozen(kw_only=True)
class XlaOptions:
    """Options of the ``xla`` backend.

    Attributes:
        create_perfetto_trace: also write ``perfetto_trace.json.gz`` (Chrome JSON, opens in
            ui.perfetto.dev) beside the xplane.
        create_perfetto_link: serve that file from 127.0.0.1 and print a ui.perfetto.dev link
            (implies ``create_perfetto_trace``).
        perfetto_port: port of that server (default 9001, the port ui.perfetto.dev's docs tunnel;
            0 picks a free one).
        perfetto_wait: block in ``stop()`` until the trace was fetched once (as jax does); False
            returns at once and the server stops itself after the first fetch or the timeout.
        perfetto_timeout_s: how long the link stays served at most.
        record_tool_data: run xprof's tools (kernel/op stats, overview, memory profile, roofline)
            when the session stops. False keeps only the timeline (less post-processing time).
    """

    create_perfetto_trace: bool = attrs.field(default=False, validator=v.is_bool)
    create_perfetto_link: bool = attrs.field(default=False, validator=v.is_bool)
    perfetto_port: int = attrs.field(default=9001, validator=v.int_in_range(0, 65535))
    perfetto_wait: bool = attrs.field(default=True, validator=v.is_bool)
    perfetto_timeout_s: float = attrs.field(default=300.0, validator=v.number_in_range(0.0, 86400.0, lo_open=True))
    record_tool_data: bool = attrs.field(default=True, validator=v.is_bool)


def jax_profile_options(options: Any, jax_module: Any) -> Any:
    """A ``jax.profiler.ProfileOptions`` carrying every field of our validated ``ProfileOptions``.

    jax validates nothing, so ours must be valid already. ``device_tracer_level=0`` with an explicit
    TPU trace mode other than TRACE_ONLY_HOST contradicts itself and is refused.
    """
    o = jax_module.profiler.ProfileOptions()
    o.host_tracer_level = int(options.host_tracer_level)
    o.python_tracer_level = int(options.python_tracer_level)  # jax's default is 1: always set ours
    adv = dict(options.advanced_configuration)
    if options.device_tracer_level == 0:
        mode = adv.get("tpu_trace_mode")
        if mode not in (None, "TRACE_ONLY_HOST"):
            raise InvalidArgumentError(
                f"device_tracer_level=0 leaves device activity out, but advanced_configuration['tpu_trace_mode'] is "
                f"{mode!r}, which traces the device; use device_tracer_level=1, or tpu_trace_mode='TRACE_ONLY_HOST'")
        adv["tpu_trace_mode"] = "TRACE_ONLY_HOST"
    o.advanced_configuration = adv
    with contextlib.suppress(AttributeError):
        o.raise_error_on_start_failure = True
    return o


def write_perfetto_trace(xplanes: list[Path], dest: Path, verbose: bool = False) -> Path:
    """Write the trace viewer's Chrome JSON of ``xplanes`` as gzip to ``dest`` (atomically).

    xprof's trace_viewer converts one host at a time; several hosts are merged into one trace,
    each host's process ids moved to their own range and its process names prefixed by the host.
    """
    import json

    from omniprof.formats.xplane import host_of

    merged: dict[str, Any] | None = None
    for index, xplane in enumerate(xplanes):
        data = run_tool([xplane], "trace_viewer", verbose)
        if data is None:
            raise BackendError(f"xprof produced no trace_viewer data for {xplane}, so no Perfetto trace was written",
                               plugin="xla")
        trace = json.loads(data if isinstance(data, str) else data.decode("utf-8"))
        if len(xplanes) > 1:
            host = host_of(xplane)
            for ev in trace.get("traceEvents", []):
                if isinstance(ev, dict) and isinstance(ev.get("pid"), int):
                    ev["pid"] += index * 1_000_000
                    if ev.get("ph") == "M" and ev.get("name") == "process_name":
                        ev.setdefault("args", {})["name"] = f"{host} {ev.get('args', {}).get('name', '')}".strip()
        if merged is None:
            merged = trace
        else:
            merged.setdefault("traceEvents", []).extend(trace.get("traceEvents", []))
    text = json.dumps(merged or {"traceEvents": []}, separators=(",", ":"))
    atomic_write_bytes(dest, gzip.compress(text.encode("utf-8"), compresslevel=6))
    return dest


def serve_perfetto(path: Path, *, port: int, wait: bool, timeout_s: float,
                   announce: Callable[[str], None] | None = None) -> Any:
    """Serve ``path`` for ui.perfetto.dev from 127.0.0.1 and announce the link.

    With ``wait`` this blocks until the file was fetched once or ``timeout_s`` passed; otherwise a
    watcher thread stops the server after the first fetch or the timeout. Returns the server.
    """
    from omniprof.viewers.serve import TraceFileServer

    server = TraceFileServer(path, port=port).start()
    message = f"Open URL in browser: {server.link}"
    if announce is not None:
        announce(message)
    else:
        log.warning("%s", message)
    if wait:
        try:
            fetched = server.wait_fetched(timeout_s)
        finally:
            server.stop()
        if not fetched:
            warnings.warn(f"the Perfetto link was not opened within {timeout_s:g} s; the trace is at {path}",
                          OmniprofWarning, stacklevel=3)
        return server

    def watch() -> None:
        try:
            server.wait_fetched(timeout_s)
        finally:
            server.stop()

    server.watcher = threading.Thread(target=watch, name="omniprof-perfetto-watch", daemon=True)
    server.watcher.start()
    return server


class XlaBackend(Backend):
    """jax.profiler (XLA profiler session) + xprof: host threads, XLA modules and ops, annotations,
    steps, kernels on GPU, xprof's tables (see module docs)."""

    name = "xla"
    summary = "jax.profiler + xprof: XLA modules/ops, annotations, steps, kernels, xprof tools"
    single_session = True
    Options = XlaOptions

    def __init__(self, options: XlaOptions | None = None, *, context: Any = None) -> None:
        super().__init__(options, context=context)
        self._jax: Any = None
        self._profiler: Any = None
        self._jax_options: Any = None
        self._session: Any = None
        self._t0_ref_ns = 0
        self._t0_unix_ns = 0
        self._step: Any = None
        self.perfetto_server: Any = None
        self.postprocess_s = 0.0

    @classmethod
    def capabilities(cls) -> list[Capability]:
        import importlib.metadata as md

        try:
            jax = _runtime.import_jax(False)
            devices = jax.devices()
        except Exception as e:  # BackendUnavailableError, or a jax that cannot start a backend
            why = str(getattr(e, "reason", "") or f"{type(e).__name__}: {e}")
            return [Capability("host tracing (Python, XLA ops on the host)", False, why),
                    Capability("device tracing (GPU kernels, TPU ops)", False, why)]
        accel = [d for d in devices if d.platform != "cpu"]
        caps = [Capability("host tracing (Python, XLA ops on the host, annotations, steps)", True,
                           f"jax {jax.__version__}"),
                Capability("device tracing (GPU kernels, TPU ops)", bool(accel),
                           ", ".join(f"{d.platform}:{d.id} ({d.device_kind})" for d in accel) if accel else
                           "jax sees only the CPU: install jax with GPU or TPU support (pip install 'jax[cuda13]' "
                           "or 'jax[tpu]') on a machine that has one")]
        try:
            xprof = f"xprof {md.version('xprof')}"
            has_xprof = True
        except md.PackageNotFoundError:
            xprof, has_xprof = "xprof is not installed: pip install 'omniprof[jax]'", False
        caps.append(Capability("xprof tools (op/kernel tables, trace viewer, `omniprof view`)", has_xprof, xprof))
        caps.append(Capability("remote capture (profiler server, `omniprof collect`)", True,
                                "jax.profiler.start_server; binds 127.0.0.1 unless told otherwise"))
        return caps

    @classmethod
    def probe(cls) -> None:
        import importlib.util

        for mod, what in (("jax", "jax"), ("jaxlib", "jaxlib"), ("xprof", "xprof")):
            if importlib.util.find_spec(mod) is None:
                raise BackendUnavailableError(f"{what} is not installed", "Install it with: pip install 'omniprof[jax]'",
                                              plugin=cls.name)

    def prepare(self) -> None:
        if self._jax is not None:
            return
        verbose = self.context.verbose
        self._jax = _runtime.import_jax(verbose)
        self._profiler, _ = _runtime.import_profiler_bindings()
        self._jax_options = jax_profile_options(self.context.profile_options, self._jax)
        self._jax.devices()  # initialise the XLA backend now, not inside the traced region

    def start(self) -> None:
        self.prepare()
        if self._session is not None:
            raise BackendError("the xla backend is already recording", plugin=self.name)
        # Pair the reference clock with the wall clock: the xplane's times are wall-clock ns.
        a = self.clock.now_ns()
        unix = time.time_ns()
        b = self.clock.now_ns()
        self._t0_ref_ns, self._t0_unix_ns = (a + b) // 2, unix
        if _jax_trace_active():
            raise BackendError("jax.profiler.start_trace() is already tracing in this process and XLA runs one "
                               "profiler session at a time; call jax.profiler.stop_trace() first, or trace with "
                               "omniprof only", plugin=self.name)
        try:
            self._session = self._profiler.ProfilerSession(self._jax_options)
        except Exception as e:
            raise BackendError(f"jax's profiler session failed to start: {type(e).__name__}: {e}. Another "
                               f"profiler (jax.profiler.start_trace, a capture through the profiler server) may be "
                               f"running in this process", plugin=self.name) from e

    def stop(self) -> BackendResult:
        session, self._session = self._session, None
        if session is None:
            raise BackendError("the xla backend was stopped without being started", plugin=self.name)
        self._end_step()
        end_ref = self.clock.now_ns()
        try:
            xspace = session.stop()
        except Exception as e:
            raise BackendError(f"XLA's profiler session failed to stop: {type(e).__name__}: {e}. Another profiling "
                               f"session (jax.profiler.start_trace, a remote capture) was probably active",
                               plugin=self.name) from e
        t_post = time.perf_counter()
        if not xspace:  # never write (or read back) an empty xplane as if it were a trace
            return self._lost_trace(end_ref)
        out_dir = self._out_dir()
        xplane = out_dir / f"{hostname()}.xplane.pb"
        include_device = self.context.profile_options.device_tracer_level == 1
        stripped = 0
        if not include_device:  # jax cannot switch the device tracer off: leave its events out of the file too
            xspace, stripped = strip_device_activity(xspace)
        atomic_write_bytes(xplane, xspace)
        opts = self.options
        part, base_unix = part_from_files([xplane], include_device=include_device, verbose=self.context.verbose,
                                          time_base_unix_ns=self._t0_unix_ns, ref_offset_ns=self._t0_ref_ns,
                                          with_tools=opts.record_tool_data)
        artifacts = list(part.artifacts)
        if opts.create_perfetto_trace or opts.create_perfetto_link:
            ptrace = write_perfetto_trace([xplane], out_dir / "perfetto_trace.json.gz", self.context.verbose)
            artifacts.append(Artifact(kind="perfetto_trace", path=str(ptrace),
                                      description="Chrome trace JSON (gzip) for ui.perfetto.dev"))
        self.postprocess_s = time.perf_counter() - t_post
        metadata = {**part.metadata, "jax_version": self._jax.__version__, "devices": _devices(self._jax),
                    "device_events_left_out": part.metadata.get("device_events_left_out", 0) + stripped,
                    "session_dir": str(out_dir), "temporary_dir": self.context.session_dir is None,
                    "postprocess_s": self.postprocess_s,
                    "jax_profile_options": {"host_tracer_level": self._jax_options.host_tracer_level,
                                            "python_tracer_level": self._jax_options.python_tracer_level,
                                            "advanced_configuration": dict(self._jax_options.advanced_configuration)}}
        result = attrs.evolve(part, clock=ClockInfo(name=getattr(self.clock, "name", "perf_counter_ns"), offset_ns=0),
                              start_ns=self._t0_ref_ns, end_ns=max(part.end_ns, end_ref), artifacts=artifacts,
                              metadata=metadata)
        if opts.create_perfetto_link:
            self.perfetto_server = serve_perfetto(Path(artifacts[-1].path), port=opts.perfetto_port,
                                                  wait=opts.perfetto_wait, timeout_s=opts.perfetto_timeout_s)
        return result

    def _lost_trace(self, end_ref: int) -> BackendResult:
        """XLA handed back an empty XSpace: protobuf cannot serialise a message over 2 GB, and
        jax then writes a 0-byte xplane and reports success. Counted and warned, never hidden."""
        detail = ("XLA's profiler returned an empty XSpace (0 bytes): the trace most likely exceeded protobuf's "
                  "2 GB message limit. Profile a shorter window (a schedule with fewer active steps), or lower "
                  "host_tracer_level / device_tracer_level")
        warnings.warn(f"xla: the whole trace was lost: {detail}", DataLossWarning, stacklevel=3)
        return BackendResult(backend=self.name, clock=ClockInfo(name=getattr(self.clock, "name", "perf_counter_ns")),
                             start_ns=self._t0_ref_ns, end_ns=end_ref,
                             losses=[Loss(source="xla", kind="size_limit", count=1, unit="traces", detail=detail)],
                             metadata={"jax_version": self._jax.__version__, "xspace_bytes": 0})

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            with contextlib.suppress(Exception):
                session.stop()
        self._step = None

    def _out_dir(self) -> Path:
        if self.context.session_dir is not None:
            d = Path(self.context.session_dir)
            d.mkdir(parents=True, exist_ok=True)
            return d
        # No logdir: a directory of our own that outlives the session, so the artifact path stays valid
        # for the reporters, and is removed when the process exits.
        return process_temp_dir("omniprof-xla-")

    # -- hooks ---------------------------------------------------------------------------------
    def annotation(self, name: str, args: dict[str, Any] | None = None) -> Any:
        return trace_me(self._profiler, name, args)

    def step(self, step_num: int) -> None:
        self._end_step()
        tm = self._profiler.TraceMe("step", step_num=step_num, _r=1, **{OMNIPROF_MARK: 1})
        tm.__enter__()
        self._step = tm

    def _end_step(self) -> None:
        tm, self._step = self._step, None
        if tm is not None:
            tm.__exit__(None, None, None)


def trace_me(profiler_module: Any, name: str, args: dict[str, Any] | None) -> Any:
    """A jax TraceMe for an omniprof annotation: marked as ours, steps marked as steps (``_r``)."""
    kwargs = {k: _scalar(val) for k, val in (args or {}).items() if k != "_step"}
    kwargs[OMNIPROF_MARK] = 1
    if args and args.get("_step"):
        kwargs["_r"] = 1
    return profiler_module.TraceMe(name, **kwargs)


class ServerAnnotationSink:
    """While a profiler server runs in this process, omniprof annotations become jax TraceMes so a
    remote capture sees them (a TraceMe costs little when no capture is active)."""

    def __init__(self) -> None:
        self._profiler, _ = _runtime.import_profiler_bindings()

    def annotation(self, name: str, args: dict[str, Any] | None = None) -> Any:
        return trace_me(self._profiler, name, args)


def _jax_trace_active() -> bool:
    """Whether ``jax.profiler.start_trace`` holds XLA's (single) profiler session now."""
    try:
        from jax._src import profiler as jax_profiler

        return jax_profiler._profile_state.profile_session is not None
    except (ImportError, AttributeError):  # pragma: no cover - jax internals moved
        return False


def _scalar(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _devices(jax_module: Any) -> list[dict[str, Any]]:
    out = []
    for d in jax_module.devices():
        out.append({"id": int(d.id), "platform": str(d.platform), "kind": str(getattr(d, "device_kind", ""))})
    return out
