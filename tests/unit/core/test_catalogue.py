"""plugins.toml (the catalogue of built-ins) and pyproject's entry points agree."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[3]


def test_catalogue_matches_entry_points():
    """Every built-in entry point has a plugins.toml entry with the same target, and vice versa."""
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())
    eps = py["project"]["entry-points"]
    declared = {("backend", k): v for k, v in eps["omniprof.backends"].items()}
    declared |= {("reporter", k): v for k, v in eps["omniprof.reporters"].items()}
    cat = tomllib.loads((ROOT / "plugins.toml").read_text())
    listed = {(kind, name): spec["target"] for kind in ("backend", "reporter") for name, spec in cat.get(kind, {}).items()}
    assert listed == declared
    extras = set(py["project"]["optional-dependencies"]) | {""}
    for kind in ("backend", "reporter"):
        for name, spec in cat.get(kind, {}).items():
            assert spec.get("extra", "") in extras, f"{kind} {name}: unknown extra {spec.get('extra')!r}"
            assert spec.get("summary"), f"{kind} {name} needs a summary"
