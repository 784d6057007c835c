"""attrs validators that raise :class:`~omniprof.errors.InvalidArgumentError` with uniform messages,
and the converters attrs fields use.

Messages follow attrs' shape, e.g. ``'host_tracer_level' must be one of 0, 1, 2, 3 (got 7)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from omniprof.errors import InvalidArgumentError

Validator = Callable[[Any, Any, Any], None]


def _name(attribute: Any) -> str:
    return attribute if isinstance(attribute, str) else attribute.name


def type_name(value: object) -> str:
    return type(value).__name__


def nearest(key: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to ``key``, or None when nothing is close; case is ignored first
    (``CPU`` -> ``cpu``).

    >>> nearest("CPU", ["cpu", "xla"]), nearest("tabel", ["table", "json"]), nearest("zzz", ["cpu"])
    ('cpu', 'table', None)
    """
    candidates = list(candidates)
    folded = [c for c in candidates if c.casefold() == key.casefold()]
    if folded:
        return folded[0]
    import difflib  # on first use: `import omniprof` stays light

    # 0.6: a typo of a name (tabel, troch: 0.8) is close; a name that only shares two letters
    # with one is not (nosuch ~ torch: 0.55)
    matches = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if not matches:
        lower = {c.casefold(): c for c in candidates}
        matches = [lower[m] for m in difflib.get_close_matches(key.casefold(), list(lower), n=1, cutoff=0.6)]
    return matches[0] if matches else None


def unknown_key_message(key: str, candidates: Iterable[str], *, what: str = "option", got: Any = ...) -> str:
    """``unknown option 'x' (got value 5); did you mean 'y'? Valid keys: a, b``."""
    candidates = sorted(candidates)
    near = nearest(key, candidates)
    value = f" (got value {got!r})" if got is not ... else ""
    hint = f"; did you mean {near!r}?" if near else "."
    return f"unknown {what} {key!r}{value}{hint} Valid keys: {', '.join(candidates)}"


def check_keys(mapping: Mapping[str, Any], allowed: Iterable[str], *, what: str = "option") -> None:
    allowed = list(allowed)
    for key in mapping:
        if not isinstance(key, str):
            raise InvalidArgumentError(f"{what} keys must be strings (got {key!r} of type {type_name(key)})")
        if key not in allowed:
            raise InvalidArgumentError(unknown_key_message(key, allowed, what=what))


def to_tuple(value: Iterable[Any]) -> tuple[Any, ...]:
    """``tuple(value)`` as an attrs converter.

    Converters are Python functions, never a builtin such as ``tuple`` or ``int``: attrs reads a
    converter's signature when it makes the class, and a builtin's is parsed from its text, which
    compiles tokenize's regular expressions on first use (about 2 ms of import time).
    """
    return tuple(value)


def to_int(value: Any) -> int:
    """``int(value)`` as an attrs converter (a plain int: ``True`` becomes ``1``); see :func:`to_tuple`."""
    return int(value)


def is_bool(inst: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidArgumentError(
            f"{_name(attribute)!r} must be a bool (true or false) (got {value!r} of type {type_name(value)})"
        )


def is_str(inst: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{_name(attribute)!r} must be a string (got {value!r} of type {type_name(value)})")


def one_of(*allowed: Any) -> Validator:
    shown = ", ".join(str(a) for a in allowed)

    def check(inst: Any, attribute: Any, value: Any) -> None:
        # bool is an int subclass: True must not pass as 1.
        ok = any(value == a and type(value) is type(a) for a in allowed)
        if not ok:
            raise InvalidArgumentError(f"{_name(attribute)!r} must be one of {shown} (got {value!r})")

    return check


def int_in_range(lo: int | None = None, hi: int | None = None, *, optional: bool = False) -> Validator:
    """Integer (never bool) with ``lo <= value <= hi``; None allowed when ``optional``."""

    def check(inst: Any, attribute: Any, value: Any) -> None:
        if value is None and optional:
            return
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidArgumentError(
                f"{_name(attribute)!r} must be an integer{_range_text(lo, hi)} (got {value!r} of type {type_name(value)})"
            )
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise InvalidArgumentError(f"{_name(attribute)!r} must be{_range_text(lo, hi)} (got {value!r})")

    return check


def number_in_range(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
                    optional: bool = False) -> Validator:
    """Finite int or float (never bool); ``lo_open`` makes the lower bound exclusive."""

    def check(inst: Any, attribute: Any, value: Any) -> None:
        if value is None and optional:
            return
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or value in (
            float("inf"), float("-inf")):
            raise InvalidArgumentError(
                f"{_name(attribute)!r} must be a finite number (got {value!r} of type {type_name(value)})"
            )
        if lo is not None and (value <= lo if lo_open else value < lo):
            raise InvalidArgumentError(f"{_name(attribute)!r} must be {'>' if lo_open else '>='} {lo} (got {value!r})")
        if hi is not None and value > hi:
            raise InvalidArgumentError(f"{_name(attribute)!r} must be <= {hi} (got {value!r})")

    return check


def _range_text(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f" between {lo} and {hi}"
    if lo is not None:
        return f" >= {lo}"
    if hi is not None:
        return f" <= {hi}"
    return ""
