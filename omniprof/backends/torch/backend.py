"""Backend ``torch``: ``torch.profiler.profile`` (Kineto) behind omniprof's one API.

Levels (``docs/backends/torch.md`` has the full table):
    * ``host_tracer_level`` 0: no host activity; 1: user annotations and step markers only (Kineto
      is told to keep ``USER_ANNOTATION`` activity alone); 2 (default): every CPU op, annotation and
      CUDA runtime call; 3: as 2, and shapes, FLOPs, module hierarchy and memory events are
      recorded unless their option says otherwise.
    * ``device_tracer_level`` 1: CUDA (or XPU / MTIA / PrivateUse1) activity when torch sees such a
      device; on a machine without one the backend warns and records host activity only.
    * ``python_tracer_level`` 1: Python call stacks (torch's ``with_stack``).

Steps: each omniprof session builds one ``torch.profiler.profile`` whose schedule the backend
drives, so ``Profiler.step()`` calls torch's own ``prof.step()`` and the trace carries torch's
``ProfilerStep#N`` markers, numbered like omniprof's steps (from the start with an omniprof
schedule, else from the first ``step()``). WARMUP runs torch's ``prepare_trace``.

Quiet: Kineto prints to the process's stderr from C++ (``USDT:``/``STAGE:``/``INFO:`` lines, c10
warnings). Unless ``verbose``, the backend sets ``KINETO_LOG_LEVEL`` before torch's profiler is first
used and captures file descriptor 2 around torch's start/stop calls: Kineto's lines go to the part's
``metadata["native_log"]``, anything else is written back to stderr unchanged.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import socket
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from omniprof.plugin import Backend, Capability
from omniprof.core import validators as v
from omniprof.core.annotations import user_args
from omniprof.core.collectives import Collectives
from omniprof.core.clock import time_ns, wall_time
from omniprof.core.results import Artifact, BackendResult, ClockInfo, CounterSeries, Loss, Track
from omniprof.errors import BackendOptionWarning, BackendUnavailableError, DataLossWarning

__all__ = ["TorchBackend", "TorchOptions"]


def _opt_bool(inst: Any, attribute: Any, value: Any) -> None:
    if value is not None:
        v.is_bool(inst, attribute, value)


@attrs.frozen(kw_only=True)
class TorchOptions:
    """Options of the ``torch`` backend. ``None`` means "follow the tracer levels".

    Attributes:
        record_shapes: input shapes and dtypes of ops (torch ``record_shapes``); default on at
            ``host_tracer_level`` 3.
        record_memory: allocation events and memory per op (torch ``profile_memory``); default on at
            ``host_tracer_level`` 3.
        record_stacks: Python stacks (torch ``with_stack``); default on at ``python_tracer_level`` 1.
        record_flops: FLOPs of matmul/conv ops (torch ``with_flops``); default on at
            ``host_tracer_level`` 3.
        record_modules: ``nn.Module`` hierarchy (torch ``with_modules``); default on at
            ``host_tracer_level`` 3.
        keep_trace: with a logdir, keep torch's Kineto JSON in the session directory
            (``<host>_<pid>.<ms>.pt.trace.json``) and list it as an artifact.
    """

    record_shapes: bool | None = attrs.field(default=None, validator=_opt_bool)
    record_memory: bool | None = attrs.field(default=None, validator=_opt_bool)
    record_stacks: bool | None = attrs.field(default=None, validator=_opt_bool)
    record_flops: bool | None = attrs.field(default=None, validator=_opt_bool)
    record_modules: bool | None = attrs.field(default=None, validator=_opt_bool)
    keep_trace: bool = attrs.field(default=True, validator=v.is_bool)


# Kineto's own log lines ("USDT:2026-...", "STAGE:...", "INFO:...") and c10 log lines ("[W1121 ...").
_NATIVE_LINE = re.compile(r"^(?:[A-Z]+:\d{4}-\d\d-\d\d |\[[WIEF]\d{4} |\s+(?:Log file|Trace |Warmup|Max GPU|Enabled ))")
_NATIVE_ERROR = re.compile(r"^(?:ERROR:|\[[EF]\d{4} )")
_HOST_KEEP_LEVEL1 = frozenset({"annotation", "step"})
_DEVICE_CATEGORIES = frozenset({"kernel", "memcpy", "memset", "sync", "gpu_annotation"})


def _warn(message: str, category: type[Warning] = BackendOptionWarning) -> None:
    """Warn, attributed to the first caller outside omniprof (the user's line that started profiling)."""
    frame = sys._getframe(1)
    level = 2  # stacklevel 1 is this function, 2 its caller
    while frame is not None and frame.f_globals.get("__name__", "").startswith("omniprof."):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


def _set_quiet_env() -> None:
    # KINETO_LOG_LEVEL is read by libkineto when the profiler first initialises; 4 keeps only errors
    # (USDT lines are printed whatever the level, hence the fd capture below). TORCH_CPP_LOG_LEVEL is
    # read once, when torch is imported: it helps only if this backend is torch's first importer
    # (``omniprof run -b torch script.py``), and then hides c10's profiler warnings such as
    # "Memory block of unknown size was allocated before the profiling started".
    os.environ.setdefault("KINETO_LOG_LEVEL", "4")
    if "torch" not in sys.modules:
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


@contextlib.contextmanager
def _capture_native_stderr(sink: list[str], enabled: bool) -> Iterator[None]:
    """Route fd 2 to a temporary file while torch starts/stops; keep Kineto's lines in ``sink``."""
    if not enabled:
        yield
        return
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    tmp = tempfile.TemporaryFile()
    try:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
    finally:
        os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode("utf-8", "replace")
        tmp.close()
        passthrough = []
        for line in text.splitlines():
            if not line.strip():
                continue
            if _NATIVE_LINE.match(line):
                sink.append(line)
                if _NATIVE_ERROR.match(line):
                    passthrough.append(line)
            else:
                passthrough.append(line)
        if passthrough:
            with contextlib.suppress(OSError):
                os.write(2, ("\n".join(passthrough) + "\n").encode("utf-8", "replace"))


def _device_activities(torch: Any, ProfilerActivity: Any, supported: Any) -> tuple[list[Any], list[str]]:
    """Device activities torch supports here (``supported``) and has a device for."""
    acts, names = [], []
    checks = (("CUDA", lambda: torch.cuda.is_available()),
              ("XPU", lambda: hasattr(torch, "xpu") and torch.xpu.is_available()),
              ("MTIA", lambda: hasattr(torch, "mtia") and torch.mtia.is_available()),
              ("PrivateUse1", lambda: False))
    for name, available in checks:
        act = getattr(ProfilerActivity, name.upper(), None) or getattr(ProfilerActivity, name, None)
        if act is None or act not in supported:
            continue
        try:
            ok = bool(available())
        except Exception:  # a broken accelerator runtime means "not available", never a crash here
            ok = False
        if ok:
            acts.append(act)
            names.append(name)
    return acts, names


def _memory_by_category(prof: Any, base_ns: int, devices: list[str]) -> tuple[list[Any], list[Any], dict[str, int]] | str:
    """torch's own memory timeline by category (parameter, optimizer_state, input, temporary,
    activation, gradient, autograd_detail, unknown: ``torch.profiler._memory_profiler``, what
    ``export_memory_timeline`` plots) as one counter series per category and device, on Kineto's
    clock. Needs shapes, stacks and memory recorded. Returns a note saying why when torch cannot."""
    try:
        from torch.profiler import _memory_profiler as mp

        timeline = mp.MemoryProfileTimeline(prof._memory_profile())
        names = ["unknown" if c is None else c.name.lower() for c in mp._CATEGORY_TO_INDEX]
    except Exception as e:  # private torch API: a torch without it, or one that changed, is a note, not a failure
        return f"torch's memory profiler gave no timeline by category ({type(e).__name__}: {e})"
    tracks: list[Any] = []
    counters: list[Any] = []
    peaks: dict[str, int] = {}
    for device in devices:
        try:
            times_us, sizes = timeline._coalesce_timeline(device)
        except Exception:
            continue
        if not times_us:
            continue
        t_ns = [int(t) * 1000 - base_ns for t in times_us]  # Unix microseconds -> Kineto's clock
        track = f"counter:memory_by_category:{device}"
        tracks.append(Track(id=track, name=f"memory by category ({device})", kind="counter"))
        for i, name in enumerate(names):
            values = [float(row[i + 1]) for row in sizes]  # row[0] is a spacer column in torch's layout
            if any(values):
                counters.append(CounterSeries(f"memory {name} ({device})", "bytes", track, t_ns, values))
                peaks[f"peak_{name}_{device.replace(':', '')}_bytes"] = int(max(values))
    return tracks, counters, peaks


class TorchBackend(Backend):
    """``torch.profiler`` (Kineto): CPU ops, CUDA kernels, memory, Python stacks (see module docs)."""

    name = "torch"
    summary = "PyTorch profiler (Kineto): ops with shapes/FLOPs, CUDA kernels, memory, steps"
    single_session = True
    stop_any_thread = False  # Profiler.stop() from another thread segfaulted (issue 31 F3)
    Options = TorchOptions

    def __init__(self, options: TorchOptions | None = None, *, context: Any = None) -> None:
        super().__init__(options, context=context)
        self._prof: Any = None
        self._state = "idle"     # idle -> warmup -> record -> stopped
        self._action: Any = None
        self._step = 0
        self._native_log: list[str] = []
        self._settings: dict[str, Any] = {}
        self._keep: Any = None
        self._pair: tuple[int, int] = (0, 0)
        self._start_ns = 0
        self._notes: list[str] = []

    # -- lifecycle ---------------------------------------------------------------------------------
    @classmethod
    def environment(cls, *, frameworks: bool = True) -> list[tuple[str, str]]:
        """torch: with ``frameworks``, imported (its build and whether CUDA is available), else its installed version."""
        from omniprof.core.doctor import dist_version

        if not frameworks:
            return [("torch", dist_version("torch"))]
        try:
            _set_quiet_env()
            import torch

            cuda = torch.version.cuda
            hip = getattr(torch.version, "hip", None)
            build = f"CUDA {cuda}" if cuda else (f"ROCm {hip}" if hip else "CPU-only")
            return [("torch", f"{torch.__version__} ({build} build), cuda available: {bool(torch.cuda.is_available())}")]
        except Exception as e:  # a broken install is a fact to report, not a crash
            return [("torch", f"unavailable ({type(e).__name__}: {e})")]

    @classmethod
    def capabilities(cls) -> list[Capability]:
        try:
            _set_quiet_env()
            import torch
            from torch.autograd import kineto_available
        except Exception as e:  # not installed, or a broken install: say which
            why = f"torch cannot be imported ({type(e).__name__}: {e}); pip install 'omniprof[torch]'"
            return [Capability("CPU operators", False, why), Capability("CUDA kernels", False, why)]
        kineto = bool(kineto_available())
        caps = [Capability("CPU operators (shapes, FLOPs, memory, Python stacks, steps)", True,
                           f"torch {torch.__version__}"),
                Capability("Kineto tracer (timeline, Perfetto/XProf export)", kineto,
                           "built in" if kineto else "this torch build has no Kineto: only the legacy "
                                                                 "autograd profiler (no device activity)")]
        cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
        gpu = torch.cuda.is_available()
        if gpu:
            names = ", ".join(f"{i}: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count()))
            detail = f"{'ROCm ' + str(hip) if hip else 'CUDA ' + str(cuda)} build; {names}"
        elif cuda or hip:
            detail = (f"{'ROCm' if hip else 'CUDA'} build of torch, but no GPU is visible "
                      f"(torch.cuda.is_available() is False): check the driver, CUDA_VISIBLE_DEVICES")
        else:
            detail = ("CPU-only torch build: install a CUDA build of torch (see pytorch.org) to record kernels; "
                      "device_tracer_level=0 skips device activity without a warning")
        caps.append(Capability("GPU kernels, memcpy and memory (Kineto over CUPTI/roctracer)", gpu, detail))
        return caps

    @classmethod
    def job_collectives(cls) -> Collectives | None:
        """The torch.distributed process group of this process, for ``Profiler(distributed=True)``; None without one."""
        from omniprof.backends.torch.collectives import TorchCollectives, job_running

        return TorchCollectives() if job_running() else None

    @classmethod
    def probe(cls) -> None:
        if importlib.util.find_spec("torch") is None:
            raise BackendUnavailableError("PyTorch is not installed", "Install it with: pip install 'omniprof[torch]'",
                                          plugin=cls.name)

    def _quiet(self) -> Any:
        return _capture_native_stderr(self._native_log, not self.context.verbose)

    def _current_step(self) -> int:
        fn = self.context.step_num
        try:
            return int(fn()) if fn is not None else self._step
        except Exception:
            return self._step

    def prepare(self) -> None:
        if self._state != "idle":
            return
        if not self.context.verbose:
            _set_quiet_env()
        import torch
        from torch.autograd import kineto_available
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        if not kineto_available():
            raise BackendUnavailableError("this PyTorch build has no Kineto profiler",
                                          "install an official PyTorch wheel", plugin=self.name)
        po = self.context.profile_options
        opts = self.options
        host, device, python = po.host_tracer_level, po.device_tracer_level, po.python_tracer_level
        activities: list[Any] = []
        device_names: list[str] = []
        if host >= 2:
            activities.append(ProfilerActivity.CPU)
        elif host == 1:
            activities.append({ProfilerActivity.CPU: ["USER_ANNOTATION"]})
        if device:
            from torch.profiler import supported_activities

            dev_acts, device_names = _device_activities(torch, ProfilerActivity, supported_activities())
            activities += dev_acts
            if not device_names and po.is_explicit("device_tracer_level"):
                # Only a device asked for explicitly is worth a warning: by default a CPU-only
                # machine quietly records host activity (the result's metadata says so).
                _warn(
                    "backend 'torch': device_tracer_level=1 but torch sees no CUDA, XPU or MTIA device here; only "
                    "host activity is recorded. Set device_tracer_level=0 to say so and silence this warning")
        if po.advanced_configuration:
            _warn(f"backend 'torch' does not use advanced_configuration "
                  f"{', '.join(sorted(po.advanced_configuration))}: those keys configure the xla and cupti "
                  f"backends' tracers, and torch.profiler manages its own CUPTI buffers")
        level3 = host >= 3

        def pick(value: bool | None, default: bool) -> bool:
            return default if value is None else value

        settings = {
            "record_shapes": pick(opts.record_shapes, level3),
            "profile_memory": pick(opts.record_memory, level3),
            "with_stack": pick(opts.record_stacks, python >= 1),
            "with_flops": pick(opts.record_flops, level3),
            "with_modules": pick(opts.record_modules, level3),
        }
        if settings["with_flops"] and not settings["record_shapes"] and host >= 2:
            # torch needs shapes to count FLOPs; only an explicit record_shapes=False is worth a warning.
            if opts.record_shapes is False:
                _warn("backend 'torch': record_shapes=False cannot be honoured with FLOPs on: torch needs input "
                      "shapes to count FLOPs, so shapes are recorded. Set record_flops=False as well to drop them")
            settings["record_shapes"] = True
        if host < 2:
            # Shapes, memory, FLOPs, modules and Python frames hang off CPU ops, which levels 0-1 leave out.
            asked = [name for name in ("record_shapes", "record_memory", "record_flops", "record_modules",
                                       "record_stacks") if getattr(opts, name)]
            if python >= 1 and opts.record_stacks is None:
                asked.append("python_tracer_level=1")
            if asked:
                _warn(f"backend 'torch': {', '.join(asked)} need CPU ops, which host_tracer_level={host} does not "
                      f"record; they have no effect. Use host_tracer_level=2 or more")
            for k in settings:
                settings[k] = False
        if host == 1:
            self._keep = lambda cat: cat in _HOST_KEEP_LEVEL1 or cat in _DEVICE_CATEGORIES
        self._settings = {**settings, "activities": [a if isinstance(a, str) else str(a) for a in activities],
                          "devices": device_names}
        if not activities:
            _warn(f"backend 'torch': host_tracer_level={host} and no device activity: nothing will be recorded")
            self._state = "warmup"
            return
        self._action = ProfilerAction.WARMUP
        prof = profile(activities=activities, schedule=self._schedule, acc_events=False, **settings)
        prof.step_num = self._current_step()
        # torch records ProfilerStep#N markers when given a schedule; we always give it ours (to drive
        # its transitions), so say when markers are wanted: with an omniprof schedule, or once the
        # workload calls step(). A plain session then costs exactly what plain torch.profiler costs.
        prof.record_steps = False
        with self._quiet():
            prof.start()  # NONE -> WARMUP: torch's prepare_trace
        self._prof = prof
        self._state = "warmup"

    def _schedule(self, step: int) -> Any:
        # torch asks its schedule what to do at each prof.step(); omniprof's schedule has decided.
        return self._action

    def start(self) -> None:
        if self._state == "idle":
            self.prepare()
        self._pair = self._clock_pair()
        self._start_ns = self._pair[0]
        self._state = "record"
        if self._prof is None:
            return
        from torch.profiler import ProfilerAction

        k = self._current_step()
        self._action = ProfilerAction.RECORD
        self._prof.record_steps = self.context.scheduled or k > 0
        self._prof.step_num = k - 1
        with self._quiet():
            self._prof.step()  # WARMUP -> RECORD: start_trace; opens ProfilerStep#k
        self._step = k

    def step(self, step_num: int) -> None:
        if self._prof is None or self._state != "record" or step_num == self._step:
            return
        self._prof.record_steps = True
        self._prof.step_num = step_num - 1
        self._prof.step()  # RECORD -> RECORD: closes ProfilerStep#(n-1), opens ProfilerStep#n
        self._step = step_num

    def stop(self) -> BackendResult:
        return self._build(self._halt())

    def stop_deferred(self) -> Any:
        """Stop torch's profiler now (what plain ``torch.profiler`` does at a window's end) and leave saving
        and reading the trace to the returned function, which the Profiler calls off the training loop."""
        state = self._halt()
        return lambda: self._build(state)

    def _halt(self) -> dict[str, Any]:
        """End recording: torch's own ``stop_trace``, and nothing more."""
        end_pair = self._clock_pair()
        if self._state != "record":
            raise RuntimeError(f"backend 'torch' stop() called in state {self._state!r}; call start() first")
        self._state = "stopped"
        prof, self._prof = self._prof, None
        state: dict[str, Any] = {"end_pair": end_pair, "prof": prof, "stopped_early": False}
        if prof is None:
            return state
        import torch

        with self._quiet():
            prof.stop()  # closes the step marker; RECORD -> None: torch's stop_trace
        with contextlib.suppress(Exception):
            from torch.autograd.profiler import KinetoStepTracker
            KinetoStepTracker.erase_step_count("ProfilerStep")
        state["stopped_early"] = bool(self._settings.get("devices")) and bool(torch.autograd._is_kineto_stopped())
        return state

    def _build(self, state: dict[str, Any]) -> BackendResult:
        """Save torch's recording as Kineto JSON and read it into a result (the costly part)."""
        meta: dict[str, Any] = {"levels": self.context.profile_options.to_dict(), "torch_options": self._settings}
        prof = state["prof"]
        if prof is None:
            return BackendResult(backend=self.name, clock=ClockInfo(name=self.clock.name), start_ns=self._start_ns,
                                 end_ns=state["end_pair"][0], metadata={**meta, "recorded": False})
        import torch

        results = prof.profiler.kineto_results
        flops: dict[int, int] = {}
        if self._settings.get("with_flops"):
            for e in results.events():
                f = e.flops()
                if f:
                    flops[e.external_id()] = f
        losses: list[Loss] = []
        if state["stopped_early"]:
            losses.append(Loss(self.name, "buffer_full", 1, "sessions",
                               "Kineto stopped device activity collection early (CUPTI buffer full); "
                               "device events after that point are missing"))
            _warn("backend 'torch': Kineto stopped collecting device activity early (buffer full); the "
                  "result says so in its losses", DataLossWarning)
        path, keep = self._trace_path()
        from omniprof.analysis.torch_ops import with_tables
        from omniprof.formats import kineto

        try:
            with self._quiet():
                results.save(str(path) + ".tmp")
            os.replace(str(path) + ".tmp", path)
            artifacts = [Artifact("kineto", str(path), "torch.profiler Kineto trace")] if keep else []
            with open(path, encoding="utf-8") as fh:
                part, top = kineto.parse_trace(fh, str(path), source=self.name, flops=flops, keep=self._keep,
                                               artifacts=artifacts)
            part = with_tables(part)  # the op table, by the one nesting rule (analysis.nesting)
        finally:
            if not keep:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            with contextlib.suppress(OSError):
                os.unlink(str(path) + ".tmp")
        # Kineto time t (ns) + baseTimeNanoseconds is Unix time; the pair maps Unix time to our clock.
        base = part.metadata.get("kineto_base_time_ns", 0)
        ref0, unix0 = self._pair
        offset = int(base) + ref0 - unix0
        meta.update(part.metadata)
        with contextlib.suppress(Exception):
            meta["kineto_trace_start_unix_ns"] = int(results.trace_start_ns())
        meta.update({"recorded": True, "torch_version": torch.__version__,
                     "clock_note": "Kineto's clock (Unix ns minus baseTimeNanoseconds); offset_ns maps it onto the "
                                   "run's reference clock from a (reference, time.time_ns) pair taken at start"})
        if self._native_log:
            meta["native_log"] = list(self._native_log)
        tracks, counters, summaries = part.tracks, part.counters, dict(part.summaries)
        if self._settings.get("profile_memory") and self._settings.get("record_shapes") and \
                self._settings.get("with_stack"):
            got = _memory_by_category(prof, int(base), ["cpu"] + [f"cuda:{d.get('id', i)}" for i, d in enumerate(
                part.metadata.get("devices", ())) if isinstance(d, dict)])
            if isinstance(got, str):
                meta["memory_by_category_note"] = got
            else:
                new_tracks, new_counters, peaks = got
                tracks, counters = tracks + tuple(new_tracks), counters + tuple(new_counters)
                if peaks:
                    summaries["memory_by_category"] = peaks
        return attrs.evolve(part, clock=ClockInfo(name="kineto", offset_ns=offset), losses=part.losses + tuple(losses),
                            metadata=meta, tracks=tracks, counters=counters, summaries=summaries)

    def close(self) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            with self._quiet(), contextlib.suppress(Exception):
                prof.stop()
            with contextlib.suppress(Exception):
                from torch.autograd.profiler import KinetoStepTracker
                KinetoStepTracker.erase_step_count("ProfilerStep")
        if self._state != "idle":
            self._state = "stopped"

    # -- hooks -------------------------------------------------------------------------------------
    def annotation(self, name: str, args: dict[str, Any] | None = None) -> Any:
        if self._prof is None or self._state != "record" or self.context.profile_options.host_tracer_level < 1:
            return None
        from torch.profiler import record_function

        args = user_args(args)
        text = json.dumps(args, default=str, sort_keys=True) if args else None
        return record_function(name, text)

    # -- helpers -----------------------------------------------------------------------------------
    def _clock_pair(self) -> tuple[int, int]:
        """(reference clock, Unix ns) read back to back; the tightest of three tries."""
        pairs = []
        for _ in range(3):
            a = self.clock.now_ns()
            u = time_ns()
            b = self.clock.now_ns()
            pairs.append((b - a, (a + b) // 2, u))
        _, ref, unix = min(pairs)
        return ref, unix

    def _trace_path(self) -> tuple[Path, bool]:
        sd = self.context.session_dir
        if sd is not None and self.options.keep_trace:
            host = socket.gethostname() or "localhost"
            return Path(sd) / f"{host}_{os.getpid()}.{int(wall_time() * 1000)}.pt.trace.json", True
        fd, name = tempfile.mkstemp(prefix="omniprof-kineto-", suffix=".pt.trace.json")
        os.close(fd)
        return Path(name), False
