"""``omniprof report``."""

from __future__ import annotations

import argparse

from omniprof.cli import _common as c


def report(ns: argparse.Namespace) -> int:
    from omniprof.core.readers import read_any

    reg = c.registry(ns)
    reporters = c.csv(ns.reporter, ["table"])
    ropts = c.reporter_options(ns.reporter_option, reporters)
    for name in reporters:
        reg.reporter(name)  # fail early on unknown names
    from omniprof.cli.progress import progress

    with progress(f"reading {ns.file}"):
        result = read_any(ns.file)
    c.make_outdir(ns.outdir)
    return c.emit_reports(result, reporters, ropts, ns.outdir, reg)
