"""The ``perfetto`` and ``chrome`` reporters: a result to one file, through one of the two encoders."""

from __future__ import annotations

import warnings
from typing import IO, Any

from omniprof.core.reporter import check_times
from omniprof.core.results import ProfileResult
from omniprof.errors import OmniprofWarning
from omniprof.plugin import Reporter
from omniprof.reporters.perfetto.chrome import write_chrome_json
from omniprof.reporters.perfetto.options import UI_LIMIT_BYTES, ChromeTraceOptions, PerfettoOptions
from omniprof.reporters.perfetto.proto import write_proto

__all__ = ["PerfettoReporter", "ChromeTraceReporter"]

class PerfettoReporter(Reporter):
    """A Perfetto timeline: native protobuf (default) or Chrome JSON (``format="json"``).

    >>> import io, omniprof
    >>> from omniprof.testing.fakes import make_result
    >>> buf = io.BytesIO()
    >>> PerfettoReporter().report(make_result(), buf)
    >>> buf.getvalue()[:1] == b"\\x0a"     # a Trace: repeated TracePacket packet = 1
    True

    .. versionadded:: 0.1
    """

    name = "perfetto"
    output = "file"
    default_filename = "trace.perfetto-trace"
    summary = "Perfetto timeline (native protobuf, or Chrome JSON with format=json); omniprof view --perfetto FILE"
    Options = PerfettoOptions

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        if self.options.format == "json":
            self.default_filename = "trace.json.gz" if self.options.compress else "trace.json"

    def report(self, result: ProfileResult, dest: IO[bytes]) -> None:  # type: ignore[override]
        check_times(result, self.name)
        if self.options.format == "proto":
            written = write_proto(result, dest, self.options)
        else:
            written = write_chrome_json(result, dest, self.options)
        fmt = self.options.format
        if written > UI_LIMIT_BYTES[fmt]:
            warnings.warn(f"{self.name}: the trace is {written / 2**20:,.0f} MiB ({fmt}), more than ui.perfetto.dev "
                          f"can usually open in a browser (~{UI_LIMIT_BYTES[fmt] >> 20} MiB). Open it with a native "
                          f"trace processor (trace_processor --httpd FILE, then ui.perfetto.dev), or record less "
                          f"(a schedule with fewer active steps, include_samples=false)", OmniprofWarning, stacklevel=2)


class ChromeTraceReporter(PerfettoReporter):
    """Chrome trace-event JSON (``trace.json.gz``) for chrome://tracing, catapult and Perfetto.

    .. versionadded:: 0.1
    """

    name = "chrome"
    default_filename = "trace.json.gz"
    summary = "Chrome trace-event JSON (trace.json.gz) for chrome://tracing and older tools"
    Options = ChromeTraceOptions


