"""``omniprof diff``."""

from __future__ import annotations

import argparse
import sys

from omniprof.cli import _common as c


def diff(ns: argparse.Namespace) -> int:
    from omniprof.analysis import diff as diffmod
    from omniprof.core.readers import read_any

    c.registry(ns)
    a, b = read_any(ns.a), read_any(ns.b)
    d = diffmod.diff(a, b, threshold_pct=ns.threshold_pct, min_share_pct=ns.min_share_pct)
    if ns.format == "json":
        import json

        print(json.dumps(d.to_dict(), indent=2))
    else:
        sys.stdout.write(diffmod.format_diff(d, max_rows=ns.max_rows))
    if d.regressions:
        print(f"omniprof: {len(d.regressions)} regression(s) past {ns.threshold_pct}%", file=sys.stderr)
        if ns.fail_on_regression:
            return 1
    return 0
