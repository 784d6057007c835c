"""Text from outside (file names, names in traces) made safe for files and terminals.

* :func:`utf8_safe`: a string that encodes to UTF-8. Python keeps the undecodable bytes of a file
  name as lone surrogates (``caf\\udce9.py`` for ``b"caf\\xe9.py"``); no UTF-8 file can hold them,
  so reporters show such a byte as ``\\xe9``. Results keep them exactly (as JSON ``\\u`` escapes,
  see :meth:`ProfileResult.to_json`).
* :func:`printable`: a string safe to print on a terminal: control characters (escape sequences
  that clear the screen, set the title, move the cursor, fake table rows) shown escaped.
* :func:`utf8_safe_result`: the same result with every string made UTF-8-safe (the same object
  when nothing needed it, which is the rule).
* :func:`report_stdout`: the stdout text reports go to, even when the program replaced
  ``sys.stdout`` (a ``StringIO``, ``None``, a closed file).
* :class:`EncodedText`: a text stream that writes only what the terminal's encoding holds
  (``PYTHONIOENCODING=ascii``, ``LC_ALL=C``), other characters spelled out.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from typing import IO, Any

import attrs

__all__ = ["utf8_safe", "printable", "utf8_safe_result", "can_encode", "EncodedText", "report_stdout",
           "UNICODE_RULES"]

#: the characters text reports draw with (rules, the elision mark); a stream that cannot encode them
#: gets ASCII ones (:func:`omniprof.analysis.render.print_table`)
UNICODE_RULES = "\u2500\u2026"

_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 and C1 controls (ESC, BEL, CR, backspace, CSI ...), DEL, and the Unicode line/paragraph
# separators and bidi overrides that reorder what the terminal shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b"}


def _escape_surrogate(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c - 0xDC00:02x}" if 0xDC80 <= c <= 0xDCFF else f"\\u{c:04x}"


def utf8_safe(text: str) -> str:
    """``text`` unchanged when it encodes to UTF-8, else with each lone surrogate written out
    (``\\xe9`` for an undecodable byte kept by surrogateescape, ``\\ud800`` for others)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escape_surrogate, text)
    return text


def _escape_control(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def printable(text: Any) -> str:
    """``str(text)`` for a terminal: control characters escaped, lone surrogates written out."""
    s = text if isinstance(text, str) else str(text)
    if s.isascii() and s.isprintable():
        return s
    return _CONTROL.sub(_escape_control, utf8_safe(s))


# -- whole results --------------------------------------------------------------------------------
# Fields holding only numbers (or ids): never walked, so a million samples cost nothing.
_NUMERIC_FIELDS = frozenset({"samples", "allocations", "stacks", "t_ns", "values", "flow_ids"})


def _fix(value: Any) -> Any:
    """``value`` with unencodable strings fixed; the very same object when nothing changed."""
    if isinstance(value, str):
        return utf8_safe(value)
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    if attrs.has(type(value)):
        changes = {}
        for a in attrs.fields(type(value)):
            if a.name in _NUMERIC_FIELDS:
                continue
            old = getattr(value, a.name)
            new = _fix(old)
            if new is not old:
                changes[a.name] = new
        return attrs.evolve(value, **changes) if changes else value
    if isinstance(value, Mapping):
        items = [(k, v, _fix(k) if isinstance(k, str) else k, _fix(v)) for k, v in value.items()]
        if all(k2 is k and v2 is v for k, v, k2, v2 in items):
            return value
        return {k2: v2 for _, _, k2, v2 in items}
    if isinstance(value, (tuple, list)):
        new = [_fix(x) for x in value]
        if all(a is b for a, b in zip(new, value)):
            return value
        return type(value)(new) if isinstance(value, list) else tuple(new)
    return value


def utf8_safe_result(result: Any) -> Any:
    """``result`` with every string a UTF-8 file can hold (see :func:`utf8_safe`)."""
    return _fix(result)


# -- streams --------------------------------------------------------------------------------------
def can_encode(stream: Any, text: str) -> bool:
    """Whether ``stream`` (a text stream) can write ``text``: its ``encoding`` holds every
    character. A stream without an encoding (``io.StringIO``) holds any text."""
    encoding = getattr(stream, "encoding", None)
    if not isinstance(encoding, str) or not encoding:
        return True
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


class EncodedText:
    """Writes to ``stream`` only characters its encoding holds; any other is spelled out
    (``\\u2500``, ``\\xe9``) instead of failing the whole report with ``UnicodeEncodeError``.
    ``encoding`` and ``isatty`` are the stream's, so the renderer picks ASCII rules and the table
    reporter its colours as for the stream itself."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.encoding: str = stream.encoding

    def write(self, text: str) -> int:
        self.stream.write(text.encode(self.encoding, "backslashreplace").decode(self.encoding))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    @property
    def name(self) -> Any:
        return getattr(self.stream, "name", "<stdout>")


def _writable(stream: Any) -> bool:
    if stream is None or not callable(getattr(stream, "write", None)):
        return False
    try:
        return not stream.closed
    except (AttributeError, ValueError):
        return True


_fd1_stream: IO[str] | None = None


def report_stdout(started: Any = None) -> IO[str]:
    """The stream a text report goes to: ``started`` (the stdout a command began with, before the
    program ran) while it can still be written, else ``sys.__stdout__``, else a new stream on file
    descriptor 1. A program that set ``sys.stdout`` to a ``StringIO``, to ``None`` or to a closed
    file still gets its report on the terminal. (``sys.stdout`` itself keeps ``closefd=False``: its
    ``close()`` leaves descriptor 1 open.)"""
    global _fd1_stream
    for stream in (started, sys.__stdout__, _fd1_stream):
        if _writable(stream):
            return stream  # type: ignore[no-any-return]
    encoding = getattr(sys.__stdout__, "encoding", None) or "utf-8"
    _fd1_stream = open(os.dup(1), "w", encoding=encoding, errors="backslashreplace", closefd=True)  # noqa: SIM115
    return _fd1_stream
