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
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

import attrs

from omniprof.plugin import Backend, Capability
from omniprof.formats import xprof_runtime as _runtime
from omniprof.formats.xplane import OMNIPROF_MARK, part_from_files, run_tool
from omniprof.analysis.xla_ops import op_stats_table
from omniprof.backends.xla.strip import strip_device_activity, strip_marks
from omniprof.core import validators as v
from omniprof.core.annotations import STEP_MARK, user_args
from omniprof.core.clock import perf_counter, time_ns
from omniprof.core.collectives import Collectives
from omniprof.core.fileio import atomic_write_bytes, hostname, process_temp_dir
from omniprof.core.results import Artifact, BackendResult, ClockInfo, Loss
from omniprof.errors import (
    BackendError,
    BackendUnavailableError,
    DataLossWarning,
    InvalidArgumentError,
    OmniprofWarning,
)

__all__ = ["XlaBackend", "XlaOptions", "jax_profile_options", "write_perfetto_trace", "acquire_sink", "release_sink"]



@attrs.frozen(kw_only=True)
class XlaOptions:
    """Options of the ``xla`` backend.

    Attributes:
        create_perfetto_trace: also write ``perfetto_trace.json.gz`` (Chrome JSON, opens in
            ui.perfetto.dev) beside the xplane.
        create_perfetto_link: once the trace and the result are saved, serve that file from
            127.0.0.1 and print a ui.perfetto.dev link to stderr (implies ``create_perfetto_trace``).
            The Profiler does this after saving (the backend itself serves nothing); a port that
            cannot be bound or Ctrl-C during the wait loses nothing.
        perfetto_port: port of that server (default 9001, the only port ui.perfetto.dev fetches from).
        perfetto_wait: block until the trace was fetched once (as jax does); False returns at once
            and the server stops itself after the first fetch or the timeout.
        perfetto_timeout_s: how long the link stays served at most.
        record_tool_data: run xprof's tools (kernel/op stats, overview, memory profile, roofline)
            when the session stops. False keeps only the timeline (less post-processing time).
        write_trace_json: also write ``<host>.trace.json.gz`` with XLA's exporter, as
            ``jax.profiler`` does (about as long as jax's whole export: ~0.35 s for 20,000 events
            on the 2-core development machine). False skips it.
    """

    create_perfetto_trace: bool = attrs.field(default=False, validator=v.is_bool)
    create_perfetto_link: bool = attrs.field(default=False, validator=v.is_bool)
    perfetto_port: int = attrs.field(default=9001, validator=v.int_in_range(0, 65535))
    perfetto_wait: bool = attrs.field(default=True, validator=v.is_bool)
    perfetto_timeout_s: float = attrs.field(default=300.0, validator=v.number_in_range(0.0, 86400.0, lo_open=True))
    record_tool_data: bool = attrs.field(default=True, validator=v.is_bool)
    write_trace_json: bool = attrs.field(default=True, validator=v.is_bool)


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
        self._sink: _ProcessSink | None = None
        #: After stop(): what to open once the Profiler saved the result (``create_perfetto_link``):
        #: ``{"viewer": "perfetto_link", "path", "port", "wait", "timeout_s", "saved"}``, else None.
        self.view_request: dict[str, Any] | None = None
        self.postprocess_ns = 0

    @classmethod
    def environment(cls, *, frameworks: bool = True) -> list[tuple[str, str]]:
        """jax (with ``frameworks``: imported, its version with jaxlib's and its devices) and xprof."""
        from omniprof.core.doctor import dist_version

        import logging

        facts: list[tuple[str, str]] = []
        if frameworks:
            loggers = [logging.getLogger(n) for n in ("jax", "jax._src.xla_bridge", "absl")]
            levels = [lg.level for lg in loggers]
            try:
                for lg in loggers:  # "no GPU/TPU found, falling back to cpu" is what the devices row says
                    lg.setLevel(logging.ERROR)
                jax = _runtime.import_jax(False)
                devs = jax.devices()
                facts.append(("jax", f"{jax.__version__}, jaxlib {dist_version('jaxlib')}"))
                facts.append(("jax devices", ", ".join(f"{d.platform}:{d.id} ({d.device_kind})" for d in devs)))
            except Exception as e:  # a broken jax install is a fact to report, not a crash
                facts.append(("jax", f"unavailable ({type(e).__name__}: {getattr(e, 'reason', '') or e})"))
            finally:
                for lg, level in zip(loggers, levels):
                    lg.setLevel(level)
        else:
            facts.append(("jax", dist_version("jax")))
        facts.append(("xprof", dist_version("xprof")))
        return facts

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
                                "jax.profiler.start_server; listens on EVERY network interface ([::]:PORT) and "
                                "cannot be limited to 127.0.0.1: firewall the port, collect through "
                                "ssh -L PORT:127.0.0.1:PORT"))
        return caps

    @classmethod
    def job_collectives(cls) -> Collectives | None:
        """The jax.distributed runtime of this process, for ``Profiler(distributed=True)``; None without one."""
        from omniprof.backends.xla.collectives import JaxCollectives, job_running

        return JaxCollectives() if job_running() else None

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
        unix = time_ns()
        b = self.clock.now_ns()
        self._t0_ref_ns, self._t0_unix_ns = (a + b) // 2, unix
        if _jax_trace_active():
            raise BackendError("jax.profiler.start_trace() is already tracing in this process and XLA runs one "
                               "profiler session at a time; call jax.profiler.stop_trace() first, or trace with "
                               "omniprof only", plugin=self.name)
        _set_jax_metadata(self._jax, self._profiler)
        try:
            self._session = self._profiler.ProfilerSession(self._jax_options)
        except Exception as e:
            raise BackendError(f"jax's profiler session failed to start: {type(e).__name__}: {e}. Another "
                               f"profiler (jax.profiler.start_trace, a capture through the profiler server) may be "
                               f"running in this process", plugin=self.name) from e
        _guard_jax_trace(True)
        self._sink = acquire_sink()
        _watch_jax_annotations(self._jax, self._sink)

    def stop(self) -> BackendResult:
        session, self._session = self._session, None
        if session is None:
            raise BackendError("the xla backend was stopped without being started", plugin=self.name)
        self._end_step()
        end_ref = self.clock.now_ns()
        names = self._release_sink()
        _guard_jax_trace(False)
        try:
            xspace = session.stop()
        except Exception as e:
            raise BackendError(f"XLA's profiler session failed to stop: {type(e).__name__}: {e}. Another profiling "
                               f"session (jax.profiler.start_trace, a remote capture) was probably active",
                               plugin=self.name) from e
        t_post = perf_counter()
        if not xspace:  # never write (or read back) an empty xplane as if it were a trace
            return self._lost_trace(end_ref)
        out_dir = self._out_dir()
        xplane = out_dir / f"{hostname()}.xplane.pb"
        include_device = self.context.profile_options.device_tracer_level == 1
        stripped = 0
        if not include_device:  # jax cannot switch the device tracer off: leave its events out of the file too
            xspace, stripped = strip_device_activity(xspace)
        xspace, marked = strip_marks(xspace)  # marks exist only while a profiler server runs here
        atomic_write_bytes(xplane, xspace)
        opts = self.options
        extra: list[Artifact] = []
        losses: list[Loss] = []
        if opts.write_trace_json:
            trace_json = _export_trace_json(session, xspace, out_dir, self.context.verbose)
            if isinstance(trace_json, Path):
                extra.append(Artifact(kind="trace_json", path=str(trace_json),
                                      description="XLA's Chrome trace JSON (gzip), as jax.profiler writes it"))
            else:  # said and counted; the xplane and the result are unaffected
                warnings.warn(f"xla: {trace_json}; the xplane is at {xplane}", OmniprofWarning, stacklevel=3)
                losses.append(Loss(source="xla", kind="export_failed", count=1, unit="files", detail=trace_json))
        part, base_unix = part_from_files([xplane], include_device=include_device, verbose=self.context.verbose,
                                          time_base_unix_ns=self._t0_unix_ns, ref_offset_ns=self._t0_ref_ns,
                                          with_tools=opts.record_tool_data, annotation_names=names | marked,
                                          op_table=op_stats_table)
        artifacts = [*part.artifacts, *extra]
        if opts.create_perfetto_trace or opts.create_perfetto_link:
            # A Perfetto file that cannot be written is a counted loss, never the loss of the part.
            try:
                ptrace = write_perfetto_trace([xplane], out_dir / "perfetto_trace.json.gz", self.context.verbose)
            except Exception as e:
                detail = f"perfetto_trace.json.gz not written: {type(e).__name__}: {e}; the xplane is at {xplane}"
                warnings.warn(f"xla: {detail}", OmniprofWarning, stacklevel=3)
                losses.append(Loss(source="xla", kind="export_failed", count=1, unit="files", detail=detail))
            else:
                artifacts.append(Artifact(kind="perfetto_trace", path=str(ptrace),
                                          description="Chrome trace JSON (gzip) for ui.perfetto.dev"))
                if opts.create_perfetto_link:
                    self.view_request = {"viewer": "perfetto_link", "path": str(ptrace), "port": opts.perfetto_port,
                                         "wait": opts.perfetto_wait, "timeout_s": opts.perfetto_timeout_s,
                                         "saved": [str(xplane)]}
        self.postprocess_ns = round((perf_counter() - t_post) * 1e9)
        metadata = {**part.metadata, "jax_version": self._jax.__version__, "devices": _devices(self._jax),
                    "device_events_left_out": part.metadata.get("device_events_left_out", 0) + stripped,
                    "session_dir": str(out_dir), "temporary_dir": self.context.session_dir is None,
                    "postprocess_ns": self.postprocess_ns,
                    "jax_profile_options": {"host_tracer_level": self._jax_options.host_tracer_level,
                                            "python_tracer_level": self._jax_options.python_tracer_level,
                                            "advanced_configuration": dict(self._jax_options.advanced_configuration)}}
        if self.context.session_dir is None:
            metadata["temporary_dir_note"] = (f"no logdir: the files are in {out_dir}, removed when this process "
                                              f"exits; pass logdir= to keep them")
        result = attrs.evolve(part, clock=ClockInfo(name=getattr(self.clock, "name", "perf_counter_ns"), offset_ns=0),
                              start_ns=self._t0_ref_ns, end_ns=max(part.end_ns, end_ref), artifacts=artifacts,
                              metadata=metadata, losses=[*part.losses, *losses])
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
            _guard_jax_trace(False)
        self._release_sink()
        self._step = None

    def _release_sink(self) -> frozenset[str]:
        sink, self._sink = self._sink, None
        if sink is None:
            return frozenset()
        _watch_jax_annotations(self._jax, None)
        names = frozenset(sink.names)
        release_sink()
        return names

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
        # The process-wide sink (acquired in start) emits the TraceMe: one per annotation however
        # many users (a local Profiler and omniprof.jax.start_server) want them.
        return None

    def step(self, step_num: int) -> None:
        self._end_step()
        tm = self._profiler.TraceMe("step", step_num=step_num, _r=1)
        tm.__enter__()
        self._step = tm

    def _end_step(self) -> None:
        tm, self._step = self._step, None
        if tm is not None:
            tm.__exit__(None, None, None)


