"""The reliability fuzz campaign: every reader x every reporter on mutated real inputs.

    python benchmarks/fuzz_campaign.py [--cases N] [--seed S] [--timeout-s T]

Seeds: a real cpu-backend result, a result with every part kind (omniprof.testing.make_result), a
real Kineto trace (``kineto/triton_cuda_trace.json.gz`` of the shared data folder, found as the
tests find it, else a small one made here) and an XSpace serialised by jaxlib. Each case mutates one
seed: a JSON value replaced by a hostile one (ints of 5,000 digits or >= 2^64, NaN/Infinity, lone
surrogates, terminal escape sequences, 600-deep nesting, wrong types), bytes
truncated/flipped/appended, or the whole file gzipped. The case is read with
``omniprof.core.readers.read_any`` and, when it reads, written by every reporter; each output is
then read back by an independent reader:

    json        omniprof.load (must equal the result written)
    chrome      Python's strict JSON parser (no NaN/Infinity/True), UTF-8, traceEvents present
    perfetto    Perfetto's own Trace protobuf class (perfetto package), packets parsed
    pprof       profile.proto decoded by tests/unit/reporters/pprof_decode.py, ids consistent
    speedscope  speedscope's JSON schema (.ci/cache/speedscope), when present; else strict JSON
    collapsed   every line "frame;frame count" with a non-negative integer count
    table       text with no raw control characters
    tensorboard the .xplane.pb written reads back with read_any
    html        the standard library's HTML parser: strict UTF-8, only the report's two scripts,
                the flame-graph data block strict JSON

Cases run in a worker process; the parent counts a **hang** when a case takes longer than the
timeout and a **crash** when the worker dies (signal, segfault), then starts a new worker.
A **traceback** is any exception that is not an OmniprofError (one-line error) from reading or
writing; a **corrupt output** is an output its reader rejects. Printed at the end:

    inputs tried, read / refused, reporter runs, tracebacks, hangs, crashes, corrupt outputs
"""

from __future__ import annotations

import argparse
import collections
import copy
import gzip
import io
import json
import multiprocessing as mp
import os
import random
import re
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REPORTERS = ("table", "json", "chrome", "perfetto", "speedscope", "pprof", "collapsed", "tensorboard", "html")
HOSTILE_VALUES = [
    "9" * 5000, 2**64, 2**63, -(2**63) - 1, -1, 0, float("nan"), float("inf"), "NaN", "Infinity", True, None,
    "\ud800", "caf\udce9.py", "\x1b[2J\x1b]0;title\x07", "a\nb", "", [], {}, [1, 2], {"k": 1}, "x" * 10000,
]
# C0/C1 control characters and bidi overrides (what test_terminal.py forbids on a terminal too).
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


# -- seeds --------------------------------------------------------------------------------------
def seeds(tmp: Path) -> dict[str, tuple[str, bytes]]:
    import omniprof
    from omniprof.testing.fakes import make_result

    out: dict[str, tuple[str, bytes]] = {}
    with omniprof.Profiler(backend="cpu") as prof:
        sum(i * i for i in range(300_000))
    out["cpu_result"] = ("r.result.json", prof.result.to_json().encode())
    out["full_result"] = ("f.result.json", make_result().to_json().encode())
    from tests.tools import find_shared_data

    kineto = find_shared_data("kineto", "triton_cuda_trace.json.gz")
    if kineto is not None:
        out["kineto"] = ("k.pt.trace.json", gzip.decompress(kineto.read_bytes()))
    else:
        ev = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1, "ts": i * 10, "dur": 5,
               "args": {"Input Dims": [[2, 2]]}} for i in range(50)]
        out["kineto"] = ("k.pt.trace.json", json.dumps({"schemaVersion": 1, "traceEvents": ev}).encode())
    try:
        from tests.unit.backends.xla_helpers import write_gpu_xplane

        out["xplane"] = ("h.xplane.pb", write_gpu_xplane(tmp / "seed.xplane.pb").read_bytes())
    except Exception:  # no jax here
        pass
    return out


