"""Facts about this host that results record, found without spawning a process.

``platform.platform()`` runs ``uname -p`` in a subprocess on its first call (a fork and an exec:
milliseconds at every ``omniprof run``, more on a busy machine). On Linux the processor it reads
is either the machine name or ``unknown``, and ``platform.platform()`` drops both, so the same
string comes from ``os.uname()`` and the C library's version alone.
"""

from __future__ import annotations

import functools
import os
import sys

__all__ = ["platform_string"]


def _clean(*parts: str) -> str:
    """The parts joined as ``platform.platform()`` joins them (a filename-safe ``a-b-c``)."""
    text = "-".join(p.strip() for p in parts if p)
    for ch in ' /\\:;"()':
        text = text.replace(ch, "_" if ch == " " else "-")
    text = text.replace("unknown", "")
    while "--" in text:
        text = text.replace("--", "-")
    return text.rstrip("-")


@functools.lru_cache(maxsize=1)
def platform_string() -> str:
    """What ``platform.platform()`` returns (``Linux-6.8.0-x86_64-with-glibc2.35``), without a subprocess
    on Linux with glibc; elsewhere ``platform.platform()`` itself."""
    libc = ""
    if sys.platform.startswith("linux"):
        try:
            libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
        except (ValueError, OSError):
            libc = ""
    if not libc.startswith("glibc "):
        import platform

        return platform.platform()
    u = os.uname()
    return _clean(u.sysname, u.release, u.machine, "with", libc.replace(" ", ""))