class _ProcessSink:
    """The one annotation sink of the xla backend in a process: omniprof annotations become jax
    TraceMes (a TraceMe costs little when nothing traces). Shared by every local xla session and
    the profiler server (:func:`acquire_sink`), so no range is recorded twice.

    While a profiler server runs, each TraceMe carries ``_omniprof: 1``: a remote capture has no
    other way to tell omniprof's ranges from XLA's; every file we save has the mark stripped
    (:func:`~omniprof.backends.xla.strip.strip_marks`). Local sessions need no mark: the names are
    remembered here and handed to the reader.
    """

    def __init__(self, profiler_module: Any) -> None:
        self._profiler = profiler_module
        #: names of the ranges opened while a local session records (read by that session's stop()).
        self.names: set[str] = set()
        self.users = 0
        self.server_users = 0

    def annotation(self, name: str, args: dict[str, Any] | None = None) -> Any:
        if self.users > self.server_users:  # a local session records: it needs the names, not marks
            self.names.add(name)
        kwargs = {k: _scalar(val) for k, val in user_args(args).items()}
        if args and args.get(STEP_MARK):
            kwargs["_r"] = 1
        if self.server_users:
            kwargs[OMNIPROF_MARK] = 1
        return self._profiler.TraceMe(name, **kwargs)


_sink: _ProcessSink | None = None
_sink_lock = threading.Lock()


def acquire_sink(*, server: bool = False) -> _ProcessSink:
    """Register the process sink on first use (counted); ``server`` marks its TraceMes for remote captures."""
    global _sink
    from omniprof.core import annotations

    with _sink_lock:
        if _sink is None:
            profiler_module, _ = _runtime.import_profiler_bindings()
            _sink = _ProcessSink(profiler_module)
            annotations.add_sink(_sink)
        if not server and _sink.users == _sink.server_users:
            _sink.names.clear()  # a new local session: names of earlier ones are not its business
        _sink.users += 1
        if server:
            _sink.server_users += 1
        return _sink


def release_sink(*, server: bool = False) -> None:
    """Undo one :func:`acquire_sink`; the last user unregisters the sink."""
    global _sink
    from omniprof.core import annotations

    with _sink_lock:
        if _sink is None:
            return
        _sink.users -= 1
        if server:
            _sink.server_users = max(0, _sink.server_users - 1)
        if _sink.users <= 0:
            annotations.remove_sink(_sink)
            _sink = None


def _watch_jax_annotations(jax_module: Any, sink: _ProcessSink | None) -> None:
    """While a session records, ``jax.profiler.TraceAnnotation`` (the public name) is a subclass
    that notes each range's name, so the reader files the user's jax annotations as
    ``annotation`` (XLA's trace does not tell a Python TraceMe from XLA's own). jax's internal
    ranges use ``jax._src.profiler``'s class and stay ``runtime``. ``sink=None`` restores jax's class."""
    profiler = getattr(jax_module, "profiler", None)
    current = getattr(profiler, "TraceAnnotation", None)
    if current is None:
        return
    if sink is None:
        original = getattr(current, "_omniprof_original", None)
        if original is not None:
            profiler.TraceAnnotation = original
        return
    if getattr(current, "_omniprof_original", None) is not None:
        return
    names = sink.names

    class TraceAnnotation(current):  # type: ignore[misc, valid-type]
        __doc__ = current.__doc__
        _omniprof_original = current

        def __init__(self, name: str, **kwargs: Any) -> None:
            names.add(name)
            super().__init__(name, **kwargs)

    TraceAnnotation.__module__ = getattr(current, "__module__", "jax.profiler")
    TraceAnnotation.__qualname__ = getattr(current, "__qualname__", "TraceAnnotation")
    profiler.TraceAnnotation = TraceAnnotation


