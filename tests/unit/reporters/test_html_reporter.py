"""The html reporter: one self-contained page, opened in headless Chromium as a person would."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import omniprof
from omniprof.reporters.html import HtmlOptions, HtmlReporter, flame_tree
from omniprof.testing.conformance import ReporterConformance
from omniprof.testing.fakes import make_result
from tests.tools import require


class TestHtmlConformance(ReporterConformance):
    reporter_cls = HtmlReporter


def _hot_spin(seconds: float) -> int:
    s, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        for i in range(1000):
            s += i * i
    return s


def _cold_spin(seconds: float) -> int:
    s, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        s += len(str(s))
    return s


def _workload() -> None:
    for _ in range(3):
        _hot_spin(0.08)
        _cold_spin(0.02)


def _chromium(page: Path, tmp_path: Path) -> tuple[str, list[str], Path]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    require(exe is not None, "chromium")
    shot = tmp_path / "shot.png"
    common = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
              "--disable-dev-shm-usage", "--no-first-run", f"--user-data-dir={tmp_path / 'chrome'}",
              "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000"]
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    subprocess.run([*common, f"--screenshot={shot}", "--window-size=1200,900", page.as_uri()], capture_output=True,
                   text=True, timeout=120)
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    return dom.stdout, console, shot


def test_page_in_chromium_shows_the_hot_function(tmp_path):
    """A real cpu profile: Chromium runs the page's script without a console error, the flame graph
    it draws has a box for the hot function wider than the cold one's, the call tree and the flat
    list name it, and the page loads nothing from the network."""
    with omniprof.Profiler(backend="cpu") as prof:
        _workload()
    result = prof.result
    page = tmp_path / "report.html"
    omniprof.report(result, "html", page)
    text = page.read_text()
    assert not re.search(r"(src|href)=['\"]?https?:", text)  # self-contained
    dom, console, shot = _chromium(page, tmp_path)
    assert console == [], console
    boxes = [(re.search(r'style="([^"]*)"', attrs_).group(1), name)
             for attrs_, name in re.findall(r'<div (class="fg-node[^>]*)>([^<]*)</div>', dom)]
    assert boxes, dom[:2000]
    width: dict[str, float] = {}
    for style, name in boxes:
        key = name.split("  ")[0]
        width[key] = width.get(key, 0.0) + float(re.search(r"width: ([0-9.e-]+)%", style).group(1))
    assert width["_hot_spin"] > width.get("_cold_spin", 0.0)
    # 80% of the main thread's work by construction (each spin timed by its own clock); relative to the
    # two spins, since the root's width also holds whatever other threads the test process has
    assert width["_hot_spin"] / (width["_hot_spin"] + width.get("_cold_spin", 0.0)) >= 0.6
    assert "<summary>" in dom and "_hot_spin" in dom.split("Call tree", 1)[1]
    assert shot.is_file() and shot.stat().st_size > 5000  # Chromium drew a real page


def test_flame_tree_totals_are_the_samples():
    """The flame graph's root is the sampled time; children sum to at most their parent."""
    r = make_result()
    tree = flame_tree(r.parts[0])
    part = r.parts[0]
    assert tree["v"] == sum(s.weight_ns for s in part.samples)

    def check(n):
        assert sum(c["v"] for c in n["c"]) + n["s"] <= n["v"]
        for c in n["c"]:
            check(c)
    check(tree)


def test_losses_and_errors_and_tables_are_on_the_page():
    from omniprof.core.results import ErrorRecord

    r = make_result().evolve(partial=True, errors=(ErrorRecord("xla", "stop", "RuntimeError", "device lost"),))
    page = HtmlReporter(HtmlOptions()).page(r)
    for needle in ("device lost", "3 samples not recorded", "Op statistics", "gemm_kernel", "PARTIAL"):
        assert needle in page


def test_a_recursion_1500_deep_writes_the_html_report(tmp_path):
    """omniprof run -r html of a program recursing 1,500 deep (which then puts python's default
    recursion limit back): the page is written (it was a RecursionError), and its flame-graph
    data, read by the json module, holds the whole stack."""
    import json
    import os
    import sys
    from html.parser import HTMLParser

    (tmp_path / "deep.py").write_text(
        "import sys, time\nsys.setrecursionlimit(10000)\n"
        "def down(n):\n    if n == 0:\n        end = time.thread_time() + 0.3\n"
        "        while time.thread_time() < end:\n            sum(range(100))\n        return 0\n"
        "    return down(n - 1) + 1\n"
        "print(down(1500))\nsys.setrecursionlimit(1000)  # put back, as a tidy program does\n")
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-m", "omniprof", "run", "-r", "html", "-o", "out", "deep.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    assert "1500" in proc.stdout and "error" not in proc.stderr, proc.stderr
    page = (tmp_path / "out" / "omniprof.report.html").read_text(encoding="utf-8")
    scripts: list[str] = []

    class Scripts(HTMLParser):
        def handle_data(self, data: str) -> None:
            if self.lasttag == "script":
                scripts.append(data)

    Scripts().feed(page)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)  # the reader's own limit: json nests a C call per level
    try:
        data = json.loads(scripts[0].replace("<\\/", "</"))
    finally:
        sys.setrecursionlimit(limit)
    depth, node = 0, data
    while node["c"]:
        node, depth = node["c"][0], depth + 1
    assert depth >= 1500 and node["n"].startswith("down")
