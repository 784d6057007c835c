"""What a person sees in a real terminal: `omniprof run` in tmux at 80, 100 and 120 columns.

The screen is read back with ``tmux capture-pane -p`` (what the terminal shows, after rich and
the terminal have done their work), not from our own renderer's return value.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIME = r"\d+(?:\.\d+)? (?:ns|us|ms|s)"


@pytest.fixture(autouse=True)
def _tmux() -> None:
    from tests.tools import require

    require(shutil.which("tmux") is not None, "tmux (apt-get install tmux, or .ci/system-deps as root)")


def _screen(command: str, width: int, tmp_path: Path, *, height: int = 60, timeout_s: float = 60.0) -> str:
    """Run ``command`` in a fresh tmux server of ``width`` x ``height`` and return the screen."""
    sock = f"omniprof-test-{uuid.uuid4().hex[:8]}"
    done = tmp_path / f"done-{width}"
    env_prefix = f"cd {shlex.quote(str(ROOT))} && export PYTHONPATH={shlex.quote(str(ROOT))} TERM=xterm-256color; " \
                 "unset NO_COLOR COLUMNS LINES; clear; "
    script = f"{env_prefix}{command}; touch {shlex.quote(str(done))}; sleep 30"
    subprocess.run(["tmux", "-L", sock, "new-session", "-d", "-x", str(width), "-y", str(height),
                    "bash", "--norc", "--noprofile", "-c", script], check=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not done.exists():
            if time.monotonic() > deadline:
                pytest.fail(f"{command!r} did not finish in {timeout_s} s in tmux")
            time.sleep(0.2)
        return subprocess.run(["tmux", "-L", sock, "capture-pane", "-p"],
                              capture_output=True, text=True, check=True).stdout
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)


def _block(screen: str, title: str) -> list[str]:
    lines = screen.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(title))
    out = []
    for ln in lines[start + 1:]:
        if not ln.strip():
            break
        out.append(ln)
    return out


@pytest.mark.parametrize("width", [80, 100, 120])
def test_run_reads_right_in_a_real_terminal(width, tmp_path):
    """`omniprof run examples/hot_loop.py`: every number whole, headers whole, function names
    whole (they fit at these widths), no omniprof frame, no warning, nothing past the edge."""
    exe = shlex.quote(sys.executable)
    screen = _screen(f"{exe} -m omniprof run examples/hot_loop.py 2>&1", width, tmp_path)
    assert "result: " in screen, screen
    if width >= 100:
        assert "…" not in screen, screen  # every name fits whole from 100 columns
    assert "warning" not in screen.lower(), screen
    assert "omniprof/" not in screen and "runpy" not in screen, screen
    tree = _block(screen, "Call tree")
    assert tree[0].split() == ["time", "%", "self", "function"], screen
    flat = _block(screen, "Flat (by self time")
    assert flat[0].split() == ["self", "self", "%", "total", "total", "%", "function"], screen
    rows = {}
    for ln in flat[2:]:
        m = re.match(rf"^\s*({TIME})\s+(\d+\.\d)\s+({TIME})\s+(\d+\.\d)\s+(\S.*)$", ln)
        assert m, f"a flat row with a cut figure: {ln!r}\n{screen}"
        rows[m.group(5).strip()] = (float(m.group(2)), float(m.group(4)))
    # One row per function (not per line), the hot one first; the docstring of the example says
    # about three quarters of the time.
    assert list(rows)[0] == "hot_function  examples/hot_loop.py", screen  # short enough to stay whole
    assert 50.0 <= rows["hot_function  examples/hot_loop.py"][0] <= 95.0
    assert sum(1 for k in rows if k.startswith("main ")) == 1
    assert rows["main  examples/hot_loop.py"][1] >= 95.0
    for ln in tree[2:]:
        assert re.match(rf"^\s*{TIME}\s+\d+\.\d\s+(?:{TIME})?\s+\S", ln), f"a cut tree row: {ln!r}"
    assert all(len(ln) <= width for ln in screen.splitlines())


def test_long_names_are_elided_in_the_middle_only_when_they_cannot_fit(tmp_path):
    """A 150-character function name at 80 columns: its start and its file:line end stay, the
    middle gives way, and the figures beside it are whole."""
    prog = tmp_path / "long_names.py"
    name = "compute_" + "very_" * 26 + "long_name"
    prog.write_text(f"def {name}():\n    s = 0\n    for i in range(3_000_000):\n        s += i * i\n    return s\n\n"
                    f"{name}()\n")
    exe = shlex.quote(sys.executable)
    screen = _screen(f"{exe} -m omniprof run {shlex.quote(str(prog))} 2>&1", 80, tmp_path)
    flat = _block(screen, "Flat (by self time")
    row = flat[2]
    m = re.match(rf"^\s*({TIME})\s+(\d+\.\d)\s+({TIME})\s+(\d+\.\d)\s+(\S.*)$", row)
    assert m, screen
    label = m.group(5)
    assert label.startswith("compute_very_") and label.endswith("long_names.py") and "…" in label, screen
    assert len(label) >= 30
    assert all(len(ln) <= 80 for ln in screen.splitlines())
