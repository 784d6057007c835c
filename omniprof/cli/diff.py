"""``omniprof diff``."""

from __future__ import annotations

import argparse
import sys

from omniprof.cli import _common as c


def diff(ns: argparse.Namespace) -> int:
    from omniprof.analysis import diff as diffmod
    from omniprof.core.readers import read_any

    reg = c.registry(ns)
    if ns.vs is None and len(ns.files) != 2:
        print(f"omniprof diff: give two files (baseline, new), or the baseline's runs then --vs and the new "
              f"runs; got {len(ns.files)} file(s) and no --vs", file=sys.stderr)
        return 2
    a_files, b_files = (ns.files[:1], ns.files[1:]) if ns.vs is None else (ns.files, ns.vs)
    from omniprof.cli.progress import progress

    files = [*a_files, *b_files]
    read = []
    # Large traces take a while to read: a bar over the inputs on a terminal once it has run 0.3 s.
    with progress(f"reading {len(files)} inputs", total=len(files)) as task:
        for f in files:
            read.append(read_any(f, registry=reg))
            task(1)
    a, b = read[:len(a_files)], read[len(a_files):]
    d = diffmod.diff(a, b, threshold_pct=ns.threshold_pct, min_share_pct=ns.min_share_pct, alpha=ns.alpha,
                     repeats=ns.repeats, clip_calls=ns.clip_calls or None, time_noise_pct=ns.time_noise_pct)
    if ns.format == "json":
        import json

        print(json.dumps(d.to_dict(), indent=2))
    else:
        from omniprof.analysis.render import terminal_width

        sys.stdout.write(diffmod.format_diff(d, max_rows=ns.max_rows, width=terminal_width(sys.stdout)))
    if d.regressions:
        print(f"omniprof: {len(d.regressions)} regression(s) past {ns.threshold_pct}%", file=sys.stderr)
        if ns.fail_on_regression:
            return 1
    return 0
