"""plugins.toml runs code: it is loaded only when named or trusted, cannot silently take over a
built-in name, and a plugin that exits or hangs at import cannot take omniprof down with it.

Each case runs ``python -m omniprof`` in a child process in a directory laid out as an attacker
would leave it (a downloaded trace beside a plugins.toml and a .py), with its own config home.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import omniprof
from omniprof.testing.fakes import make_result

ROOT = Path(__file__).resolve().parents[2]

PAYLOAD = 'open("PWNED", "w").write("code from plugins.toml ran")\n'


def _omniprof(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str(cwd / ".config"), **env}
    full.pop("OMNIPROF_PLUGINS", None)
    return subprocess.run([sys.executable, "-m", "omniprof", *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def downloaded(tmp_path) -> Path:
    """A directory with a trace, a plugins.toml redirecting the table reporter and the module it names."""
    make_result().save(tmp_path / "trace.json")
    (tmp_path / "plugins.toml").write_text('[reporter.table]\ntarget = "evilmod:Table"\n')
    (tmp_path / "evilmod.py").write_text(PAYLOAD)
    return tmp_path


def test_plugins_toml_in_working_directory_never_runs(downloaded, tally):
    """``python -m omniprof report trace.json`` beside a hostile plugins.toml: the report is omniprof's
    table and the .py never runs (before: PWNED). ``omniprof plugins`` says why the file is left alone."""
    p = _omniprof(["report", "trace.json"], downloaded)
    tally.check("plugins.toml in cwd", "ignored")
    assert p.returncode == 0, p.stderr
    assert "== omniprof" in p.stdout
    assert not (downloaded / "PWNED").exists()
    p = _omniprof(["plugins", "--no-probe"], downloaded)
    assert p.returncode == 0 and not (downloaded / "PWNED").exists()
    assert "plugins.toml is not loaded" in p.stderr and "--trust" in p.stderr


def test_named_plugins_toml_cannot_redirect_a_builtin_silently(downloaded, tally):
    """Named with --plugins, a redirect of ``table`` is refused (one error, exit 2, nothing imported)
    unless the entry says ``override = true``; then it is used and announced."""
    p = _omniprof(["report", "trace.json", "--plugins", "plugins.toml"], downloaded)
    tally.check("built-in redirect without override", "refused")
    assert p.returncode == 2 and "override = true" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (downloaded / "PWNED").exists()
    (downloaded / "evilmod.py").write_text(
        "from omniprof.reporters.table import TableReporter\n"
        "class Table(TableReporter):\n"
        "    def report(self, result, dest):\n"
        "        dest.write('custom table\\n')\n")
    (downloaded / "plugins.toml").write_text('[reporter.table]\ntarget = "evilmod:Table"\noverride = true\n')
    p = _omniprof(["report", "trace.json", "--plugins", "plugins.toml"], downloaded)
    assert p.returncode == 0 and p.stdout == "custom table\n", p.stderr
    p = _omniprof(["plugins", "--no-probe", "--plugins", "plugins.toml"], downloaded)
    assert "is overridden by" in p.stderr


def test_trusted_plugins_toml_loads_until_it_changes(tmp_path, tally):
    """``omniprof plugins --trust`` lets ./plugins.toml load (a local backend becomes selectable);
    an edit to the file withdraws the trust."""
    (tmp_path / "tickmod.py").write_text(
        "from omniprof.testing.fakes import FakeBackend\n"
        "class TickBackend(FakeBackend):\n"
        "    name = 'tick'\n")
    (tmp_path / "plugins.toml").write_text('[backend.tick]\ntarget = "tickmod:TickBackend"\n')
    (tmp_path / "w.py").write_text("sum(range(1000))\n")
    p = _omniprof(["run", "-b", "tick", "-r", "json", "-o", "out", "w.py"], tmp_path)
    assert p.returncode == 2 and "unknown backend 'tick'" in p.stderr and "--trust" in p.stderr, p.stderr
    p = _omniprof(["plugins", "--trust"], tmp_path)
    assert p.returncode == 0 and "trusted" in p.stderr, p.stderr
    store = json.loads((tmp_path / ".config" / "omniprof" / "trusted-plugins.json").read_text())
    assert list(store) == [str((tmp_path / "plugins.toml").resolve())]
    p = _omniprof(["run", "-b", "tick", "-r", "json", "-o", "out", "w.py"], tmp_path)
    tally.check("trusted plugins.toml", "loaded")
    assert p.returncode == 0, p.stderr
    assert [x.backend for x in omniprof.load(tmp_path / "out" / "omniprof.result.json").parts] == ["tick"]
    with open(tmp_path / "plugins.toml", "a") as fh:
        fh.write("# edited\n")
    p = _omniprof(["run", "-b", "tick", "-r", "json", "-o", "out", "w.py"], tmp_path)
    assert p.returncode == 2 and "unknown backend 'tick'" in p.stderr


@pytest.mark.parametrize("command", [["plugins", "--no-probe"], ["config", "check", "p/plugins.toml"]])
def test_plugin_calling_sys_exit_at_import_is_broken_not_fatal(tmp_path, command, tally):
    """A plugin module that calls ``sys.exit(3)`` at import: ``plugins`` lists it as broken (exit 0,
    every other plugin listed), ``config check`` reports it (exit 1); never a silent exit 3."""
    (tmp_path / "exiter.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "plugins.toml").write_text('[backend.exiter]\ntarget = "exiter:Backend"\n')
    p = _omniprof([*command, "--plugins", "p/plugins.toml"], tmp_path)
    tally.check("plugin sys.exit at import", "contained")
    text = p.stdout + p.stderr
    assert p.returncode == (0 if command[0] == "plugins" else 1), text
    assert "sys.exit(3)" in text and "exiter" in text
    if command[0] == "plugins":
        assert "table" in p.stdout and "cpu" in p.stdout


def test_plugin_hanging_at_import_times_out(tmp_path, tally):
    """A plugin whose import never returns: ``omniprof plugins`` lists it as broken after the import
    time limit and exits 0 (before: hung forever)."""
    (tmp_path / "hanger.py").write_text("import time\nwhile True:\n    time.sleep(0.05)\n")
    (tmp_path / "p.toml").write_text('[reporter.hanger]\ntarget = "hanger:Reporter"\n')
    p = _omniprof(["plugins", "--no-probe", "--plugins", "p.toml"], tmp_path, OMNIPROF_PLUGIN_IMPORT_TIMEOUT_S="1")
    tally.check("plugin hanging at import", "timed out")
    assert p.returncode == 0, p.stderr
    row = next(x for x in p.stdout.splitlines() if x.startswith("hanger"))
    assert "broken" in row and "more than 1 s" in row and "OMNIPROF_PLUGIN_IMPORT_TIMEOUT_S" in row
