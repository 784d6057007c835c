"""``omniprof collect``."""

from __future__ import annotations

import argparse
import sys

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
    reporters = c.csv(ns.reporter, [])
    for name in reporters:
        reg.reporter(name)
    got = collect(ns.addresses, ns.duration_ms, ns.logdir, options=options, perfetto_trace=True,
                  perfetto_link=not ns.no_perfetto_link, perfetto_port=ns.perfetto_port,
                  perfetto_timeout_s=ns.perfetto_timeout_s, num_tracing_attempts=ns.attempts, verbose=ns.verbose,
                  announce=lambda text: print(text, file=sys.stderr, flush=True))
    print(f"omniprof: captured {len(got.files)} host(s) into {got.run_dir}", file=sys.stderr)
    for f in got.files:
        print(f"  {f.name}", file=sys.stderr)
    status = c.emit_reports(got.result, reporters, {}, ns.outdir, reg) if reporters else 0
    return status
