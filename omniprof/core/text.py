"""Text from outside (file names, names in traces) made safe for files and terminals.

* :func:`utf8_safe`: a string that encodes to UTF-8. Python keeps the undecodable bytes of a file
  name as lone surrogates (``caf\\udce9.py`` for ``b"caf\\xe9.py"``); no UTF-8 file can hold them,
  so reporters show such a byte as ``\\xe9``. Results keep them exactly (as JSON ``\\u`` escapes,
  see :meth:`ProfileResult.to_json`).
* :func:`printable`: a string safe to print on a terminal: control characters (escape sequences
  that clear the screen, set the title, move the cursor, fake table rows) shown escaped.
* :func:`utf8_safe_result`: the same result with every string made UTF-8-safe (the same object
  when nothing needed it, which is the rule).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["utf8_safe", "printable", "utf8_safe_result"]

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
