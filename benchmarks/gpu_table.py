"""docs/gpu.md's table of the latest GPU acceptance record (benchmarks/results/gpu/*.json).

Usage: python benchmarks/gpu_table.py [--record PATH] [--write]
Prints the Markdown; ``--write`` puts it into docs/gpu.md between the lines
``<!-- gpu-record:begin -->`` and ``<!-- gpu-record:end -->`` (atomically).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu"
DOC = ROOT / "docs" / "gpu.md"
BEGIN, END = "<!-- gpu-record:begin -->", "<!-- gpu-record:end -->"
MAX_FIGURES = 6


def latest_record(results_dir: Path = RESULTS) -> Path | None:
    """The newest record: names start with the date, so the last in name order."""
    found = sorted(results_dir.glob("*.json")) if results_dir.is_dir() else []
    return found[-1] if found else None


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v[:4]) + (", ..." if len(v) > 4 else "") + "]"
    return str(v)


def figures_cell(figures: dict[str, Any], limit: int = MAX_FIGURES) -> str:
    """The first ``limit`` scalar figures as ``key=value``; a nested dict of scalars as ``key.sub=value``."""
    out: list[str] = []
    for k, v in figures.items():
        if isinstance(v, dict):
            out += [f"{k}.{sk}={_value(sv)}" for sk, sv in v.items() if not isinstance(sv, (dict, list))]
        elif v is not None:
            out.append(f"{k}={_value(v)}")
    more = len(out) - limit
    return ", ".join(out[:limit]) + (f" (+{more} more)" if more > 0 else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_rows(record: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(check, result, figures) per check, in the record's order; a failure shows its error first."""
    rows = []
    for c in record.get("checks", []):
        cell = figures_cell(c.get("figures") or {})
        if c.get("error"):
            cell = f"error: {c['error'][:160]}" + (f"; {cell}" if cell else "")
        rows.append((str(c.get("name", "?")), "ok" if c.get("ok") else "FAIL", _cell(cell)))
    return rows


def render(record: dict[str, Any], source: str) -> str:
    checks = record.get("checks", [])
    passed = sum(1 for c in checks if c.get("ok"))
    head = (f"Latest record: `{source}`: {record.get('device', '?')}, driver {record.get('driver', '?')}, "
            f"torch {record.get('torch', '?')}, jax {record.get('jax', '?')}, {record.get('date', '?')}: "
            f"**{passed}/{len(checks)} checks passed**.")
    lines = [head, "", "| check | result | figures |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in table_rows(record)]
    return "\n".join(lines)


NO_RECORD = ("No record yet: no session lent a GPU has run the acceptance run. The first one that is "
             "runs it (see *Running it* above) and commits `benchmarks/results/gpu/<date>-<device>.json`.")


def replace_between_markers(doc: str, text: str) -> str:
    b, e = doc.index(BEGIN), doc.index(END)
    if e < b:
        raise ValueError(f"{END} comes before {BEGIN}")
    return doc[:b + len(BEGIN)] + "\n" + text + "\n" + doc[e:]


def write_doc(text: str, doc: Path = DOC) -> None:
    new = replace_between_markers(doc.read_text(encoding="utf-8"), text)
    fd, tmp = tempfile.mkstemp(dir=doc.parent, prefix=f".{doc.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(new)
    os.replace(tmp, doc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--record", type=Path, help="a record (default: the newest in benchmarks/results/gpu)")
    p.add_argument("--write", action="store_true", help=f"write it into {DOC.relative_to(ROOT)}")
    ns = p.parse_args(argv)
    path = ns.record or latest_record()
    if path is None:
        text = NO_RECORD
    else:
        record = json.loads(path.read_text(encoding="utf-8"))
        try:
            source = str(path.resolve().relative_to(ROOT))
        except ValueError:
            source = str(path)
        text = render(record, source)
    if ns.write:
        write_doc(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
