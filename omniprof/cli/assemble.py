"""``omniprof assemble``: join the parts of a streaming heap snapshot into one ``.heapsnapshot``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omniprof.errors import UsageError

_PART_SUFFIXES = (".nodes", ".edges", ".strings", ".metadata.json")


def assemble(ns: argparse.Namespace) -> int:
    from omniprof.backends.memory.heapsnapshot import assemble_snapshot
    from omniprof.cli.progress import progress

    prefix = ns.prefix
    for suffix in _PART_SUFFIXES:  # a part's own name (tab completion) names its prefix too
        if prefix.endswith(suffix) and not Path(prefix + ".nodes").exists():
            prefix = prefix[: -len(suffix)]
            break
    missing = [prefix + s for s in _PART_SUFFIXES[:3] if not Path(prefix + s).is_file()]
    if missing:
        raise UsageError(f"omniprof assemble: {prefix!r} is not the prefix of a streaming heap snapshot (missing "
                         f"{', '.join(missing)}); give the path passed to take_heap_snapshot(..., streaming=True)")
    out = Path(ns.output or prefix)
    if out.exists():
        raise UsageError(f"omniprof assemble: {str(out)!r} exists and is never replaced; name another file with "
                         f"-o FILE, or remove it")
    with progress(f"assembling {out.name}") as task:
        counts = assemble_snapshot(prefix, out, progress=task.update)
    print(f"omniprof: heap snapshot written to {out} ({counts['nodes']:,} nodes, {counts['edges']:,} edges)",
          file=sys.stderr)
    lost = []
    if not counts["complete"]:
        lost.append("the snapshot's walk did not finish (the process ended during it)")
    if counts["dropped_edges"]:
        lost.append(f"{counts['dropped_edges']:,} edges to objects without a node dropped")
    if counts["truncated_lines"]:
        lost.append(f"{counts['truncated_lines']:,} cut-off lines dropped")
    if lost:
        print(f"omniprof: warning: {'; '.join(lost)}", file=sys.stderr)
    return 0
