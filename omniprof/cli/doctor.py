"""``omniprof doctor``."""

from __future__ import annotations

import argparse

from omniprof.cli import _common as c


def doctor(ns: argparse.Namespace) -> int:
    import json

    from omniprof.core.doctor import format_doctor, run_doctor

    report = run_doctor(c.registry(ns), frameworks=not ns.no_frameworks)
    print(json.dumps(report.to_dict(), indent=2) if ns.json else format_doctor(report))
    return 0
