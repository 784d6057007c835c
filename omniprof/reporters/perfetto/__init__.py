"""Reporters ``perfetto`` and ``chrome``: timelines that open in Perfetto (ui.perfetto.dev).

``perfetto`` writes the native Perfetto protobuf trace (``trace.perfetto-trace``): a stream of
``TracePacket`` messages carrying ``TrackDescriptor`` (process, thread, device/stream and counter
tracks), ``TrackEvent`` (slices, instants, counter values, flows) and ``PerfSample`` (sampled
stacks, with interned frames and callstacks). ``chrome`` writes the Chrome trace-event JSON
(``trace.json.gz``) that older tools (chrome://tracing, catapult) read; ``perfetto`` with
``format="json"`` writes the same file.

How it is built: one walk, two encoders.

* **Layout first** (:func:`layout`, module ``layout``): every result track becomes a Perfetto track with a uuid, a
  process (pid) and, for host threads, a thread (tid). Device and stream tracks become named
  tracks under a process per device; counter series get counter tracks. Tests assert on it.
* **One event stream** (:func:`events`, module ``stream``): a generator of plain tuples (tracks, slices, flows,
  instants, counter values, sampled stacks and samples) in file order. Every decision both formats
  share is taken there, once: times on the trace's axis, overflow lanes, flow links, what the
  options leave out, what is dropped or mended (and counted in a warning).
* **Encoders** (:func:`encode_proto` in ``proto``, :func:`encode_json` in ``chrome``) only translate events into bytes; the
  proto encoder keeps its fast path (precomputed bytes per slice key, table-made timestamp
  varints, interning) to itself.
* **Lanes**: a slice track must hold properly nested slices. Spans are visited in start order
  per track (:func:`omniprof.analysis.timeline.track_order`); a span that overlaps a sibling
  without nesting moves to an overflow lane (a child track named ``"<track> (lane 2)"``), so
  every span is present and Perfetto reports no import error.
* **Streaming, constant memory**: packets are encoded by hand in the protobuf wire format (field
  numbers from Perfetto's ``perfetto_trace.proto``) and written to the handle in chunks of
  ``chunk_bytes``. Event names, categories and argument names are interned (``InternedData``)
  on one packet sequence that starts with ``SEQ_INCREMENTAL_STATE_CLEARED``; every event packet
  carries ``SEQ_NEEDS_INCREMENTAL_STATE``. Memory grows with the number of distinct names and
  tracks, not with the number of events; only spans that need bookkeeping cost memory each:
  spans carrying flow ids (to chain them), spans moved to lanes, and, for a part not listed in
  start order, the sorted index.
* Timestamps are the run's reference clock, in ns (the JSON has microseconds with three
  decimals, so no precision is lost): each part is read through
  :func:`omniprof.analysis.timeline.placed` on :func:`omniprof.analysis.timeline.time_axis` with
  ``origin="reference"``, so where a part's clock offset puts data before 0 the whole trace moves
  later by the same amount: nothing is clamped. No ``displayTimeUnit`` key is written (some
  Perfetto versions misread it).

The modules, each a layer over the one before: ``options`` (the reporters' options), ``layout``
(tracks), ``stream`` (the event stream), ``proto`` and ``chrome`` (the two encoders), ``reporter``
(the two reporters). This package re-exports their public names.
"""

from omniprof.reporters.perfetto.chrome import chrome_events, encode_json, write_chrome_json
from omniprof.reporters.perfetto.layout import Layout, TrackRow, layout
from omniprof.reporters.perfetto.options import UI_LIMIT_BYTES, ChromeTraceOptions, PerfettoOptions
from omniprof.reporters.perfetto.proto import encode_proto, write_proto
from omniprof.reporters.perfetto.reporter import ChromeTraceReporter, PerfettoReporter
from omniprof.reporters.perfetto.stream import (
    COUNTER,
    EMPTY_STACK,
    FLOW,
    FRAME,
    INSTANT,
    MAPPING,
    META,
    SAMPLE,
    SLICE,
    STACK,
    TRACK,
    SliceKey,
    events,
    expected_counts,
)

__all__ = [
    "PerfettoReporter", "ChromeTraceReporter", "PerfettoOptions", "ChromeTraceOptions", "layout", "Layout",
    "TrackRow", "write_proto", "write_chrome_json", "chrome_events", "expected_counts", "events", "SliceKey",
    "encode_proto", "encode_json", "UI_LIMIT_BYTES", "EMPTY_STACK",
    "META", "TRACK", "SLICE", "FLOW", "INSTANT", "COUNTER", "MAPPING", "FRAME", "STACK", "SAMPLE",
]
