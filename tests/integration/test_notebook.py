"""Notebook magics in a real kernel (nbclient + ipykernel) and in a terminal IPython."""

from __future__ import annotations

import html
import os
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook extra not installed: pip install -e '.[notebook]'")
nbclient = pytest.importorskip("nbclient", reason="notebook extra not installed: pip install -e '.[notebook]'")

ROOT = Path(__file__).resolve().parents[2]

CELLS = [
    "%load_ext omniprof",
    "def hot(n):\n    s = 0\n    for i in range(n):\n        s += i * i\n    return s",
    "%%omniprof -b cpu\nx = sum(hot(20_000) for _ in range(150))",  # ~0.15 s: samples even on a loaded machine
    "%omniprof -O cpu.interval_s=0.002 y = hot(400_000)",
    "print(x > 0, y > 0, type(_omniprof).__name__)",
]


def test_magics_in_a_real_kernel(tmp_path):
    """%load_ext, %%omniprof and %omniprof run in a real kernel: the cell's assignments stay in
    the namespace, each profile displays rich HTML (the page, with the flame graph and the hot
    function) and a text form (the table report)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    env_root = str(ROOT)
    os.environ["PYTHONPATH"] = env_root + os.pathsep + os.environ.get("PYTHONPATH", "")
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    for i in (2, 3):
        outs = nb.cells[i].outputs
        assert not [o for o in outs if o.output_type == "error"], outs
        shown = next(o for o in outs if o.output_type == "display_data")
        page = html.unescape(shown.data["text/html"])
        assert page.startswith("<iframe") and "Flame graph" in page and "hot  " in page
        assert "Call tree" in shown.data["text/plain"] and "hot" in shown.data["text/plain"]
    printed = "".join(o.get("text", "") for o in nb.cells[4].outputs)
    assert printed.strip() == "True True ProfileResult"


def test_terminal_ipython_prints_text():
    """In a terminal IPython the same magic prints the table report (no HTML)."""
    ipython = pytest.importorskip("IPython")
    assert ipython
    code = "%load_ext omniprof\n%omniprof z = sum(i * i for i in range(600_000))\nprint('z', z)"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor", "-c", code],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "Call tree" in proc.stdout and "<iframe" not in proc.stdout
    assert "z 71999820000100000" in proc.stdout


def test_bad_magic_options_are_one_clear_error():
    from omniprof.errors import InvalidArgumentError
    from omniprof.notebook import parse

    with pytest.raises(InvalidArgumentError, match="unknown option '--nope'"):
        parse("--nope work()")
    with pytest.raises(InvalidArgumentError, match="-b needs a value"):
        parse("-b")
