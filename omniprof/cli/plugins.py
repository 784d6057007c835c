"""``omniprof plugins``."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from omniprof.analysis.render import Column, print_table, terminal_width
from omniprof.cli import _common as c


def plugins(ns: argparse.Namespace) -> int:
    if ns.trust is not None:
        return _trust(ns.trust)
    reg = c.registry(ns)
    infos = reg.infos(probe=not ns.no_probe)
    width = terminal_width(sys.stdout)
    # Piped: one line a plugin, its reason inline (for grep). On a terminal the reasons, often long,
    # go under the table, wrapped at words, so the table fits and nothing is cut.
    inline = width is None
    rows = [[i.name, i.kind, i.source, i.status + (f": {i.reason}" if i.reason and inline else "")] for i in infos]
    columns = [Column("name", kind="label"), Column("kind", kind="label"), Column("source", min_width=24),
               Column("status", min_width=30)]
    print_table(sys.stdout, columns, rows, width=width)
    for i in infos:
        if i.reason and not inline:
            print("\n".join(textwrap.wrap(f"{i.name} {i.status}: {i.reason}", width, subsequent_indent="    ",
                                           break_long_words=False, break_on_hyphens=False)))
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