def _set_jax_metadata(jax_module: Any, profiler_module: Any) -> None:
    """The run metadata ``jax.profiler.start_trace`` records (jax, jaxlib and platform versions)."""
    if not hasattr(profiler_module, "set_metadata"):
        return
    with contextlib.suppress(Exception):
        profiler_module.clear_metadata()
    try:
        from jax._src.lib import version as jaxlib_version

        jaxlib = ".".join(map(str, jaxlib_version))
    except ImportError:  # pragma: no cover - jaxlib layout changed
        import importlib.metadata as md

        jaxlib = md.version("jaxlib")
    profiler_module.set_metadata("jax_version", str(jax_module.__version__))
    profiler_module.set_metadata("jaxlib_version", jaxlib)
    with contextlib.suppress(Exception):
        for d in {d.client for d in jax_module.devices()}:
            profiler_module.set_metadata(f"{d.platform}_version", str(d.platform_version))


def _export_trace_json(session: Any, xspace: bytes, out_dir: Path, verbose: bool) -> Path | str:
    """``<host>.trace.json.gz`` beside the xplane, written by XLA's own exporter (as jax's
    ``stop_trace`` writes it). Returns the path, or why it could not be written."""
    staging = Path(tempfile.mkdtemp(prefix=".omniprof-export-", dir=out_dir))
    try:
        with _runtime.native_output(verbose):
            session.export(xspace, str(staging))
        found = sorted(staging.glob("plugins/profile/*/*.trace.json.gz"))
        if not found:
            return "XLA's exporter wrote no .trace.json.gz"
        dest = out_dir / f"{hostname()}.trace.json.gz"
        os.replace(found[0], dest)
        return dest
    except Exception as e:
        return f"<host>.trace.json.gz not written: {type(e).__name__}: {e}"
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _jax_trace_active() -> bool:
    """Whether ``jax.profiler.start_trace`` holds XLA's (single) profiler session now."""
    try:
        from jax._src import profiler as jax_profiler

        held = jax_profiler._profile_state.profile_session
        return held is not None and not isinstance(held, _HeldByOmniprof)
    except (ImportError, AttributeError):  # pragma: no cover - jax internals moved
        return False


class _HeldByOmniprof:
    """Stands in jax's own profile state while our session runs: XLA runs one profiler session per
    process, and without this ``jax.profiler.start_trace`` would start a second one that fails
    only at its end (``ALREADY_EXISTS``). With it, jax refuses at once ("Profile has already been
    started"), and ``jax.profiler.stop_trace`` says who holds the session."""

    def stop_and_export(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("omniprof's xla backend holds XLA's profiler session in this process (one session per "
                           "process); jax.profiler.start_trace/stop_trace cannot run inside an omniprof.Profiler"
                           "(backend='xla') session: use omniprof.annotate for ranges, or stop the Profiler first")

    stop = stop_and_export

    def __repr__(self) -> str:
        return "<XLA profiler session held by omniprof's xla backend>"


def _guard_jax_trace(on: bool) -> None:
    try:
        from jax._src import profiler as jax_profiler

        state = jax_profiler._profile_state
    except (ImportError, AttributeError):  # pragma: no cover - jax internals moved
        return
    with state.lock:
        if on and state.profile_session is None:
            state.profile_session = _HeldByOmniprof()
        elif not on and isinstance(state.profile_session, _HeldByOmniprof):
            state.profile_session = None


def _scalar(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _devices(jax_module: Any) -> list[dict[str, Any]]:
    out = []
    for d in jax_module.devices():
        out.append({"id": int(d.id), "platform": str(d.platform), "kind": str(getattr(d, "device_kind", ""))})
    return out
