"""``omniprof plugins``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omniprof.cli import _common as c


def plugins(ns: argparse.Namespace) -> int:
    if ns.trust is not None:
        from omniprof.core.registry import trust_plugins_file

        store = trust_plugins_file(ns.trust)
        print(f"omniprof: {Path(ns.trust).resolve()} is trusted as it is now (a change needs --trust again); "
              f"recorded in {store}", file=sys.stderr)
        return 0
    reg = c.registry(ns)
    infos = reg.infos(probe=not ns.no_probe)
    rows = [("name", "kind", "source", "status")]
    for i in infos:
        rows.append((i.name, i.kind, i.source, i.status + (f": {i.reason}" if i.reason else "")))
    widths = [max(len(r[c]) for r in rows) for c in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
    for problem in reg.problems:
        print(f"warning: {problem}", file=sys.stderr)
    return 0
