"""Human-readable durations and sizes, shared by every text report."""

from __future__ import annotations

__all__ = ["format_ns", "format_bytes"]


def format_ns(ns: float) -> str:
    """``1.234 s``, ``12.30 ms``, ``4.50 us`` or ``800 ns``; a negative duration (a delta) keeps its sign
    and the unit of its size (``-1.50 us``)."""
    sign, a = ("-", -ns) if ns < 0 else ("", ns)
    if a >= 1e9:
        return f"{sign}{a / 1e9:.3f} s"
    if a >= 1e6:
        return f"{sign}{a / 1e6:.2f} ms"
    if a >= 1e3:
        return f"{sign}{a / 1e3:.2f} us"
    return f"{sign}{a:.0f} ns"


def format_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``3.0 MiB`` ... in binary units."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover
