"""Write a big Kineto trace from a real one: its events repeated, each copy shifted in time.

The source is the real AlexNet GPU trace in shared/data/kineto (HTA's own test data, recorded on an
A100: 1,408 events, 0.32 MB). Copy ``k`` of its events is shifted by ``k`` times the trace's length
(plus 1 ms), and its ids (``correlation``, ``External id``, flow ``id``) by ``k`` times the largest
id, so launches still link to their own kernels and every copy nests as the original does. The
metadata events (``ph: M``) are written once and the profiler's session span (``cat: Trace``) once,
covering every copy. 1,710 copies give about 477 MB and 2.4 M events.

The file is written as it is generated (one copy of the events in memory, never the whole trace),
under ``benchmarks/.data/`` (git-ignored) unless told where.

Run: ``python benchmarks/big_kineto.py [--copies 1710] [--out PATH]``
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / ".data"
_MARK = "\x00"


def _source() -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.tools import find_shared_data

    src = find_shared_data("kineto", "alexnet_cuda_trace.json.gz")
    if src is None:
        raise SystemExit("kineto/alexnet_cuda_trace.json.gz not found in the shared data folder")
    return Path(src)


def _templates(events: list[dict]) -> tuple[list[list[str]], list[list[str]]]:
    """Each event as JSON text split at its shifted fields; the fields' kinds ('t' time, 'i' id)."""
    parts, kinds = [], []
    for ev in events:
        ev = json.loads(json.dumps(ev))
        k: list[str] = []
        vals: list[int] = []
        if "ts" in ev:
            vals.append(ev["ts"])
            ev["ts"] = _MARK
            k.append("t")
        if ev.get("ph") in ("s", "f", "t") and isinstance(ev.get("id"), int):
            vals.append(ev["id"])
            ev["id"] = _MARK
            k.append("i")
        args = ev.get("args")
        if isinstance(args, dict):
            for key in ("correlation", "External id"):
                if isinstance(args.get(key), int) and args[key] > 0:
                    vals.append(args[key])
                    args[key] = _MARK
                    k.append("i")
        text = json.dumps(ev, separators=(", ", ": "))
        pieces = text.split(json.dumps(_MARK))
        parts.append(pieces)
        kinds.append(list(zip(k, vals)))  # type: ignore[arg-type]
    return parts, kinds  # type: ignore[return-value]


def generate(out: Path, copies: int, source: Path | None = None) -> dict[str, int]:
    """Write ``copies`` shifted copies of the source trace's events to ``out``; returns counts."""
    src = source or _source()
    with gzip.open(src, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    events = doc.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]
    session = [e for e in events if e.get("cat") == "Trace"]
    body = [e for e in events if e.get("ph") != "M" and e.get("cat") != "Trace"]
    times = [e["ts"] for e in body if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e.get("dur", 0) for e in body if isinstance(e.get("ts"), (int, float))]
    lo, hi = min(times), max(ends)
    if any(not isinstance(t, int) for t in times):
        raise SystemExit("the generator shifts integer-µs traces only")
    period_us = hi - lo + 1000
    ids = [v for e in body for v in ([e.get("id")] + [(e.get("args") or {}).get(k) for k in ("correlation", "External id")])
           if isinstance(v, int)]
    id_stride = max(ids) + 1
    parts, kinds = _templates(body)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as fh:
        head = {k: v for k, v in doc.items()}
        fh.write("{\n")
        for k, v in head.items():
            fh.write(f"  {json.dumps(k)}: {json.dumps(v)},\n")
        fh.write('  "traceEvents": [\n')
        first = True
        for ev in meta:
            fh.write(("" if first else ",\n") + "  " + json.dumps(ev, separators=(", ", ": ")))
            first = False
            n += 1
        for ev in session:
            ev = dict(ev, ts=lo, dur=period_us * copies)
            fh.write(("" if first else ",\n") + "  " + json.dumps(ev, separators=(", ", ": ")))
            first = False
            n += 1
        for c in range(copies):
            dt, di = c * period_us, c * id_stride
            chunk = []
            for pieces, fields in zip(parts, kinds):
                text = pieces[0]
                for (kind, v), piece in zip(fields, pieces[1:]):
                    text += str(v + (dt if kind == "t" else di)) + piece
                chunk.append(text)
            fh.write(("" if first else ",\n") + "  " + ",\n  ".join(chunk))
            first = False
            n += len(chunk)
        fh.write("\n  ]\n}\n")
    os.replace(tmp, out)
    return {"events": n, "bytes": out.stat().st_size, "copies": copies}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=1710)
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args(argv)
    out = ns.out or DATA / f"alexnet_x{ns.copies}.pt.trace.json"
    info = generate(out, ns.copies)
    print(f"{out}: {info['events']:,} events, {info['bytes'] / 1e6:.1f} MB ({info['copies']} copies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
