"""The JSON side of the Kineto reader: a streaming tokenizer over a trace's text and exact times.

The ``traceEvents`` array is decoded one event at a time from a bounded text buffer (:func:`feed`
hands each decoded event to a builder and drops it), so peak memory is one buffer, not the JSON
tree. Numbers with a fraction keep their text (:class:`_Num`) so microseconds convert to integer
nanoseconds exactly (:func:`us_text_to_ns`), never through float arithmetic.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Callable
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import IO, Any, Protocol

from omniprof.errors import TraceReadError

__all__ = ["us_text_to_ns", "feed", "open_text", "JsonStream", "CHUNK_CHARS"]

CHUNK_CHARS = 1 << 20
_LOOKAHEAD = 1 << 16
_WS = re.compile(r"[ \t\n\r]*")


class _Num(str):
    """A JSON number with a fraction or exponent, kept as its text (exact ns conversion)."""

    __slots__ = ()


_DECODER = json.JSONDecoder(parse_float=_Num)
#: torch's Python tracer now and then writes a frame name holding a raw control character (seen with
#: torch 2.13: ``"torch/profiler/_cupti_monitor.py(0): \x07"``), which strict JSON forbids; such a
#: value is read as written and counted (``metadata["values_with_control_characters"]``).
_LENIENT = json.JSONDecoder(parse_float=_Num, strict=False)



def us_text_to_ns(value: Any) -> int:
    """Microseconds (a JSON int, or a decimal's text) to integer ns, exactly (half-even rounding).

    >>> us_text_to_ns(_Num("4385052688052.478")), us_text_to_ns(12), us_text_to_ns(_Num("1.0005"))
    (4385052688052478, 12000, 1000)
    """
    t = type(value)
    if t is int:
        return value * 1000
    if t is _Num or t is str:
        if "e" in value or "E" in value or value.count(".") > 1:
            return int((Decimal(value) * 1000).to_integral_value(ROUND_HALF_EVEN))
        neg = value.startswith("-")
        whole, _, frac = (value[1:] if neg else value).partition(".")
        ns = int(whole or "0") * 1000 + (int((frac + "000")[:3]) if frac else 0)
        if len(frac) > 3:
            rest = frac[3:]
            half = "5" + "0" * (len(rest) - 1)
            if rest > half or (rest == half and ns % 2):
                ns += 1
        return -ns if neg else ns
    if t is float:
        return round(value * 1000)
    raise TypeError(f"not a number: {value!r}")


def _plain(value: Any) -> Any:
    """Decoded JSON with exact-number texts turned back into floats."""
    t = type(value)
    if t is _Num:
        return float(value)
    if t is dict:
        return {k: _plain(v) for k, v in value.items()}
    if t is list:
        return [_plain(v) for v in value]
    return value


def _num(value: Any) -> float | int | None:
    if type(value) is _Num:
        return float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


# -- streaming JSON ----------------------------------------------------------------------------
class JsonStream:
    """Tokenizer over a text file: whitespace, punctuation, and whole values via raw_decode."""

    def __init__(self, fh: IO[str], name: str) -> None:
        self.fh = fh
        self.name = name
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.offset = 0      # absolute char offset of buf[0]
        self.line = 1        # line number of buf[0]
        self.line_start = 0  # absolute offset where that line starts
        self.control_characters = 0  # values read leniently: raw control characters in strings

    def _read(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.fh.read(CHUNK_CHARS)
        except EOFError as e:
            raise self.error(f"the compressed data ends early ({e}): the file is truncated", len(self.buf)) from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise self.error(f"corrupt gzip data ({e})", len(self.buf)) from None
        except UnicodeDecodeError as e:
            raise self.error(f"not UTF-8 text ({e.reason})", len(self.buf)) from None
        except OSError as e:
            raise TraceReadError(f"{self.name}: cannot read: {e.strerror or e}") from e
        if not chunk:
            self.eof = True
            return False
        if self.pos:
            done = self.buf[: self.pos]
            n = done.count("\n")
            if n:
                self.line += n
                self.line_start = self.offset + done.rfind("\n") + 1
            self.offset += self.pos
            self.buf = self.buf[self.pos:]
            self.pos = 0
        self.buf += chunk
        return True

    def where(self, pos: int | None = None) -> str:
        pos = self.pos if pos is None else min(pos, len(self.buf))
        part = self.buf[:pos]
        n = part.count("\n")
        absolute = self.offset + pos
        start = self.offset + part.rfind("\n") + 1 if n else self.line_start
        return f"line {self.line + n} column {absolute - start + 1} (char {absolute})"

    def error(self, msg: str, pos: int | None = None) -> TraceReadError:
        return TraceReadError(f"{self.name}: {msg} at {self.where(pos)}")

    def peek(self) -> str:
        """Skip whitespace; the next character, or '' at the end of the file."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._read():
                return ""

    def expect(self, chars: str, what: str) -> str:
        c = self.peek()
        if c == "":
            raise self.error(f"the file ends early (truncated?): expected {what}")
        if c not in chars:
            raise self.error(f"invalid JSON: expected {what}, found {c!r}")
        self.pos += 1
        return c

    def value(self) -> Any:
        if self.peek() == "":
            raise self.error("the file ends early (truncated?): expected a value")
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if e.msg.startswith("Invalid control character"):
                    try:
                        value, end = _LENIENT.raw_decode(self.buf, self.pos)
                    except json.JSONDecodeError as lenient:
                        e = lenient  # another error (or the value goes on in the next chunk): handled below
                    else:
                        if end < len(self.buf) or not self._read():
                            self.control_characters += 1
                            self.pos = end
                            return value
                        continue
                near_end = e.pos >= len(self.buf) - _LOOKAHEAD or e.msg.startswith("Unterminated string")
                if near_end and self._read():
                    continue
                if self.eof and (e.pos >= len(self.buf.rstrip()) or e.msg.startswith("Unterminated string")):
                    raise self.error("the file ends inside a JSON value: it is truncated", e.pos) from None
                raise self.error(f"invalid JSON: {e.msg}", e.pos) from None
            except RecursionError:
                raise self.error("invalid JSON: nested too deeply") from None
            if end >= len(self.buf) and self._read():
                continue  # a number may continue in the next chunk
            self.pos = end
            return value


def open_text(path: Path) -> IO[str]:
    # Bounded (size, gzip expansion ratio); pipes, devices and link loops each get their message.
    from omniprof.core.inputs import open_stream

    return io.TextIOWrapper(open_stream(path), encoding="utf-8")



class EventSink(Protocol):
    """What :func:`feed` hands each decoded event to (the result builder)."""

    def add(self, ev: Any, where: Callable[[], str]) -> None: ...


def feed(stream: JsonStream, builder: EventSink, name: str) -> dict[str, Any]:
    """Stream every event of the trace into ``builder``; the trace's other top-level fields."""
    top: dict[str, Any] = {}
    where = stream.where

    def events() -> None:
        stream.expect("[", "'[' opening the event array")
        if stream.peek() == "]":
            stream.pos += 1
            return
        while True:
            builder.add(stream.value(), where)
            if stream.expect(",]", "',' or ']' after an event") == "]":
                return

    first = stream.peek()
    if first == "":
        raise stream.error("empty file: expected a Kineto trace (a JSON object with 'traceEvents')")
    if first == "[":
        events()
    elif first == "{":
        stream.pos += 1
        seen_events = False
        if stream.peek() == "}":
            stream.pos += 1
        else:
            while True:
                if stream.peek() != '"':
                    stream.expect('"', "a quoted key")
                key = stream.value()
                stream.expect(":", "':' after a key")
                if key == "traceEvents":
                    events()
                    seen_events = True
                else:
                    top[key] = _plain(stream.value())
                if stream.expect(",}", "',' or '}'") == "}":
                    break
        if not seen_events:
            raise TraceReadError(f"{name}: not a Kineto trace: the JSON object has no 'traceEvents' array "
                                 f"(keys: {', '.join(sorted(top)) or 'none'})")
    else:
        raise stream.error(f"not a Kineto trace: expected '{{' or '[', found {first!r}")
    if stream.peek() != "":
        raise stream.error("invalid JSON: extra data after the trace")
    return top
