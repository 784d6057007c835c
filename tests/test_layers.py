"""The layer rules of docs/architecture.md hold: `lint-imports` (import-linter, the `test` extra)
checks the [tool.importlinter] contract of pyproject.toml, so an import against the layers fails
the suite."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_imports_follow_the_layers():
    pytest.importorskip("importlinter", reason="import-linter is in the test extra: pip install -e '.[test]'")
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                               "sys.argv = ['lint-imports', '--no-cache']; lint_imports_command()"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout


@pytest.mark.parametrize("module, line, arrow", [
    ("core/units.py", "from omniprof.reporters import table", "omniprof.core.units -> omniprof.reporters.table"),
    # formats stand below analysis (issue 26): a reader that calls an analysis breaks the contract
    ("formats/xspace.py", "from omniprof.analysis import render", "omniprof.formats.xspace -> omniprof.analysis.render"),
])
def test_a_back_arrow_breaks_the_contract(tmp_path, module, line, arrow):
    """The contract is live: a copy of the package with one import against the layers fails it."""
    pytest.importorskip("importlinter", reason="import-linter is in the test extra: pip install -e '.[test]'")
    import shutil

    shutil.copytree(ROOT / "omniprof", tmp_path / "omniprof", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "omniprof" / module, "a") as fh:
        fh.write(f"\n{line}  # noqa: E402,F401\n")
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, '.'); from importlinter.cli import lint_imports_command; "
                               "sys.argv = ['lint-imports', '--no-cache']; lint_imports_command()"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)})
    assert proc.returncode != 0
    assert arrow in proc.stdout
