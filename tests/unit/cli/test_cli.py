"""The CLI, in-process through main([...]): targets behave as under python; errors are one line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import omniprof
from omniprof.cli import main

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def script(tmp_path):
    def make(body: str, name: str = "target.py") -> Path:
        p = tmp_path / name
        p.write_text(textwrap.dedent(body))
        return p

    return make


def test_run_script_sees_argv_and_main(script, capsys, tmp_path):
    """The script gets its own argv and __name__ == '__main__'; the table follows its output."""
    p = script("""
        import sys
        def busy():
            return sum(i * i for i in range(200_000))
        if __name__ == "__main__":
            busy()
            print("ARGV", sys.argv)
    """)
    rc = main(["run", str(p), "a", "--flag", "-x"])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"ARGV ['{p}', 'a', '--flag', '-x']" in out
    assert "== omniprof cpu" in out and "Flat (by self time" in out


def test_run_exit_code_and_exception(script, capsys):
    """sys.exit codes pass through; an uncaught exception exits 1 with the target's traceback only."""
    assert main(["run", str(script("import sys; sys.exit(3)"))]) == 3
    assert main(["run", str(script("raise SystemExit('bye')"))]) == 1
    p = script("def f():\n    raise LookupError('nope')\nf()\n", name="boom.py")
    assert main(["run", str(p)]) == 1
    err = capsys.readouterr().err
    assert "LookupError: nope" in err and "boom.py" in err
    assert "omniprof/cli.py" not in err and "runpy" not in err


def test_run_module(tmp_path, capsys, monkeypatch):
    """-m runs a module as __main__ with the rest of the line as its argv."""
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tool.py").write_text("import sys\nif __name__ == '__main__':\n    print('MOD', __name__, sys.argv[1:])\n")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "-m", "mypkg.tool", "--x", "1"]) == 0
    assert "MOD __main__ ['--x', '1']" in capsys.readouterr().out


def test_run_options_and_reporters(script, tmp_path, capsys):
    """-O sets profile and backend options, -r/-o write file reports, --logdir saves the session."""
    p = script("x = sum(range(100000))\n")
    out = tmp_path / "out"
    rc = main(["run", "-O", "host_tracer_level=3", "-O", "cpu.interval_s=0.002", "-r", "table,json", "-o",
               str(out), "--logdir", str(tmp_path / "logs"), str(p)])
    assert rc == 0
    saved = omniprof.load(out / "omniprof.result.json")
    assert saved.metadata.options["host_tracer_level"] == 3
    assert saved.metadata.backend_options["cpu"]["interval_s"] == 0.002
    assert "== omniprof cpu" in capsys.readouterr().out
    assert list((tmp_path / "logs" / "plugins" / "profile").glob("*/omniprof.result.json"))
    # a second run never overwrites the first's file
    assert main(["run", "-r", "json", "-o", str(out), str(p)]) == 0
    assert sorted(f.name for f in out.glob("omniprof*.json")) == ["omniprof-1.result.json", "omniprof.result.json"]


@pytest.mark.parametrize("argv,fragment", [
    (["run", "-O", "host_tracer_level=9", "x.py"], "'host_tracer_level' must be one of 0, 1, 2, 3 (got 9)"),
    (["run", "-O", "gpu_max_activity_events=5", "x.py"], "did you mean 'gpu_max_activity_api_events'"),
    (["run", "-O", "noequals", "x.py"], "-O expects KEY=VALUE"),
    (["run", "-b", "cpux", "x.py"], "unknown backend 'cpux'; did you mean 'cpu'?"),
    (["run", "-r", "tabel", "x.py"], "unknown reporter 'tabel'; did you mean 'table'?"),
    (["run", "-O", "xla.foo=1", "x.py"], "backend 'xla' is not selected"),
    (["run", "--no-config"], "give a script"),
    (["run", "does_not_exist.py"], "no such script"),
    (["run", "-R", "table.max_rows=0", "x.py"], "'max_rows' must be >= 1 (got 0)"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_usage_errors_are_one_line_exit_2(argv, fragment, capsys):
    """User mistakes print one 'omniprof: error:' line (no traceback) and exit 2."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert err.startswith("omniprof: error:") and "Traceback" not in err


def test_plugins_command_lists_builtins(capsys):
    """`omniprof plugins` prints name, kind, source and status of every built-in."""
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["name", "kind", "source", "status"]
    rows = {ln.split()[0]: ln for ln in lines[1:]}
    for name in ("cpu", "table", "json"):
        assert name in rows and "omniprof" in rows[name] and rows[name].rstrip().endswith("ok")


def test_plugins_command_shows_broken_plugin(tmp_path, capsys):
    """A broken plugin from plugins.toml is listed as broken with its error; the rest are ok."""
    f = tmp_path / "plugins.toml"
    f.write_text('[backend.widget]\ntarget = "tests.unit.core.broken_plugin_module:W"\n')
    assert main(["plugins", "--plugins", str(f)]) == 0
    out = capsys.readouterr().out
    widget = next(ln for ln in out.splitlines() if ln.startswith("widget"))
    assert "broken" in widget and "libwidget.so.3" in widget
    assert next(ln for ln in out.splitlines() if ln.startswith("cpu ")).rstrip().endswith("ok")


def test_report_rerenders_saved_result(tmp_path, capsys):
    """`omniprof report run.json` re-renders a saved result; a bad file is one clear line."""
    from omniprof.testing import make_result

    path = make_result().save(tmp_path / "run.json")
    assert main(["report", str(path), "-r", "table"]) == 0
    assert "Op statistics" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, ')
    assert main(["report", str(bad)]) == 2  # bad input is a user mistake: exit 2
    err = capsys.readouterr().err
    assert "invalid JSON" in err and str(bad) in err and "Traceback" not in err


def test_python_dash_m_omniprof_and_console_script(tmp_path):
    """`python -m omniprof` and the `omniprof` script both work, and profile the bundled example."""
    proc = subprocess.run([sys.executable, "-m", "omniprof", "run", "-r", "json", "-o", str(tmp_path),
                           str(ROOT / "examples" / "hot_loop.py")], capture_output=True, text=True, check=True)
    assert "result:" in proc.stdout
    r = omniprof.load(tmp_path / "omniprof.result.json")
    from omniprof.analysis import calltree

    # The example's 20 rounds (~0.2 s, ~75% in hot_function timed alone): with 5 rounds (50 samples)
    # one late tick's weight on a machine at load 7 could put another function first.
    flat = calltree.flat_profile(r.part("cpu"))
    assert flat[0].frame.name == "hot_function"
    assert json.loads(r.to_json())["schema_version"] == 2


def test_version(capsys):
    """--version prints the version."""
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"omniprof {omniprof.__version__}"
