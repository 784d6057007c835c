"""Backend ``rusage``: the process's resource usage sampled into counter series.

A sampler thread reads ``resource.getrusage(RUSAGE_SELF)`` (and, optionally, ``os.getloadavg()``)
every ``interval_s`` and records: CPU utilisation of the process (percent of one core, from user +
system CPU time between samples), resident set size high-water mark, context switches and page
faults since the start, and the 1-minute load average.

Timestamps are taken on this backend's own clock, ``time.monotonic_ns``; the offset to the run's
reference clock is measured at start with :func:`omniprof.plugin.measure_offset` and stored
in the part's ``ClockInfo``, so the counters line up with the other backends of a multi-backend run.

Levels: ``host_tracer_level`` 0 records nothing; 1 and above sample. Device and Python tracer
levels have no meaning here and are accepted unchanged.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import attrs

from omniprof.plugin import Backend
from omniprof.core import validators as v
from omniprof.core.results import BackendResult, ClockInfo, CounterSeries, Loss, Track
from omniprof.plugin import measure_offset
from omniprof.errors import BackendUnavailableError

__all__ = ["RusageBackend", "RusageOptions"]

TRACK = "counter:rusage"


@attrs.frozen(kw_only=True)
class RusageOptions:
    """Options of the ``rusage`` backend.

    Attributes:
        interval_s: time between samples (default 0.01).
        max_samples: samples kept per session; later ones are counted as lost.
        include_loadavg: also record the 1-minute load average.
    """

    interval_s: float = attrs.field(default=0.01, validator=v.number_in_range(0.0005, 60.0))
    max_samples: int = attrs.field(default=100_000, validator=v.int_in_range(2, 10_000_000))
    include_loadavg: bool = attrs.field(default=True, validator=v.is_bool)


def _read() -> tuple[int, float, int, int, int, int, float | None]:
    import resource

    t = time.monotonic_ns()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    # ru_maxrss is KiB on Linux, bytes on macOS
    rss = ru.ru_maxrss if sys.platform == "darwin" else ru.ru_maxrss * 1024
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return t, ru.ru_utime + ru.ru_stime, rss, ru.ru_nvcsw, ru.ru_nivcsw, ru.ru_minflt + ru.ru_majflt, load


class RusageBackend(Backend):
    """Samples the process's resource usage (CPU %, max RSS, context switches, faults, load)."""

    name = "rusage"
    api_version = 1
    summary = "process resource usage (getrusage, loadavg) as counter series"
    single_session = False
    Options = RusageOptions

    @classmethod
    def probe(cls) -> None:
        try:
            import resource  # noqa: F401  (POSIX only)
        except ImportError as e:
            raise BackendUnavailableError("the 'resource' module is not available on this platform",
                                          "use a POSIX system (Linux, macOS)", plugin=cls.name) from e

    def __init__(self, options: RusageOptions | None = None, *, context: Any = None) -> None:
        super().__init__(options, context=context)
        self._rows: list[tuple[int, float, int, int, int, int, float | None]] = []
        self._dropped = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._offset_ns = 0
        self._start_ns = 0

    def start(self) -> None:
        self._rows = []
        self._dropped = 0
        self._offset_ns = measure_offset(time.monotonic_ns, self.clock)
        self._start_ns = time.monotonic_ns()
        if self.context.profile_options.host_tracer_level < 1:
            return
        self._sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="rusage-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        if len(self._rows) >= self.options.max_samples:
            self._dropped += 1
        else:
            self._rows.append(_read())

    def _run(self) -> None:
        while not self._stop.wait(self.options.interval_s):
            self._sample()

    def _join(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def stop(self) -> BackendResult:
        sampling = self._thread is not None
        self._join()
        if sampling:
            self._sample()
        end_ns = time.monotonic_ns()
        return BackendResult(
            backend=self.name, clock=ClockInfo(name="monotonic_ns", offset_ns=self._offset_ns),
            start_ns=self._start_ns, end_ns=end_ns,
            tracks=[Track(TRACK, "resource usage", kind="counter", pid=os.getpid())] if self._rows else [],
            counters=self._series(), summaries={"rusage": self._summary()} if len(self._rows) >= 2 else {},
            losses=[Loss(self.name, "buffer_full", self._dropped, "samples",
                         f"max_samples={self.options.max_samples} reached")] if self._dropped else [],
            metadata={"interval_s": self.options.interval_s, "samples": len(self._rows)},
        )

    def close(self) -> None:
        self._join()

    def _series(self) -> list[CounterSeries]:
        rows = self._rows
        if len(rows) < 2:
            return []
        t = [r[0] for r in rows]
        # CPU % of the interval ending at each sample (none at the first sample: no interval yet)
        cpu_pct = [100.0 * (b[1] - a[1]) / max((b[0] - a[0]) / 1e9, 1e-9) for a, b in zip(rows, rows[1:])]
        first = rows[0]
        out = [
            CounterSeries("cpu_utilization", "percent", TRACK, t[1:], cpu_pct),
            CounterSeries("max_rss", "bytes", TRACK, t, [r[2] for r in rows]),
            CounterSeries("voluntary_context_switches", "count", TRACK, t, [r[3] - first[3] for r in rows]),
            CounterSeries("involuntary_context_switches", "count", TRACK, t, [r[4] - first[4] for r in rows]),
            CounterSeries("page_faults", "count", TRACK, t, [r[5] - first[5] for r in rows]),
        ]
        if self.options.include_loadavg and all(r[6] is not None for r in rows):
            out.append(CounterSeries("loadavg_1m", "load", TRACK, t, [float(r[6]) for r in rows]))  # type: ignore[arg-type]
        return out

    def _summary(self) -> dict[str, Any]:
        a, b = self._rows[0], self._rows[-1]
        wall_s = max((b[0] - a[0]) / 1e9, 1e-9)
        return {"cpu_time_s": b[1] - a[1], "wall_time_s": wall_s, "cpu_utilization_pct": 100.0 * (b[1] - a[1]) / wall_s,
                "max_rss_bytes": b[2], "voluntary_context_switches": b[3] - a[3],
                "involuntary_context_switches": b[4] - a[4], "page_faults": b[5] - a[5], "samples": len(self._rows)}