def _paths(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:30]):  # long lists: the first 30 items are representative
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def _set(obj, path, value):
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def mutate(rng: random.Random, name: str, data: bytes) -> tuple[str, bytes, str]:
    """(file name, bytes, description) of one mutation of a seed."""
    how = rng.choice(["value", "value", "value", "deep", "truncate", "flip", "append", "gzip", "gzip-value"])
    if name.endswith(".pb") and how in ("value", "deep", "gzip-value"):
        how = rng.choice(["truncate", "flip", "append"])
    if how in ("value", "deep", "gzip-value"):
        doc = json.loads(data)
        paths = list(_paths(doc))
        path = rng.choice(paths)
        value = copy.deepcopy(rng.choice(HOSTILE_VALUES))
        label = repr(value)[:40]
        if how == "deep":
            value = 1
            levels = rng.choice([100, 600, 2000])
            for _ in range(levels):
                value = {"k": value} if rng.random() < 0.5 else [value]
            label = f"{levels} levels deep"
        _set(doc, path, value)
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(20_000)  # the generator's own encoder must reach 2,000 levels
        try:
            text = json.dumps(doc, ensure_ascii=rng.random() < 0.5, allow_nan=True)
        finally:
            sys.setrecursionlimit(limit)
        raw = text.encode("utf-8", "surrogatepass")
        if how == "gzip-value":
            return name + ".gz", gzip.compress(raw), f"{how} {path[-3:]} = {label}"
        return name, raw, f"{how} {path[-3:]} = {label}"
    if how == "truncate":
        n = rng.randrange(0, max(len(data), 1))
        return name, data[:n], f"truncate at {n}"
    if how == "flip":
        b = bytearray(data)
        for _ in range(rng.choice([1, 4, 32])):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        return name, bytes(b), "flip bits"
    if how == "append":
        return name, data + bytes(rng.randrange(256) for _ in range(rng.choice([1, 100]))), "append garbage"
    return name + ".gz", gzip.compress(data), "gzip"


