"""The JSON encoder: an event stream as Chrome trace-event JSON, streamed in chunks."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterable, Iterator
from typing import IO, Any

import attrs

from omniprof.core.results import ProfileResult
from omniprof.reporters.perfetto.options import ChromeTraceOptions, PerfettoOptions
from omniprof.reporters.perfetto.stream import (
    COUNTER,
    FLOW,
    FRAME,
    INSTANT,
    META,
    SAMPLE,
    SLICE,
    STACK,
    TRACK,
    SliceKey,
    events,
)

__all__ = ["write_chrome_json", "encode_json", "chrome_events"]

# -- Chrome trace-event JSON --------------------------------------------------------------------
def _us(t: int) -> str:
    """ns -> microseconds as JSON number text with three decimals (no precision lost)."""
    if t < 0:
        raise ValueError(f"negative time {t} reached the Chrome JSON encoder")
    return f"{t // 1000}.{t % 1000:03d}"


def chrome_events(result: ProfileResult, options: PerfettoOptions | None = None) -> Iterator[dict[str, Any]]:
    """The trace events as plain dicts (``ts``/``dur`` as float microseconds), in file order.

    For tests and tools; :func:`write_chrome_json` streams the same events without building dicts.
    """
    buf = io.BytesIO()
    write_chrome_json(result, buf, attrs.evolve(options or ChromeTraceOptions(), compress=False))
    yield from json.loads(buf.getvalue())["traceEvents"]


def write_chrome_json(result: ProfileResult, fh: IO[bytes], options: PerfettoOptions | None = None) -> int:
    """Stream ``result`` to ``fh`` as Chrome trace-event JSON (gzipped if ``options.compress``)."""
    o = options or ChromeTraceOptions()
    if o.compress:
        gz = gzip.GzipFile(fileobj=fh, mode="wb", compresslevel=6, mtime=0)
        try:
            return encode_json(events(result, o), gz, o.chunk_bytes)
        finally:
            gz.close()
    return encode_json(events(result, o), fh, o.chunk_bytes)


def encode_json(stream: Iterable[tuple[Any, ...]], out: IO[bytes], chunk_bytes: int = 1 << 20) -> int:
    """Translate an event stream (:func:`events`) into Chrome trace-event JSON on ``out``; returns
    the bytes written (before any compression ``out`` does).

    Tracks become ``process_name``/``thread_name`` metadata (a named track or lane is a thread with
    a synthetic tid), slices complete (``X``) events, flows an ``s``/``f`` pair bound to the
    enclosing slices (``"bp":"e"``), counters ``C`` events, and samples instant events of category
    ``sample`` on their thread, the leaf frame's name as the name and the whole stack (root first)
    in ``args.stack``. ``META`` becomes the ``otherData`` object after the events.
    """
    chunks: list[str] = ['{"traceEvents":[\n']
    size = 0
    written = 0
    sep = ""

    def flush() -> None:
        nonlocal size, written
        data = "".join(chunks).encode("utf-8")
        out.write(data)
        written += len(data)
        chunks.clear()
        size = 0

    dumps = _dumps
    us = _us
    heads: dict[SliceKey, tuple[str, str]] = {}
    frame_names: dict[int, str] = {}
    stack_text: dict[int, str] = {}
    other: dict[str, Any] = {}
    for ev in stream:
        kind = ev[0]
        if kind is SLICE:
            key, start, end, args = ev[1:5]
            head = heads.get(key) or _json_slice_head(heads, key)
            tail = f',"args":{dumps(args)}}}' if args else "}"
            text = f'{sep}{head[0]}{us(start)},"dur":{us(end - start)}{head[1]}{tail}'
        elif kind is COUNTER:
            _, row, t, value = ev
            text = f'{sep}{{"ph":"C","name":{dumps(row.name)},"ts":{us(t)},"pid":{row.pid},"args":{{"value":{value!r}}}}}'
        elif kind is SAMPLE:
            _, row, t, sid, weight = ev
            text = (f'{sep}{{"ph":"i","s":"t","cat":"sample",{stack_text[sid]},"weight_ns":{weight}}},'
                    f'"ts":{us(t)},"pid":{row.pid},"tid":{row.tid}}}')
        elif kind is FLOW:
            _, link, name, category, src, src_ns, dst, dst_ns = ev
            label = f'"name":{dumps(name)},"cat":{dumps(category)}'
            text = (f'{sep}{{"ph":"s","id":{link},{label},"ts":{us(src_ns)},"pid":{src.pid},"tid":{src.tid},"bp":"e"}},\n'
                    f'{{"ph":"f","id":{link},{label},"ts":{us(dst_ns)},"pid":{dst.pid},"tid":{dst.tid},"bp":"e"}}')
        elif kind is INSTANT:
            _, row, t, name, category, args = ev
            extra = f',"args":{dumps(args)}' if args else ""
            text = (f'{sep}{{"ph":"i","s":"t","name":{dumps(name)},"cat":{dumps(category or "event")},'
                    f'"ts":{us(t)},"pid":{row.pid},"tid":{row.tid}{extra}}}')
        elif kind is TRACK:
            row = ev[1]
            if row.kind == "process":
                text = f'{sep}{{"ph":"M","name":"process_name","pid":{row.pid},"tid":0,"args":{{"name":{dumps(row.name)}}}}}'
            elif row.kind in ("thread", "named", "lane"):
                text = (f'{sep}{{"ph":"M","name":"thread_name","pid":{row.pid},"tid":{row.tid},'
                        f'"args":{{"name":{dumps(row.name)}}}}}')
            else:  # a counter track: its events name it
                continue
        elif kind is FRAME:
            frame_names[ev[1]] = ev[2]
            continue
        elif kind is STACK:
            names = [frame_names[f] for f in ev[2]]
            stack_text[ev[1]] = f'"name":{dumps(names[-1])},"args":{{"stack":{dumps(names)}'
            continue
        elif kind is META:
            other = ev[1]
            continue
        else:  # MAPPING: the JSON names no files
            continue
        sep = ",\n"
        chunks.append(text)
        size += len(text)
        if size >= chunk_bytes:
            flush()
    chunks.append("\n]")
    chunks.append(f',\n"otherData":{dumps(other)}')
    chunks.append("}\n")
    flush()
    return written


def _json_slice_head(heads: dict[SliceKey, tuple[str, str]], key: SliceKey) -> tuple[str, str]:
    """The text of a slice key's X events before ``ts`` and after ``dur`` (kept in ``heads``)."""
    row = key.row
    head = heads[key] = (f'{{"ph":"X","name":{_dumps(key.name)},"cat":{_dumps(key.category or "span")},"ts":',
                         f',"pid":{row.pid},"tid":{row.tid}')
    return head


def _dumps(value: Any) -> str:
    """JSON for the Chrome format: strict (no NaN: args are made JSON-safe first), and not
    ASCII-escaped, so a lone surrogate fails the UTF-8 encode and the core writes it out instead."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except ValueError:
        from omniprof.core.results import json_safe

        return json.dumps(json_safe(value), ensure_ascii=False, allow_nan=False)
