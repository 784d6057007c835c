"""Line numbers of keys in TOML text, for error messages (``tomllib`` gives no positions).

:func:`key_lines` scans the text once and maps every key path it can see (table headers, dotted
keys, keys of one-line inline tables) to its 1-based line; :func:`line_of` finds the line of a
path, falling back to its nearest recorded ancestor. It is a position finder, not a parser: the
text has already been parsed by ``tomllib``, so it only has to be right on valid TOML.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

__all__ = ["key_lines", "line_of", "split_key"]

_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\", "e": "\x1b"}
_BARE = re.compile(r"[A-Za-z0-9_-]+")


def split_key(text: str) -> tuple[str, ...] | None:
    """Split a (dotted, maybe quoted) TOML key into its parts; None when it is not a key."""
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            return None
        if text[i] in "\"'":
            q = text[i]
            j = i + 1
            buf = []
            while j < n and text[j] != q:
                if q == '"' and text[j] == "\\" and j + 1 < n:
                    c = text[j + 1]
                    width = {"u": 4, "U": 8}.get(c, 0)
                    if width:
                        try:
                            buf.append(chr(int(text[j + 2:j + 2 + width], 16)))
                        except ValueError:
                            return None
                        j += 2 + width
                        continue
                    buf.append(_ESCAPES.get(c, c))
                    j += 2
                    continue
                buf.append(text[j])
                j += 1
            if j >= n:
                return None
            parts.append("".join(buf))
            i = j + 1
        else:
            m = _BARE.match(text, i)
            if not m:
                return None
            parts.append(m.group(0))
            i = m.end()
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            return tuple(parts)
        if text[i] != ".":
            return None
        i += 1


def _unquoted(line: str, start: int = 0) -> Iterator[tuple[int, str]]:
    """(index, character) of every character of ``line`` from ``start`` that is outside a quoted
    string; the quotes themselves are skipped, and ``\\`` escapes inside double quotes."""
    in_q: str | None = None
    j, n = start, len(line)
    while j < n:
        c = line[j]
        if in_q:
            if c == "\\" and in_q == '"':
                j += 2
                continue
            if c == in_q:
                in_q = None
        elif c in "\"'":
            in_q = c
        else:
            yield j, c
        j += 1


def _key_before_eq(line: str, start: int) -> tuple[tuple[str, ...], int] | None:
    """A key starting at ``start`` and followed by ``=``: (parts, index after '=')."""
    for j, c in _unquoted(line, start):
        if c == "=":
            parts = split_key(line[start:j])
            return (parts, j + 1) if parts else None
        if c in "{}[],#":
            return None
    return None


def _inline_keys(line: str, pos: int, prefix: tuple[str, ...], lineno: int, out: dict[tuple[str, ...], int]) -> None:
    """Record the keys of an inline table starting at ``line[pos] == '{'`` (one level and nested)."""
    stack = [prefix]
    i, n = pos + 1, len(line)
    expect_key = True
    in_q: str | None = None
    while i < n:
        c = line[i]
        if in_q:
            if c == "\\" and in_q == '"':
                i += 2
                continue
            if c == in_q:
                in_q = None
            i += 1
            continue
        if expect_key and c not in " \t}":
            got = _key_before_eq(line, i)
            if got is None:
                return
            parts, i = got
            path = stack[-1] + parts
            out.setdefault(path, lineno)
            expect_key = False
            while i < n and line[i] in " \t":
                i += 1
            if i < n and line[i] == "{":
                stack.append(path)
                expect_key = True
                i += 1
            continue
        if c in "\"'":
            in_q = c
        elif c == ",":
            expect_key = True
        elif c == "}":
            stack.pop()
            if not stack:
                return
        elif c == "[":
            # an array value: skip to its end on this line
            depth = 1
            i += 1
            while i < n and depth:
                if line[i] == "[":
                    depth += 1
                elif line[i] == "]":
                    depth -= 1
                i += 1
            continue
        i += 1


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Map each key path seen in ``text`` to its 1-based line number (first occurrence)."""
    out: dict[tuple[str, ...], int] = {}
    prefix: tuple[str, ...] = ()
    in_multiline: str | None = None
    array_depth = 0
    # TOML lines end only at \n (or \r\n); str.splitlines() would also split at \x85, \u2028, ...
    for lineno, line in enumerate((ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")), start=1):
        if in_multiline:
            if line.count(in_multiline) % 2 == 1:
                in_multiline = None
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if array_depth:
            array_depth += _bracket_balance(line)
            continue
        if stripped.startswith("["):
            parts = _header_key(stripped)
            if parts:
                prefix = parts
                for k in range(1, len(parts) + 1):
                    out.setdefault(parts[:k], lineno)
                continue
        got = _key_before_eq(line, 0)
        if got is None:
            continue
        parts, after = got
        path = prefix + parts
        for k in range(len(prefix) + 1, len(path) + 1):
            out.setdefault(path[:k], lineno)
        rest = line[after:].lstrip()
        for q in ('"""', "'''"):
            if rest.startswith(q) and rest.count(q) == 1:
                in_multiline = q
        if rest.startswith("{"):
            _inline_keys(line, line.index("{", after), path, lineno, out)
        elif rest.startswith("["):
            bal = _bracket_balance(rest)
            if bal > 0:
                array_depth = bal
    return out


def _header_key(line: str) -> tuple[str, ...] | None:
    """The key of a ``[table]`` or ``[[array]]`` header line (quote-aware), else None."""
    start = 2 if line.startswith("[[") else 1
    for i, c in _unquoted(line, start):
        if c == "]":
            return split_key(line[start:i])
    return None


def _bracket_balance(text: str) -> int:
    bal = 0
    for _, c in _unquoted(text):
        if c == "#":
            break
        if c == "[":
            bal += 1
        elif c == "]":
            bal -= 1
    return bal


def line_of(lines: dict[tuple[str, ...], int], path: Sequence[str]) -> int | None:
    """The line of ``path``, or of its nearest ancestor that has one; None when nothing matches."""
    path = tuple(str(p) for p in path)
    for k in range(len(path), 0, -1):
        if path[:k] in lines:
            return lines[path[:k]]
    return None
