"""The options of the ``perfetto`` and ``chrome`` reporters, and the sizes a browser can open."""

from __future__ import annotations

from typing import Any

import attrs

from omniprof.core import validators as v

__all__ = ["PerfettoOptions", "ChromeTraceOptions", "UI_LIMIT_BYTES"]

# Practical sizes past which ui.perfetto.dev, running in a browser, usually cannot open a trace:
# the browser gives the page about 2 GB, and the trace processor's in-memory form of a trace is
# 2-4x its protobuf size (perfetto.dev/docs/visualization/large-traces); JSON traces of ~900 MB
# crashed the UI (google/perfetto#99). Uncompressed bytes.
UI_LIMIT_BYTES = {"proto": 1 << 30, "json": 512 << 20}


# -- options ------------------------------------------------------------------------------------
def _fmt_validator(inst: Any, attribute: Any, value: Any) -> None:
    v.one_of("proto", "json")(inst, attribute, value)


@attrs.frozen(kw_only=True)
class PerfettoOptions:
    """Options of the ``perfetto`` reporter.

    Attributes:
        format: ``"proto"`` (native Perfetto protobuf, default) or ``"json"`` (Chrome trace JSON).
        compress: gzip the JSON output (default True: ``trace.json.gz``); the protobuf is never gzipped.
        include_args: write span/instant args (debug annotations / JSON ``args``).
        include_counters: write counter series (counter tracks).
        include_samples: write sampled stacks (``PerfSample`` with interned callstacks; in JSON,
            the trace's ``stackFrames`` / ``samples`` arrays).
        include_flows: write flows (CPU launch -> GPU kernel arrows).
        include_instants: write instant events.
        chunk_bytes: bound on the memory the writer buffers between writes to the output handle.
    """

    format: str = attrs.field(default="proto", validator=_fmt_validator)
    compress: bool = attrs.field(default=True, validator=v.is_bool)
    include_args: bool = attrs.field(default=True, validator=v.is_bool)
    include_counters: bool = attrs.field(default=True, validator=v.is_bool)
    include_samples: bool = attrs.field(default=True, validator=v.is_bool)
    include_flows: bool = attrs.field(default=True, validator=v.is_bool)
    include_instants: bool = attrs.field(default=True, validator=v.is_bool)
    chunk_bytes: int = attrs.field(default=1 << 20, validator=v.int_in_range(4096, 1 << 30))


@attrs.frozen(kw_only=True)
class ChromeTraceOptions(PerfettoOptions):
    """Options of the ``chrome`` reporter: those of ``perfetto``, with ``format="json"``."""

    format: str = attrs.field(default="json", validator=_fmt_validator)


