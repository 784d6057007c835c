"""``omniprof dump PID``: every thread's Python stack of a running CPython, read from outside."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from omniprof.errors import LiveTargetError

#: exit status when the target cannot be read (gone, not Python, no permission)
CANNOT_READ = 2


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dump", help="print every thread's Python stack of a running CPython 3.10-3.13 process",
                       usage="omniprof dump PID [--json]")
    p.add_argument("pid", type=int, metavar="PID", help="the process to read (it needs no omniprof)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")


def _thread_text(t: Any) -> list[str]:
    tags = [f"native {t.native_id}"] if t.native_id else []
    if t.holds_gil:
        tags.append("holds the GIL")
    if t.torn:
        tags.append("stack changed while read: not shown")
    lines = [f"Thread {t.thread_id:#x} {t.name!r} ({', '.join(tags)})" if tags else f"Thread {t.thread_id:#x} {t.name!r}"]
    if not t.frames and not t.torn:
        lines.append("    (no Python frames)")
    lines += [f"    {f.name} ({f.file}:{f.line})" for f in t.frames]
    if t.truncated:
        lines.append("    ... (deeper frames not read)")
    return lines


def dump(ns: argparse.Namespace) -> int:
    from omniprof.live.reader import PythonProcess

    try:
        proc = PythonProcess(ns.pid)
        threads = proc.stacks()
    except LiveTargetError as e:
        print(f"omniprof: error: {e}", file=sys.stderr)
        return CANNOT_READ
    version = f"{proc.version[0]}.{proc.version[1]}"
    if ns.json:
        doc = {"pid": ns.pid, "python": version, "binary": proc.layout.binary,
               "threads": [{"thread_id": t.thread_id, "native_id": t.native_id, "name": t.name,
                            "holds_gil": t.holds_gil, "torn": t.torn, "truncated": t.truncated,
                            "frames": [{"name": f.name, "file": f.file, "line": f.line} for f in t.frames]}
                           for t in threads]}
        print(json.dumps(doc, indent=1))
        return 0
    out = [f"Process {ns.pid}: CPython {version} ({proc.layout.binary}); innermost frame first"]
    for t in threads:
        out.append("")
        out += _thread_text(t)
    print("\n".join(out))
    return 0