# -- checking outputs ---------------------------------------------------------------------------
def _strict_json(data: bytes):
    def bad(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(data.decode("utf-8"), parse_constant=bad)


def check_output(name: str, path: Path, result, schema) -> str | None:
    """None when ``path`` (written by reporter ``name``) reads back; else what is wrong."""
    import omniprof

    try:
        if name == "json":
            if omniprof.load(path) != result:
                return "reads back to a different result"
        elif name == "chrome":
            data = path.read_bytes()
            doc = _strict_json(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
            if not isinstance(doc.get("traceEvents"), list):
                return "no traceEvents"
        elif name == "perfetto":
            from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

            t = Trace()
            t.ParseFromString(path.read_bytes())
            if not t.packet:
                return "no packets"
        elif name == "pprof":
            from tests.unit.reporters.pprof_decode import decode

            prof = decode(path.read_bytes())
            locs = {loc.id for loc in prof.location}
            if any(i not in locs for s in prof.sample for i in s.location_id):
                return "sample refers to a missing location"
            if len(prof.string_table) == 0 or prof.string_table[0] != "":
                return "string table must start with ''"
        elif name == "speedscope":
            doc = _strict_json(path.read_bytes())
            if schema is not None:
                import jsonschema

                jsonschema.validate(doc, schema)
        elif name == "collapsed":
            for line in path.read_text(encoding="utf-8").splitlines():
                stack, _, count = line.rpartition(" ")
                if not stack or not count.isdigit():
                    return f"bad line {line[:60]!r}"
        elif name == "table":
            if RAW_CONTROL.search(path.read_text(encoding="utf-8")):
                return "raw control character in the table"
        elif name == "html":
            return _check_html(path, result)
        elif name == "tensorboard":
            from omniprof.core.readers import read_any

            files = list(path.rglob("*.xplane.pb"))
            for f in files:
                read_any(f)
    except Exception as e:  # noqa: BLE001 - the reader's verdict
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    return None


def _check_html(path: Path, result) -> str | None:
    """The HTML report parsed by the standard library's HTML parser: strict UTF-8, exactly the
    report's own two scripts when the result has samples (none otherwise: a name cannot open or
    close a script), and its flame-graph data strict JSON."""
    from html.parser import HTMLParser

    class Scan(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.scripts: list[dict] = []
            self.in_script: dict | None = None

        def handle_starttag(self, tag, attrs):
            if tag == "script":
                self.in_script = {"attrs": dict(attrs), "text": ""}
                self.scripts.append(self.in_script)

        def handle_endtag(self, tag):
            if tag == "script":
                self.in_script = None

        def handle_data(self, data):
            if self.in_script is not None:
                self.in_script["text"] += data

    text = path.read_bytes().decode("utf-8")
    scan = Scan()
    scan.feed(text)
    scan.close()
    flame = any(part.samples for part in result.parts)
    if len(scan.scripts) != (2 if flame else 0):  # a result without samples has no flame graph
        return f"{len(scan.scripts)} <script> elements, not the report's {2 if flame else 0}"
    if not flame:
        return None
    data = [x for x in scan.scripts if x["attrs"].get("id") == "fg-data"]
    if len(data) != 1 or data[0]["attrs"].get("type") != "application/json":
        return "no flame-graph data block"
    doc = _strict_json(data[0]["text"].encode("utf-8"))
    if not isinstance(doc, dict) or "c" not in doc:
        return "flame-graph data is not a tree"
    return None


# -- one case, in the worker -----------------------------------------------------------------------
def run_case(fname: str, data: bytes, tmp: str, schema) -> dict:
    import omniprof
    from omniprof.core.readers import read_any
    from omniprof.errors import OmniprofError

    d = Path(tempfile.mkdtemp(dir=tmp))
    src = d / fname
    src.write_bytes(data)
    out: dict = {"read": None, "reports": 0, "tracebacks": [], "corrupt": [], "refused": 0}
    try:
        result = read_any(src)
    except OmniprofError as e:
        out["read"] = "refused"
        if "\n" in str(e):
            out["tracebacks"].append(f"read: multi-line error: {str(e)[:200]!r}")
        return out
    except BaseException as e:  # noqa: BLE001
        out["read"] = "traceback"
        out["tracebacks"].append("read: " + "".join(traceback.format_exception_only(type(e), e)).strip()[:300])
        return out
    out["read"] = "read"
    for rep in REPORTERS:
        dest = d / f"out-{rep}"
        try:
            if rep == "table":
                buf = io.StringIO()
                omniprof.report(result, "table", buf)
                (d / "table.txt").write_text(buf.getvalue(), encoding="utf-8", errors="strict")
                written = d / "table.txt"
            else:
                written = omniprof.report(result, rep, dest)
        except OmniprofError:
            out["refused"] += 1
            continue
        except BaseException as e:  # noqa: BLE001
            out["tracebacks"].append(f"{rep}: " + "".join(traceback.format_exception_only(type(e), e)).strip()[:300])
            continue
        out["reports"] += 1
        problem = check_output(rep, Path(written), result, schema)
        if problem:
            out["corrupt"].append(f"{rep}: {problem}")
    return out


def worker(conn, tmp: str) -> None:
    warnings.simplefilter("ignore")
    schema = None
    sp = ROOT / ".ci" / "cache" / "speedscope" / "release" / "file-format-schema.json"
    if sp.is_file():
        schema = json.loads(sp.read_text(encoding="utf-8"))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        conn.send(run_case(*msg, tmp, schema))


# -- the parent ---------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    os.environ.setdefault("OMNIPROF_CHECKPOINT_S", "0")
    ctx = mp.get_context("spawn")
    tally = collections.Counter()
    by_seed = collections.Counter()
    problems: list[str] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="omniprof-fuzz-") as tmp:
        seed_files = seeds(Path(tmp))
        rng = random.Random(args.seed)

        def start():
            a, b = ctx.Pipe()
            p = ctx.Process(target=worker, args=(b, tmp), daemon=True)
            p.start()
            return p, a

        proc, conn = start()
        for i in range(args.cases):
            seed = rng.choice(sorted(seed_files))
            name, data = seed_files[seed]
            fname, raw, what = mutate(rng, name, data)
            by_seed[seed] += 1
            tally["inputs"] += 1
            conn.send((fname, raw))
            if not conn.poll(args.timeout_s):
                tally["hangs"] += 1
                problems.append(f"hang: {seed}: {what}")
                proc.kill()
                proc.join()
                proc, conn = start()
                continue
            try:
                r = conn.recv()
            except EOFError:
                proc.join()
                tally["crashes"] += 1
                problems.append(f"crash (exit {proc.exitcode}): {seed}: {what}")
                proc, conn = start()
                continue
            tally[r["read"]] += 1
            tally["reporter runs"] += r["reports"] + r["refused"] + len(r["tracebacks"]) * (r["read"] == "read")
            tally["reports refused"] += r["refused"]
            tally["tracebacks"] += len(r["tracebacks"])
            tally["corrupt outputs"] += len(r["corrupt"])
            problems += [f"traceback: {seed}: {what}: {t}" for t in r["tracebacks"]]
            problems += [f"corrupt: {seed}: {what}: {c}" for c in r["corrupt"]]
        conn.send(None)
        proc.join(10)
    wall = time.perf_counter() - t0
    print(f"omniprof fuzz campaign: {len(seed_files)} seeds x mutations, readers {{result, kineto, xplane}} x "
          f"{len(REPORTERS)} reporters, seed {args.seed}, {wall:.0f} s")
    print(f"  inputs tried      {tally['inputs']}  ({', '.join(f'{k} {v}' for k, v in sorted(by_seed.items()))})")
    print(f"  read / refused    {tally['read']} / {tally['refused']}  (refused: one-line TraceReadError)")
    print(f"  reporter runs     {tally['reporter runs']}  (refused with one line: {tally['reports refused']})")
    for key in ("tracebacks", "hangs", "crashes", "corrupt outputs"):
        print(f"  {key:<17} {tally[key]}")
    for p in problems[:40]:
        print("   ", p)
    return 1 if any(tally[k] for k in ("tracebacks", "hangs", "crashes", "corrupt outputs")) else 0


if __name__ == "__main__":
    sys.exit(main())
