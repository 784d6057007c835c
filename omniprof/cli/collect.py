"""``omniprof collect``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omniprof.cli import _common as c
from omniprof.errors import UsageError


def collect(ns: argparse.Namespace) -> int:
    from omniprof.backends.xla.remote import collect

    reg = c.registry(ns)
    from omniprof.config import cli_layer
    from omniprof.core.options import ProfileOptions

    layer = cli_layer(options=ns.option)  # the one -O parser, as `omniprof run` reads it
    if layer.data.get("backends"):
        raise UsageError("omniprof collect: -O takes profile options only (host_tracer_level=..., advanced keys)")
    options = ProfileOptions.from_dict(layer.data.get("options", {}))
    if not 0 <= ns.perfetto_port <= 65535:
        raise UsageError(f"omniprof collect: --perfetto-port must be between 0 and 65535 (got {ns.perfetto_port})")
    if ns.perfetto_timeout_s <= 0:
        raise UsageError(f"omniprof collect: --perfetto-timeout-s must be > 0 (got {ns.perfetto_timeout_s})")
    reporters = c.csv(ns.reporter, [])
    for name in reporters:
        reg.reporter(name)
    from omniprof.cli.progress import progress

    # The capture and then the server's conversion can take many seconds: say so at once.
    print(f"omniprof: capturing {ns.duration_ms / 1000:g} s from {ns.addresses}; the server then converts the "
          f"trace, which can take longer than the capture itself...", file=sys.stderr, flush=True)
    with progress(f"capturing from {ns.addresses}"):
        got = collect(ns.addresses, ns.duration_ms, ns.logdir, options=options, perfetto_trace=True,
                      num_tracing_attempts=ns.attempts, verbose=ns.verbose)
    print(f"omniprof: captured {len(got.files)} host(s) into {got.run_dir}", file=sys.stderr)
    for f in got.saved:
        print(f"  {f.name}", file=sys.stderr)
    status = c.emit_reports(got.result, reporters, {}, ns.outdir, reg) if reporters else 0
    # Last: everything is saved and reported, so no port, timeout or Ctrl-C can lose any of it.
    if not ns.no_perfetto_link and got.perfetto_trace is not None:
        _serve_link(got.perfetto_trace, ns.perfetto_port, ns.perfetto_timeout_s, [str(f) for f in got.saved])
    return status


def _serve_link(path: Path, port: int, timeout_s: float, saved: list[str]) -> None:
    """The Perfetto link of saved files: a port that cannot be bound, a timeout or Ctrl-C is a
    warning line naming what was saved, never an error."""
    import warnings

    from omniprof.viewers.serve import PerfettoLinkWarning, serve_perfetto_link

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PerfettoLinkWarning)
        serve_perfetto_link(path, port=port, wait=True, timeout_s=timeout_s, saved=saved)
    for w in caught:
        if issubclass(w.category, PerfettoLinkWarning):
            print(f"omniprof: warning: {w.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
