"""JSON parsers for the columnar Kineto reader, measured on a real trace's events.

Each parser decodes the events of benchmarks/big_kineto.py's trace (the real AlexNet trace repeated,
``--copies`` copies) in the columnar reader's batches (about 4 MiB of whole events a call); times are
the best of ``--repeat`` runs in this process, with the load average beside them:

* ``json, one event a call``: today's full reader's tokenizer (``kineto_json.feed``, ``raw_decode``
  per event), events dropped;
* ``json, batches``: the standard library on the batches (``parse_float`` keeps decimals exact), to dicts;
* ``msgspec, batches, dicts``: ``msgspec.json.Decoder(float_hook=...)``, to dicts;
* ``msgspec, batches, structs``: the same into structs of the fields the reader reads (the rest
  skipped unbuilt): what :mod:`omniprof.formats.kineto_columns` uses;
* ``orjson, batches``: ``orjson.loads``; it has no float hook, so times with a fraction would come
  as floats and could be off by a nanosecond: listed for speed only.

Measured 2026-11-27 (2-core shared machine, load 4.7 -> 4.4; 47.4 MB, 234,138 events, one run each):
today's per-event reader 2.50 s (19.0 MB/s); json batches 1.77 s; msgspec dicts 0.85 s; msgspec
structs 0.67 s (71.1 MB/s, 3.7x the per-event reader); orjson 0.85 s (and inexact). So the reader
uses msgspec structs, with the standard library's batches as the fallback (1.4x today's reader).

Run: ``python benchmarks/kineto_parsers.py [--copies 171] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=171)
    ap.add_argument("--repeat", type=int, default=3)
    ns = ap.parse_args(argv)
    from big_kineto import DATA, generate

    from omniprof.formats import kineto_columns as kc
    from omniprof.formats.kineto_json import JsonStream, _Num, feed, open_text

    path = DATA / f"alexnet_x{ns.copies}.pt.trace.json"
    if not path.exists():
        generate(path, ns.copies)
    size = path.stat().st_size

    def batches(decode) -> int:
        n = 0
        with open(path, "rb") as fh:
            for b in kc._batches(fh, decode):
                if isinstance(b, list):
                    n += len(b)
        return n

    class Drop:
        n = 0

        def add(self, ev, where) -> None:
            self.n += 1

    def per_event() -> int:
        d = Drop()
        with open_text(path) as fh:
            feed(JsonStream(fh, str(path)), d, str(path))
        return d.n

    std = json.JSONDecoder(parse_float=_Num)
    cases = {"json, one event a call (today's reader)": per_event,
             "json, batches": lambda: batches(lambda b: std.decode(b.decode("utf-8")))}
    try:
        import msgspec

        dicts = msgspec.json.Decoder(float_hook=_Num)
        cases["msgspec, batches, dicts"] = lambda: batches(dicts.decode)
        cases["msgspec, batches, structs (the reader's)"] = lambda: batches(kc._decoder()[1])
    except ImportError:
        print("msgspec not installed: left out")
    try:
        import orjson

        cases["orjson, batches (floats inexact)"] = lambda: batches(orjson.loads)
    except ImportError:
        print("orjson not installed: left out")
    a = os.getloadavg()
    print(f"trace: {path.name}, {size / 1e6:.1f} MB; load average {a[0]:.2f} {a[1]:.2f} {a[2]:.2f}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'parser':42} {'best s':>8} {'MB/s':>8} {'events':>10}")
    for name, fn in cases.items():
        best, n = float("inf"), 0
        for _ in range(ns.repeat):
            t0 = time.perf_counter()
            n = fn()
            best = min(best, time.perf_counter() - t0)
        print(f"{name:42} {best:8.2f} {size / 1e6 / best:8.1f} {n:>10,}")
    a = os.getloadavg()
    print(f"load average after: {a[0]:.2f} {a[1]:.2f} {a[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
