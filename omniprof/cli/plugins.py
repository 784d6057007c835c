"""``omniprof plugins``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omniprof.cli import _common as c


def plugins(ns: argparse.Namespace) -> int:
    if ns.trust is not None:
        return _trust(ns.trust)
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


def _trust(path: str) -> int:
    """``--trust FILE``: a plugins.toml, or a config file (``omniprof.toml``, ``pyproject.toml``)
    whose ``env``, ``plugins`` and outside paths then apply when it is found in the working
    directory. Its format is checked first (a broken file is not trusted); one store for both."""
    from omniprof.core.registry import trust_plugins_file
    from omniprof.core.trust import trust_file

    if Path(path).name in ("omniprof.toml", "pyproject.toml"):
        from omniprof.config import read_layers

        read_layers(path)  # a ConfigError (exit 2) for invalid TOML or a pyproject without [tool.omniprof]
        store = trust_file(path)
        what = "its env, plugins and paths outside its directory apply when it is found"
    else:
        store = trust_plugins_file(path)
        what = "it is loaded from the working directory"
    print(f"omniprof: {Path(path).resolve()} is trusted as it is now ({what}; a change needs --trust again); "
          f"recorded in {store}", file=sys.stderr)
    return 0
