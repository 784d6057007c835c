"""``omniprof report``."""

from __future__ import annotations

import argparse

from omniprof.cli import _common as c


def report(ns: argparse.Namespace) -> int:
    from omniprof.core.readers import read_any

    reg, reporters, ropts = c.chosen_reporters(ns)
    executor = getattr(ns, "executor", None)
    if executor is not None:
        from omniprof.analysis import crossrank
        from omniprof.errors import UsageError

        if reporters != ["table"] or set(ropts.get("table", {})) - {"include_rank_parts", "width"}:
            raise UsageError("--executor prints the cross-rank section only: drop -r/-R, or drop --executor to "
                             "render other reports here")
        print(crossrank.analyze(ns.file, executor=executor).to_text(), end="")
        return 0
    if _cross_rank_only(ns, reporters, ropts):
        from omniprof.analysis import crossrank

        # Only the cross-rank section: each rank is read and reduced in a worker process, and only
        # small summaries meet here, so a many-rank run never sits whole in memory.
        print(crossrank.analyze(ns.file, workers=ns.workers).to_text(), end="")
        return 0
    from omniprof.cli.progress import progress

    with progress(f"reading {ns.file}"):
        result = read_any(ns.file, registry=reg)
    c.make_outdir(ns.outdir)
    return c.emit_reports(result, reporters, ropts, ns.outdir, reg)


def _cross_rank_only(ns: argparse.Namespace, reporters: list[str], ropts: dict) -> bool:
    from pathlib import Path

    if reporters != ["table"] or not Path(ns.file).is_dir():
        return False
    opts = ropts.get("table", {})
    if opts.get("include_rank_parts") not in (False, "false") or set(opts) - {"include_rank_parts", "width"}:
        return False
    from omniprof.analysis.crossrank import is_rank_dir

    return is_rank_dir(ns.file)
