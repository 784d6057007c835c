"""``omniprof diff A B --fail-on-regression`` on one sampled run a side: noise or change?

A realistic script (parse a JSON document, tokenize, count words, hash, sort records, format a
report, a numeric loop: eight functions from 2% to 40% of the run) runs under ``omniprof run -r
json``, as a CI job would. Each pair is judged by the real command, in a subprocess:

* identical: two runs of the very same script. Target: exit 0 every time (0 false alarms).
* slower: a base run against a run with one function (``checksum``, about a quarter of the run)
  made 3x slower (it hashes its input three times). Target: exit 1 every time, naming
  ``checksum`` and no other function.

Runs alternate (base, identical, slower; the order rotates every pair) so machine load hits each
alike. ``--busy N`` starts N busy processes (``python3 -c 'while True: pass'``) beside the runs and
stops them after, by pid. The 1-minute load average is printed at the start and the end beside
the counts.

Measured 2026-11-27 18:45-19:01 (``--pairs 20 --busy 2``, this project's shared 2-core machine,
load average 14.9-23.1 beside it): identical pairs failing 0 of 20; 3x slower ``checksum`` caught
12 of 20, no other function ever flagged. At that load a run's samples vary 4-45 times more than
independent draws (the dispersion each pair reports) and identical runs' wall times differ up to
5x: the misses are pairs where the samples carry too little, not a bias of the test.

Measured 2026-11-27 18:45-19:01 (``--pairs 20 --busy 2``, this project's shared 2-core machine,
load average 14.9-23.1 beside it): identical pairs failing 0 of 20; 3x slower ``checksum`` caught
12 of 20, no other function ever flagged. At that load a run's samples vary 4-45 times more than
independent draws (the dispersion each pair reports) and identical runs' wall times differ up to
5x: the misses are pairs whose samples carry too little, not a bias of the test.

Run: ``python benchmarks/diff_gate.py [--pairs 20] [--busy 2] [--keep DIR]`` (``--keep`` leaves
every run's result there, to judge them again offline).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

WORKLOAD = '''
import hashlib, json, re, sys

SLOW = int(sys.argv[1]) if len(sys.argv) > 1 else 1
DOC = json.dumps([{"id": i, "name": f"item {i}", "tags": ["a", "b", str(i % 7)], "text": "lorem ipsum dolor " * 8}
                  for i in range(400)])


def parse(doc):
    return json.loads(doc)


def tokenize(records):
    return [w for r in records for w in re.findall(r"[a-z]+", r["text"])]


def count_words(words):
    counts = {}
    for w in words:
        counts[w] = counts.get(w, 0) + 1
    return counts


def checksum(records):
    h = hashlib.sha256()
    for _ in range(SLOW):
        for r in records:
            for _ in range(4):
                h.update(repr(r).encode())
    return h.hexdigest()


def sort_records(records):
    return sorted(records, key=lambda r: (r["tags"][2], -r["id"]))


def render(records):
    return "\\n".join(f"{r['id']:>5} {r['name']:<12} {','.join(r['tags'])}" for r in records)


def numeric(n):
    s = 0.0
    for i in range(n):
        s += (i % 13) * 0.5 - (i % 7) * 0.25
    return s


def main():
    out = 0
    for _ in range(15):
        records = parse(DOC)
        words = tokenize(records)
        out += len(count_words(words))
        out += len(checksum(records))
        out += len(sort_records(records))
        out += len(render(records))
        out += int(numeric(25_000))
    print(out)


main()
'''


def load() -> float:
    return os.getloadavg()[0]


def omniprof(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "omniprof", *args], capture_output=True, text=True)


def record(workload: Path, out: Path, slow: int) -> Path:
    proc = omniprof("run", "--no-config", "-r", "json", "-o", str(out), str(workload), str(slow))
    if proc.returncode != 0:
        raise SystemExit(f"run failed: {proc.stderr}")
    return Path(proc.stderr.split("json report written to ")[1].split()[0])


def regressed(a: Path, b: Path) -> tuple[int, list[str]]:
    """The exit status of ``omniprof diff A B --fail-on-regression`` and the functions it flagged."""
    import json

    proc = omniprof("diff", str(a), str(b), "--fail-on-regression", "--format", "json")
    if proc.returncode not in (0, 1):
        raise SystemExit(f"diff failed: {proc.stderr}")
    d = json.loads(proc.stdout)
    names = [r["key"].split()[0] for t in d["tables"] for r in t["rows"] if r["regressed"]]
    return proc.returncode, names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--busy", type=int, default=0, help="busy processes beside the runs")
    ap.add_argument("--keep", default=None, help="leave every run's result in this directory")
    ns = ap.parse_args()
    work = Path(ns.keep or tempfile.mkdtemp(prefix="omniprof-diff-gate-"))
    work.mkdir(parents=True, exist_ok=True)
    workload = work / "workload.py"
    workload.write_text(textwrap.dedent(WORKLOAD))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(ns.busy)]
    try:
        load0, t0 = load(), time.perf_counter()
        false_pos, true_pos, wrong = 0, 0, []
        for i in range(ns.pairs):
            order = [("base", 1), ("same", 1), ("slow", 3)]
            order = order[i % 3:] + order[:i % 3]
            paths = {name: record(workload, work / f"{name}-{i:02d}", slow) for name, slow in order}
            rc_same, names_same = regressed(paths["base"], paths["same"])
            rc_slow, names_slow = regressed(paths["base"], paths["slow"])
            false_pos += rc_same != 0
            true_pos += rc_slow == 1 and "checksum" in names_slow
            if [n for n in names_slow if n not in ("checksum", "(total)")]:
                wrong.append(names_slow)
            print(f"pair {i + 1:2d}: identical exit {rc_same} {names_same or ''}  3x slower exit {rc_slow} "
                  f"{names_slow}  load {load():.1f}", flush=True)
        print(f"\nidentical pairs failing (false positives): {false_pos} of {ns.pairs} (target 0)")
        print(f"3x slower checksum caught (true positives): {true_pos} of {ns.pairs} (target {ns.pairs})")
        print(f"pairs flagging another function: {len(wrong)}")
        print(f"busy processes beside: {ns.busy}; load average (1 min) {load0:.1f} at the start, {load():.1f} "
              f"at the end; {os.cpu_count()} cores; {time.perf_counter() - t0:.0f} s")
    finally:
        for p in busy:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
