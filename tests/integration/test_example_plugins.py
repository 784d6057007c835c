"""The example third-party distribution (examples/plugins), used only through its entry points.

This module never imports ``omniprof_example_plugins``: everything goes through the registry, the
Profiler, ``omniprof.report`` and the CLI, the way a user of an installed plugin reaches it.
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import textwrap

import pytest

import omniprof
from omniprof.cli import main
from omniprof.core.registry import get_registry

DIST = "omniprof-example-plugins"

try:
    VERSION = md.version(DIST)
except md.PackageNotFoundError:  # pragma: no cover - CI installs it (README quick start)
    pytestmark = pytest.mark.skip(reason=f"{DIST} is not installed: pip install -e examples/plugins "
                                         f"(the README quick start does)")
    VERSION = ""


def busy() -> int:
    return sum(i * i for i in range(300_000))


def test_registry_lists_the_plugins_with_their_distribution():
    """`omniprof plugins` data: rusage (backend) and markdown (reporter) from the example distribution, status ok."""
    infos = {(i.kind, i.name): i for i in get_registry().infos()}
    rusage, markdown = infos[("backend", "rusage")], infos[("reporter", "markdown")]
    assert rusage.source == markdown.source == f"{DIST} {VERSION}"
    assert rusage.status == markdown.status == "ok"
    assert rusage.target == "omniprof_example_plugins.rusage:RusageBackend"
    assert "resource usage" in rusage.summary


def test_entry_points_load_lazily():
    """Importing omniprof and listing plugins does not import the plugin; selecting it does."""
    code = textwrap.dedent("""
        import sys, omniprof
        reg = omniprof.get_registry()
        reg.infos(load=False)
        assert "omniprof_example_plugins.rusage" not in sys.modules
        cls = reg.backend("rusage")
        assert cls.__module__ in sys.modules and cls.name == "rusage"
        print("ok")
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_profiler_and_report_by_name(tmp_path):
    """Profiler(backend='rusage') records counters; omniprof.report(..., 'markdown') writes a Markdown summary."""
    with omniprof.Profiler(backend=["cpu", "rusage"], backend_options={"rusage": {"interval_s": 0.005}}) as prof:
        busy()
    part = prof.result.part("rusage")
    assert {c.name for c in part.counters} >= {"cpu_utilization", "max_rss"}
    path = omniprof.report(prof.result, "markdown", tmp_path)
    text = path.read_text(encoding="utf-8")
    assert path.name == "omniprof-summary.md"
    assert text.startswith("# omniprof run") and "## rusage: counters" in text and "## cpu: top functions" in text


def test_cli_run_with_the_plugins(tmp_path, monkeypatch, capsys):
    """`omniprof run -b cpu,rusage -r markdown -O rusage.interval_s=0.005` works from the command line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("print(sum(i * i for i in range(300_000)))\n", encoding="utf-8")
    assert main(["run", "-b", "cpu,rusage", "-O", "rusage.interval_s=0.005", "-r", "markdown", "-o", str(tmp_path),
                 "job.py"]) == 0
    text = (tmp_path / "omniprof-summary.md").read_text(encoding="utf-8")
    assert "## rusage: rusage summary" in text and "## cpu: top functions by self time" in text


def test_config_file_selects_and_validates_plugin_options(tmp_path, monkeypatch):
    """A config file can select the plugins and its problems are checked by the plugin's own Options class."""
    from omniprof.config import check_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "omniprof.toml").write_text(textwrap.dedent("""
        function = "time:sleep"
        args = [0.01]
        backend = ["cpu", "rusage"]
        reporter = "markdown"
        [backends.rusage]
        interval_s = 0
        include_loadavgg = true
        [reporters.markdown]
        max_rows = 5
        """), encoding="utf-8")
    problems = check_config(tmp_path / "omniprof.toml")
    assert len(problems) == 2
    assert ":7: $.backends.rusage.interval_s: backend 'rusage': 'interval_s' must be >= 0.0005 (got 0)" in problems[0]
    assert "did you mean 'include_loadavg'?" in problems[1]


def test_report_command_rerenders_with_the_plugin_reporter(tmp_path, capsys):
    """`omniprof report saved.json -r markdown` renders a saved result with the third-party reporter."""
    with omniprof.Profiler(backend="cpu") as prof:
        busy()
    saved = prof.result.save(tmp_path / "run.json")
    assert main(["report", str(saved), "-r", "markdown", "-o", str(tmp_path / "md")]) == 0
    assert (tmp_path / "md" / "omniprof-summary.md").read_text(encoding="utf-8").startswith("# omniprof run")
