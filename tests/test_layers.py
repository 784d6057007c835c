"""The layer rules of docs/architecture.md hold: `lint-imports` (import-linter, the `test` extra)
checks the [tool.importlinter] contract of pyproject.toml, so an import against the layers fails
the suite. Without import-linter these tests fail: they never skip."""

import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _require_import_linter() -> None:
    try:
        import importlinter  # noqa: F401
    except ImportError as e:  # a missing checker must not read as a kept contract
        raise AssertionError("import-linter is missing: the layer rules go unchecked. It is in the test extra: "
                             "pip install -e '.[test]'") from e


def _layer_modules() -> list[str]:
    """Every module named by a layer of the contract (`a | b`, `a : b` split)."""
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    return [m.strip() for layer in contract["layers"] for m in layer.replace(":", "|").split("|")]


def _package_modules() -> list[str]:
    """Every module of the omniprof package, from its files (no import)."""
    out = []
    for path in sorted((ROOT / "omniprof").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


def test_imports_follow_the_layers():
    _require_import_linter()
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                               "sys.argv = ['lint-imports', '--no-cache']; lint_imports_command()"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout


def _lint_copy_with(tmp_path: Path, added: dict[str, str]) -> subprocess.CompletedProcess:
    """lint-imports over a copy of the package with ``added`` lines appended to some of its files
    (path under omniprof/ -> line)."""
    _require_import_linter()
    import shutil

    shutil.copytree(ROOT / "omniprof", tmp_path / "omniprof", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for rel, line in added.items():
        with open(tmp_path / "omniprof" / rel, "a") as fh:
            fh.write(f"\n{line}  # noqa: E402,F401\n")
    return subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, '.'); from importlinter.cli import lint_imports_command; "
                               "sys.argv = ['lint-imports', '--no-cache']; lint_imports_command()"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)})


@pytest.mark.parametrize("module, line, arrow", [
    ("core/units.py", "from omniprof.reporters import table", "omniprof.core.units -> omniprof.reporters.table"),
    # formats stand below analysis (issue 26): a reader that calls an analysis breaks the contract
    ("formats/xspace.py", "from omniprof.analysis import render", "omniprof.formats.xspace -> omniprof.analysis.render"),
])
def test_a_back_arrow_breaks_the_contract(tmp_path, module, line, arrow):
    """The contract is live: a copy of the package with one import against the layers fails it."""
    proc = _lint_copy_with(tmp_path, {module: line})
    assert proc.returncode != 0
    assert arrow in proc.stdout


def test_every_module_is_in_a_layer():
    """No module escapes the contract: each one under omniprof/ is a layer's module or inside one
    (the root package, the public face that imports its names lazily, aside)."""
    layers = _layer_modules()
    outside = [m for m in _package_modules()
               if m != "omniprof" and not any(m == layer or m.startswith(layer + ".") for layer in layers)]
    assert outside == [], f"modules in no layer of [tool.importlinter] in pyproject.toml: {outside}"


def test_a_backend_importing_test_fakes_breaks_the_contract(tmp_path):
    """testing sits above the backends, the notebook above the reporters: a backend importing
    omniprof.testing, or a reporter importing omniprof.notebook, fails the contract."""
    proc = _lint_copy_with(tmp_path, {"backends/cpu/tracer.py": "from omniprof.testing import fakes",
                                      "reporters/json.py": "from omniprof import notebook"})
    assert proc.returncode != 0
    assert "omniprof.backends.cpu.tracer -> omniprof.testing.fakes" in proc.stdout, proc.stdout
    assert "omniprof.reporters.json -> omniprof.notebook" in proc.stdout, proc.stdout
