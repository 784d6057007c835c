"""Backend ``cupti``: NVIDIA GPU metrics (NVML) and GPU activity (CUPTI) on one timeline.

Levels (``ProfileOptions``):
    * ``device_tracer_level`` 0: no CUPTI at all -- NVML metrics only (sampled from the host, they
      are monitoring, not tracing). 1 (default): CUPTI activity as the ``record_*`` options say
      (kernels, memcpy, memset, synchronisation), plus PM sampling when
      ``gpu_pm_sample_counters`` is set.
    * ``host_tracer_level`` 0: nothing on host threads. 1: ``omniprof.annotate`` ranges and steps,
      and NVTX ranges when ``gpu_enable_nvtx_tracking`` is set. 2 (default): plus every CUDA
      runtime API call (cudaLaunchKernel, cudaMemcpyAsync, ...) with a flow to the GPU work it
      started. 3: plus CUDA driver API calls.
    * ``python_tracer_level`` 1 is not supported: a ``BackendOptionWarning`` says so.

Times: CUPTI timestamps are mapped onto the run's reference clock by two (reference, CUPTI)
clock readings, at start and stop, interpolated linearly; the part's clock offset is 0.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import attrs

from omniprof.plugin import Backend
from omniprof.backends.cupti import diagnostics
from omniprof.backends.cupti.activity import ActivityCollector, build_timeline
from omniprof.backends.cupti.cupti_adapter import (
    ERROR_INSUFFICIENT_PRIVILEGES,
    ERROR_MULTIPLE_SUBSCRIBERS,
    ERROR_NOT_COMPATIBLE,
    ERROR_NOT_SUPPORTED,
    ERROR_VIRTUALIZED_INSUFFICIENT_PRIVILEGES,
    CuptiCallError,
    CuptiLoadError,
)
from omniprof.backends.cupti.nvml import NVML_METRICS, NvmlCallError, NvmlSampler
from omniprof.core import validators as v
from omniprof.core.annotations import user_args
from omniprof.formats.kernels import add_kernel_stats
from omniprof.core.results import (
    BackendResult,
    ClockInfo,
    CounterSeries,
    Loss,
    Span,
    Track,
)
from omniprof.errors import (
    BackendError,
    BackendOptionWarning,
    BackendUnavailableError,
    DataLossWarning,
    InvalidArgumentError,
)

__all__ = ["CuptiBackend", "CuptiOptions", "GpuAdapters", "clock_map"]


def _tuple_or_none(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _metrics_validator(inst: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, tuple) or not value:
        raise InvalidArgumentError(
            f"'nvml_metrics' must be a non-empty list of metric names from {', '.join(NVML_METRICS)} (got {value!r})")
    for m in value:
        if m not in NVML_METRICS:
            near = v.nearest(str(m), NVML_METRICS)
            raise InvalidArgumentError(f"'nvml_metrics' has unknown metric {m!r}"
                                       + (f"; did you mean {near!r}?" if near else "")
                                       + f" Valid metrics: {', '.join(NVML_METRICS)}")


def _devices_validator(inst: Any, attribute: Any, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, tuple) or not value or any(
            not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in value) or len(set(value)) != len(value):
        raise InvalidArgumentError(
            f"'devices' must be null (all GPUs) or a non-empty list of distinct GPU indices >= 0 (got {value!r})")


@attrs.frozen(kw_only=True)
class CuptiOptions:
    """Options of the ``cupti`` backend.

    Attributes:
        record_nvml: sample NVML device metrics (default True).
        record_activity: use CUPTI at all (default True). False: NVML metrics only, without touching
            CUPTI -- e.g. beside ``torch.profiler``, which holds the process's one CUPTI subscriber.
        nvml_interval_s: time between NVML readings (default 0.01: 100 Hz).
        nvml_metrics: which NVML metrics (default: all of ``NVML_METRICS``).
        max_nvml_samples: readings kept per device; later ones are counted as lost.
        record_kernels: CUPTI kernel records (default True).
        record_memcpy, record_memset: memory copy / memset records (default True).
        record_sync: synchronisation records (cudaStreamSynchronize, ...) (default True).
        record_overhead: CUPTI's records of its own overhead, summed in the ``overhead`` summary.
        devices: GPU indices to profile (None: all, or the first ``gpu_num_chips_to_profile_per_task``).
        activity_buffer_bytes: size of each host buffer CUPTI fills with records (default 8 MiB).
        device_buffer_bytes: CUPTI's per-context device buffer for kernel/memcpy records (None: CUPTI's default).
        flush_period_ms: let CUPTI's worker deliver records every this many ms (0: only at stop).
        pm_poll_interval_s: how often PM sampling data is decoded off the GPU during a session.
    """

    record_nvml: bool = attrs.field(default=True, validator=v.is_bool)
    record_activity: bool = attrs.field(default=True, validator=v.is_bool)
    nvml_interval_s: float = attrs.field(default=0.01, validator=v.number_in_range(0.0, 60.0, lo_open=True))
    nvml_metrics: tuple[str, ...] = attrs.field(default=tuple(NVML_METRICS), converter=_tuple_or_none,
                                                validator=_metrics_validator)
    max_nvml_samples: int = attrs.field(default=1_000_000, validator=v.int_in_range(1, 2**31 - 1))
    record_kernels: bool = attrs.field(default=True, validator=v.is_bool)
    record_memcpy: bool = attrs.field(default=True, validator=v.is_bool)
    record_memset: bool = attrs.field(default=True, validator=v.is_bool)
    record_sync: bool = attrs.field(default=True, validator=v.is_bool)
    record_overhead: bool = attrs.field(default=True, validator=v.is_bool)
    devices: tuple[int, ...] | None = attrs.field(default=None, converter=_tuple_or_none, validator=_devices_validator)
    activity_buffer_bytes: int = attrs.field(default=8 * 1024 * 1024, validator=v.int_in_range(1024, 1 << 30))
    device_buffer_bytes: int | None = attrs.field(default=None,
                                                  validator=v.int_in_range(1024, 1 << 32, optional=True))
    flush_period_ms: int = attrs.field(default=0, validator=v.int_in_range(0, 60_000))
    pm_poll_interval_s: float = attrs.field(default=0.1, validator=v.number_in_range(0.0, 60.0, lo_open=True))


# -- adapters: what the backend calls NVML, CUPTI and PM sampling through --
def _real_nvml() -> Any:
    from omniprof.backends.cupti.nvml import PynvmlAdapter

    return PynvmlAdapter()


def _real_cupti() -> Any:
    from omniprof.backends.cupti.cupti_adapter import CuptiPythonAdapter

    return CuptiPythonAdapter()


def _real_pm(device: int, metrics: list[str], interval_ns: int, buffer_bytes: int) -> Any:
    from omniprof.backends.cupti.cupti_adapter import CuptiPmSampler

    return CuptiPmSampler(device, metrics, interval_ns, buffer_bytes)


@attrs.frozen
class GpuAdapters:
    """The factories the ``cupti`` backend makes its NVML, CUPTI and PM-sampling adapters with.

    ``CuptiBackend.adapters`` holds the real ones (nvidia-ml-py and cupti-python). A subclass that
    sets other ones is another backend (``omniprof.testing.gpu_fakes.fake_cupti_backend``: fakes for
    machines without a GPU), registered like any plugin; an instance may also be given its own
    (``CuptiBackend(adapters=...)``). Nothing process-wide is replaced.

    Attributes:
        nvml: ``() -> adapter`` with the methods of :class:`~omniprof.backends.cupti.nvml.PynvmlAdapter`.
        cupti: ``() -> adapter`` with those of :class:`~omniprof.backends.cupti.cupti_adapter.CuptiPythonAdapter`.
        pm: ``(device, metrics, interval_ns, buffer_bytes) -> sampler`` as
            :class:`~omniprof.backends.cupti.cupti_adapter.CuptiPmSampler`.
    """

    nvml: Callable[[], Any] = _real_nvml
    cupti: Callable[[], Any] = _real_cupti
    pm: Callable[..., Any] = _real_pm


class CuptiBackend(Backend):
    """NVIDIA GPU backend: NVML device metrics and CUPTI activity (see the module docs)."""

    name = "cupti"
    summary = "NVIDIA GPU: NVML device metrics and CUPTI kernel/memcpy/sync activity, kernel statistics"
    single_session = True
    Options = CuptiOptions
    #: The adapters this backend class uses (the real ones; a subclass may set others).
    adapters: ClassVar[GpuAdapters] = GpuAdapters()

    @classmethod
    def capabilities(cls) -> list[Any]:
        return diagnostics.gpu_capabilities(cls.adapters.nvml, cls.adapters.cupti)

    @classmethod
    def environment(cls, *, frameworks: bool = True) -> list[tuple[str, str]]:
        """The NVIDIA Python packages this backend loads, and the variables that steer them."""
        import os

        from omniprof.core.doctor import dist_version

        facts = [("nvidia-ml-py", dist_version("nvidia-ml-py")), ("cupti-python", dist_version("cupti-python"))]
        if dist_version("pynvml") != "not installed":
            facts.append(("pynvml (deprecated shim)", dist_version("pynvml") + "; uninstall it: nvidia-ml-py "
                                                                               "provides the pynvml module"))
        facts += [(var, os.environ[var]) for var in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
                                                     "NVTX_INJECTION64_PATH") if os.environ.get(var)]
        return facts

    @classmethod
    def checks(cls) -> list[Any]:
        return diagnostics.gpu_checks(cls.adapters.nvml, cls.adapters.cupti)

    @classmethod
    def probe(cls) -> None:
        # NVML and a GPU are all a session needs (record_activity=false is NVML only); CUPTI's own
        # problems are raised, with their fix, by the session that needs CUPTI.
        checks = diagnostics.gpu_checks(cls.adapters.nvml, cls.adapters.cupti, stop_at_first=True,
                                        check_cupti=False)
        diagnostics.raise_first_failure(checks, plugin=cls.name)

    def __init__(self, options: CuptiOptions | None = None, *, context: Any = None,
                 adapters: GpuAdapters | None = None) -> None:
        super().__init__(options, context=context)
        if adapters is not None and not isinstance(adapters, GpuAdapters):
            raise InvalidArgumentError(f"'adapters' must be a GpuAdapters (got {type(adapters).__name__})")
        #: this session's adapters: ``adapters`` if given, else the class's
        self.adapters = adapters if adapters is not None else type(self).adapters  # type: ignore[misc]
        self._nvml: Any = None
        self._cupti: Any = None
        self._subscribed = False
        self._registered = False
        self._enabled: list[str] = []
        self._pm: dict[int, Any] = {}
        self._pm_data: dict[int, list[tuple[int, int, list[float]]]] = {}
        self._pm_overflow: dict[int, int] = {}
        self._pm_failed: dict[int, str] = {}
        self._pm_last_ns = 0
        self._sampler: NvmlSampler | None = None
        self._collector: ActivityCollector | None = None
        self._devices: list[int] = []
        self._device_info: list[dict[str, Any]] = []
        self._kinds: list[str] = []
        self._pm_metrics: list[str] = []
        self._annotations: list[tuple[str, int, int, int, dict[str, Any]]] = []
        self._steps: list[tuple[int, int]] = []
        self._sync_points: list[tuple[int, int, int]] = []
        self._versions: dict[str, str] = {}
        self._start_ns = 0
        self._prepared = False
        self._notes: list[str] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def prepare(self) -> None:
        po = self.context.profile_options
        opts = self.options
        if po.python_tracer_level:
            warnings.warn("backend 'cupti': python_tracer_level=1 (Python call tracing) is not supported; "
                          "use backend 'cpu' alongside for Python stacks", BackendOptionWarning, stacklevel=2)
        device_on = po.device_tracer_level >= 1 and opts.record_activity
        off_by = "device_tracer_level=0" if po.device_tracer_level < 1 else "record_activity=false"
        adv = po.advanced
        self._pm_metrics = [m.strip() for m in str(adv("gpu_pm_sample_counters")).split(",") if m.strip()]
        if not device_on:
            ignored = [k for k in ("gpu_pm_sample_counters", "gpu_enable_nvtx_tracking",
                                   "gpu_enable_cupti_activity_graph_trace", "gpu_dump_graph_node_mapping")
                       if po.advanced_configuration.get(k)]
            if ignored:
                warnings.warn(f"backend 'cupti': {off_by} turns CUPTI off, so {', '.join(ignored)} "
                              f"has no effect (only NVML metrics are recorded)", BackendOptionWarning, stacklevel=2)
            self._pm_metrics = []
        kinds: list[str] = []
        if device_on:
            for flag, kind in ((opts.record_kernels, "kernel"), (opts.record_memcpy, "memcpy"),
                               (opts.record_memset, "memset"), (opts.record_sync, "sync")):
                if flag:
                    kinds.append(kind)
            if adv("gpu_enable_cupti_activity_graph_trace"):
                kinds.append("graph")
            if po.host_tracer_level >= 2:
                kinds.append("runtime")
            if po.host_tracer_level >= 3:
                kinds.append("driver")
            if adv("gpu_enable_nvtx_tracking"):
                if po.host_tracer_level >= 1:
                    kinds.append("marker")
                    if not os.environ.get("NVTX_INJECTION64_PATH"):
                        warnings.warn("backend 'cupti': gpu_enable_nvtx_tracking needs NVTX to be injected into "
                                      "CUPTI: " + diagnostics.nvtx_injection_hint() + "; without it no NVTX range "
                                      "is recorded", BackendOptionWarning, stacklevel=2)
                else:
                    warnings.warn("backend 'cupti': gpu_enable_nvtx_tracking needs host_tracer_level >= 1 "
                                  "(NVTX ranges are host annotations); none are recorded",
                                  BackendOptionWarning, stacklevel=2)
            if "kernel" in kinds:
                kinds.append("device")  # device limits, for occupancy
            if opts.record_overhead and kinds:
                kinds.append("overhead")
        if adv("gpu_dump_graph_node_mapping") and "kernel" not in kinds and "memcpy" not in kinds:
            warnings.warn("backend 'cupti': gpu_dump_graph_node_mapping adds graph ids to kernel and memcpy "
                          "records, but none are recorded (record_kernels/record_memcpy off, "
                          "record_activity=false or device_tracer_level=0)", BackendOptionWarning, stacklevel=2)
        self._kinds = kinds
        try:
            self._open_nvml()
            self._check_pm_support()
            if kinds or self._pm_metrics:
                self._open_cupti()
        except BaseException:
            self.close()  # the Profiler only closes backends that prepared: release NVML and CUPTI here
            raise
        self._prepared = True

    def _open_nvml(self) -> None:
        nvml = self.adapters.nvml()
        try:
            nvml.init()
        except NvmlCallError as e:
            reason, hint = diagnostics.explain_nvml(e)
            raise BackendUnavailableError(reason, hint, plugin=self.name) from e
        self._nvml = nvml
        try:
            self._versions.update(nvml.versions())
            count = nvml.device_count()
            wanted = list(self.options.devices) if self.options.devices is not None else list(range(count))
            bad = [d for d in wanted if d >= count]
            if bad:
                raise InvalidArgumentError(
                    f"backend 'cupti': 'devices' names GPU index(es) {bad}, but this machine has {count} GPU(s) "
                    f"(indices 0..{count - 1})")
            n = self.context.profile_options.advanced("gpu_num_chips_to_profile_per_task")
            if n and n > 0:
                wanted = wanted[:n]
            self._devices = wanted
            self._device_info = [dict(nvml.device(d)) for d in wanted]
        except NvmlCallError as e:
            self.close()
            reason, hint = diagnostics.explain_nvml(e)
            raise BackendUnavailableError(reason, hint, plugin=self.name) from e

    def _check_pm_support(self) -> None:
        """PM sampling runs on the GPU time-interval trigger, which GA100 and Turing lack: say so up front."""
        if not self._pm_metrics:
            return
        why_not = diagnostics.pm_trigger_unsupported(self._device_info)
        if why_not:
            raise InvalidArgumentError(
                f"backend 'cupti': gpu_pm_sample_counters cannot be sampled on {why_not}. Leave "
                f"gpu_pm_sample_counters empty, or choose other GPUs with 'devices' / gpu_num_chips_to_profile_per_task")

    def _open_cupti(self) -> None:
        cupti = self.adapters.cupti()
        self._cupti = cupti
        try:
            cupti.load()
            self._versions.update(cupti.versions())
            cupti.subscribe()
            self._subscribed = True
            try:
                cupti.use_system_thread_ids()
            except CuptiCallError as e:
                self._notes.append(f"CUPTI kept its default thread ids ({e.name}): CUDA API calls may not line up "
                                   f"with Python threads")
        except (CuptiLoadError, CuptiCallError) as e:
            self.close()
            reason, hint = diagnostics.explain_cupti(e)
            raise BackendUnavailableError(reason, hint + diagnostics.NVML_ONLY_HINT, plugin=self.name) from e
        adv = self.context.profile_options.advanced
        n = adv("gpu_num_chips_to_profile_per_task")
        self._collector = ActivityCollector(
            max_activity_events=adv("gpu_max_activity_api_events"), max_api_events=adv("gpu_max_callback_api_events"),
            max_annotation_strings=adv("gpu_max_annotation_strings"),
            devices=self._devices if (self.options.devices is not None or (n and n > 0)) else None,
            kinds=self._kinds)
        if self._kinds:
            try:
                cupti.register(self._collector.add, self.options.activity_buffer_bytes)
                self._registered = True
                if self.options.device_buffer_bytes is not None:
                    cupti.set_device_buffer_bytes(self.options.device_buffer_bytes)
            except CuptiCallError as e:
                self.close()
                raise BackendError(f"backend 'cupti': registering CUPTI activity buffers failed: {e}",
                                   plugin=self.name) from e

    def start(self) -> None:
        if not self._prepared:
            self.prepare()
        self._start_ns = self.clock.now_ns()
        if self._cupti is not None:
            self._sync_points.append(self._sync_point())
            try:
                for kind in self._kinds:
                    self._enable(kind)
                if self.options.flush_period_ms and self._kinds:
                    self._cupti.flush_period(self.options.flush_period_ms)
                self._start_pm()
            except BaseException:
                self._disable_all()
                raise
        self._sampler = self._make_sampler()
        self._sampler.start()

    def _enable(self, kind: str) -> None:
        try:
            self._cupti.enable(kind)
        except CuptiCallError as e:
            if kind in ("device", "overhead") and e.status in (ERROR_NOT_SUPPORTED, ERROR_NOT_COMPATIBLE):
                self._notes.append(f"CUPTI activity kind {kind!r} not available here ({e.name}); "
                                   + ("occupancy is not computed" if kind == "device" else "CUPTI overhead not shown"))
                return
            if kind == "graph" and e.status in (ERROR_NOT_SUPPORTED, ERROR_NOT_COMPATIBLE):
                raise InvalidArgumentError(
                    f"backend 'cupti': gpu_enable_cupti_activity_graph_trace=True was refused by CUPTI ({e.name}): "
                    f"graph-level tracing cannot be combined with per-kernel records on this CUPTI; set "
                    f"record_kernels=false to trace CUDA graphs as a whole, or turn the option off") from e
            reason, hint = diagnostics.explain_cupti(e)
            if e.status in (ERROR_INSUFFICIENT_PRIVILEGES, ERROR_MULTIPLE_SUBSCRIBERS,
                            ERROR_VIRTUALIZED_INSUFFICIENT_PRIVILEGES) or e.status in diagnostics.DEVICE_HINTS:
                raise BackendUnavailableError(reason, hint + diagnostics.NVML_ONLY_HINT, plugin=self.name) from e
            raise BackendError(f"backend 'cupti': enabling CUPTI {kind} records failed: {e}", plugin=self.name) from e
        self._enabled.append(kind)
        if kind == "graph":
            with contextlib.suppress(CuptiCallError, AttributeError):
                self._cupti.enable_device_graph(True)

    def _start_pm(self) -> None:
        if not self._pm_metrics:
            return
        adv = self.context.profile_options.advanced
        interval_ns = int(adv("gpu_pm_sample_interval_us")) * 1000
        buffer_bytes = int(adv("gpu_pm_sample_buffer_size_per_gpu_mb")) * 1024 * 1024
        for d in self._devices:
            pm = self.adapters.pm(d, list(self._pm_metrics), interval_ns, buffer_bytes)
            try:
                pm.start()
            except (CuptiCallError, CuptiLoadError) as e:
                reason, hint = diagnostics.explain_cupti(e)
                raise BackendUnavailableError(f"PM sampling on GPU {d}: {reason}", hint, plugin=self.name) from e
            except ValueError as e:  # unsupported metric set / trigger mode (cupti.pm_sampling's words)
                raise InvalidArgumentError(
                    f"backend 'cupti': gpu_pm_sample_counters={','.join(self._pm_metrics)!r} cannot be sampled on "
                    f"GPU {d}: {e}") from e
            self._pm[d] = pm
            self._pm_data[d] = []

    def _poll_pm(self, now_ns: int, force: bool = False) -> None:
        if not self._pm:
            return
        if not force and now_ns - self._pm_last_ns < self.options.pm_poll_interval_s * 1e9:
            return
        self._pm_last_ns = now_ns
        for d, pm in list(self._pm.items()):
            if d in self._pm_failed:
                continue
            try:
                samples, overflow = pm.decode()
            except Exception as e:  # runs on the NVML thread: a failed decode must not stop NVML sampling
                self._pm_failed[d] = f"{type(e).__name__}: {e}"
                continue
            self._pm_data[d].extend(samples)
            if overflow:
                self._pm_overflow[d] = self._pm_overflow.get(d, 0) + 1

    def _make_sampler(self) -> NvmlSampler:
        opts = self.options
        devices = self._devices if opts.record_nvml else []
        sampler = NvmlSampler(self._nvml, devices, opts.nvml_metrics, opts.nvml_interval_s, self.clock,
                              max_samples=opts.max_nvml_samples)
        if self._pm:
            sampler.hooks.append(self._poll_pm)
        return sampler

    def _sync_point(self) -> tuple[int, int, int]:
        """(reference time, CUPTI time, uncertainty): the CUPTI reading bracketed by two reference readings."""
        a = self.clock.now_ns()
        c = self._cupti.timestamp_ns()
        b = self.clock.now_ns()
        return (a + b) // 2, c, (b - a + 1) // 2

    def _to_ref(self) -> Callable[[int], int]:
        return clock_map(self._sync_points)

    def _disable_all(self) -> list[str]:
        errors = []
        for kind in reversed(self._enabled):
            try:
                self._cupti.disable(kind)
            except CuptiCallError as e:
                errors.append(str(e))
        self._enabled = []
        return errors

    def stop(self) -> BackendResult:
        errors: list[str] = []
        if self._sampler is not None:
            self._sampler.stop()
        end_ns = self.clock.now_ns()
        collector = self._collector
        if self._cupti is not None:
            errors += self._disable_all()
            if self._registered:
                try:
                    self._cupti.flush()
                    collector.add_cupti_dropped(self._cupti.dropped_records())
                except CuptiCallError as e:
                    errors.append(str(e))
            for d, pm in list(self._pm.items()):
                try:
                    pm.stop()
                except CuptiCallError as e:
                    errors.append(f"PM sampling stop on GPU {d}: {e}")
            self._poll_pm(end_ns, force=True)
            self._sync_points.append(self._sync_point())
            errors += [f"CUPTI buffer callback: {m}" for m in getattr(self._cupti, "callback_errors", [])]
        return self._build(end_ns, errors)

    def _build(self, end_ns: int, errors: list[str]) -> BackendResult:
        po = self.context.profile_options
        tracks: list[Track] = []
        spans: list[Span] = []
        instants: list[Any] = []
        flows: list[Any] = []
        counters: list[CounterSeries] = []
        losses: list[Loss] = []
        facts: dict[str, Any] = {}
        sampler = self._sampler
        if sampler is not None and sampler.devices:
            tracks += sampler.tracks()
            counters += sampler.series()
            losses += sampler.losses()
        to_ref = self._to_ref()
        collector = self._collector
        if collector is not None:
            # CUPTI reports OS thread ids; host tracks are keyed by Python's thread ident
            threads = {t.native_id: (t.ident, t.name) for t in threading.enumerate()
                       if t.ident is not None and getattr(t, "native_id", None) is not None}
            t, s, i, f, facts = build_timeline(collector, to_ref, end_ns=end_ns,
                                               dump_graph_node_mapping=bool(po.advanced("gpu_dump_graph_node_mapping")),
                                               threads=threads)
            tracks += t
            spans += s
            instants += i
            flows += f
            losses += collector.losses()
        for d, samples in self._pm_data.items():
            track = f"device:{d}:pm"
            tracks.append(Track(track, f"GPU {d} (PM sampling)", "counter", f"GPU {d}", device=d))
            for j, metric in enumerate(self._pm_metrics):
                pts = [(to_ref(int(a)), float(vals[j])) for a, _b, vals in samples if j < len(vals)]
                if pts:
                    counters.append(CounterSeries(f"gpu{d}.pm.{metric}", "", track, [p[0] for p in pts],
                                                  [p[1] for p in pts]))
            if d in self._pm_failed:
                losses.append(Loss("cupti.pm", "decode_failed", 1, "devices",
                                   f"GPU {d}: PM sampling stopped when decoding failed ({self._pm_failed[d]}); "
                                   f"samples after that are missing"))
            if self._pm_overflow.get(d):
                losses.append(Loss("cupti.pm", "buffer_full", self._pm_overflow[d], "buffers",
                                   f"GPU {d}: the PM sampling hardware buffer overflowed; raise "
                                   f"gpu_pm_sample_buffer_size_per_gpu_mb or gpu_pm_sample_interval_us"))
        spans += self._host_spans(end_ns, tracks, collector)
        summary: dict[str, Any] = {}
        if sampler is not None:
            summary.update(sampler.summary())
        if collector is not None and collector.overhead_ns:
            summary["cupti_overhead_ns"] = sum(collector.overhead_ns.values())
            summary["cupti_overhead_pct"] = 100.0 * summary["cupti_overhead_ns"] / max(end_ns - self._start_ns, 1)
        metadata: dict[str, Any] = {
            "devices": self._device_info, "versions": self._versions, "record_kinds": list(self._kinds),
            "pm_sample_counters": list(self._pm_metrics),
            "device_tracer_level": po.device_tracer_level, "host_tracer_level": po.host_tracer_level,
        }
        if sampler is not None and sampler.unsupported:
            metadata["nvml_unsupported"] = {str(k): v for k, v in sampler.unsupported.items()}
        if collector is not None:
            metadata["record_counts"] = dict(collector.counts)
            metadata["filtered_records"] = collector.filtered
            metadata["cuda_devices"] = facts.get("devices", {})
            if facts.get("unclosed_nvtx_ranges"):
                metadata["unclosed_nvtx_ranges"] = facts["unclosed_nvtx_ranges"]
        if self._notes:
            metadata["notes"] = list(self._notes)
        if errors:
            metadata["errors"] = errors
        part = BackendResult(
            backend=self.name, clock=ClockInfo(name=getattr(self.clock, "name", "clock"), offset_ns=0),
            start_ns=self._start_ns, end_ns=end_ns, tracks=_unique(tracks), spans=spans, instants=instants,
            flows=flows, counters=counters, losses=losses, summaries={"overhead": summary} if summary else {},
            metadata=metadata)
        part = add_kernel_stats(part)
        for loss in part.losses:
            warnings.warn(f"backend 'cupti': {loss.count} {loss.unit} lost: {loss.detail}",
                          DataLossWarning, stacklevel=3)
        return part

    def _host_spans(self, end_ns: int, tracks: list[Track], collector: ActivityCollector | None) -> list[Span]:
        spans = []
        names = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
        seen = {t.id for t in tracks}
        for name, tid, s, e, a in self._annotations:
            key = f"thread:{tid}"
            if key not in seen:
                tracks.append(Track(key, names.get(tid, f"thread {tid}"), "thread"))
                seen.add(key)
            spans.append(Span(name, key, s, e - s, "annotation", a))
        if self._steps:
            tracks.append(Track("steps", "Steps", "other"))
            bounds = [*self._steps, (None, end_ns)]
            spans += [Span(f"step {n}", "steps", t, bounds[i + 1][1] - t, "step", {"step_num": n})
                      for i, (n, t) in enumerate(self._steps)]
        return spans

    def close(self) -> None:
        if self._sampler is not None:
            with contextlib.suppress(Exception):
                self._sampler.stop()
        if self._cupti is not None:
            with contextlib.suppress(Exception):
                self._disable_all()
            for pm in self._pm.values():
                with contextlib.suppress(Exception):
                    pm.close()
            self._pm = {}
            if self._subscribed:
                with contextlib.suppress(Exception):
                    self._cupti.unsubscribe()
                self._subscribed = False
            self._cupti = None
        if self._nvml is not None:
            nvml, self._nvml = self._nvml, None
            with contextlib.suppress(Exception):
                nvml.shutdown()

    # -- hooks ---------------------------------------------------------------------------------
    def annotation(self, name: str, args: dict[str, Any] | None = None) -> Any:
        if self.context.profile_options.host_tracer_level < 1:
            return None
        if self._collector is not None and not self._collector.note_annotation(name):
            return None
        return self._annotate(name, user_args(args))

    @contextlib.contextmanager
    def _annotate(self, name: str, args: dict[str, Any]) -> Iterator[None]:
        start = self.clock.now_ns()
        try:
            yield
        finally:
            self._annotations.append((name, threading.get_ident(), start, self.clock.now_ns(), args))

    def step(self, step_num: int) -> None:
        self._steps.append((step_num, self.clock.now_ns()))


def clock_map(points: list[tuple[int, int, int]]) -> Callable[[int], int]:
    """CUPTI time -> reference time from sync points ``(ref_ns, cupti_ns, uncertainty_ns)`` (first and last used).

    A pure offset unless the two clocks measurably drift apart: the slope between the first and
    last point is used only when its distance from 1 exceeds both 1e-4 and twice what the
    readings' own uncertainty allows. Short sessions (where the jitter of two readings dwarfs any
    drift) keep every duration exact; long ones follow real drift (NTP slewing one clock, say).
    """
    if not points:
        return lambda t: t
    (r0, c0, u0), (r1, c1, u1) = points[0], points[-1]
    span = c1 - c0
    if span > 0:
        slope = (r1 - r0) / span
        if abs(slope - 1.0) > max(1e-4, 2.0 * (u0 + u1) / span):
            return lambda t: r0 + int(round((t - c0) * slope))
    off = round(sum(r - c for r, c, _u in points) / len(points))
    return lambda t: t + off


def _unique(tracks: list[Track]) -> list[Track]:
    seen: dict[str, Track] = {}
    for t in tracks:
        seen.setdefault(t.id, t)
    return list(seen.values())

