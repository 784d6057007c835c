"""`omniprof run --config/--profile`, `omniprof config check|show` and `omniprof diff`, in-process."""

from __future__ import annotations

import json
import textwrap

import pytest

import omniprof
from omniprof.cli import main
from omniprof.core.results import BackendResult, ProfileResult, Table
from tests.tools import config_dir, write


@pytest.fixture
def proj(tmp_path, monkeypatch):
    config_dir(tmp_path, monkeypatch)
    write(tmp_path / "work.py", """
        import os, sys
        def hot_function(n):
            return sum(i * i for i in range(n))
        if __name__ == "__main__":
            hot_function(300_000)
            with open("runs.txt", "a") as fh:
                fh.write(" ".join(sys.argv[1:]) + "|" + os.environ.get("CLI_CFG_VAR", "-") + "\\n")
        """)
    write(tmp_path / "omniprof.toml", """
        script = "work.py"
        args = ["from-file"]
        repeats = 2
        reporter = ["json"]
        [reporters.json]
        output = "out/result.json"
        [backends.cpu]
        interval_s = 0.0005
        [env]
        CLI_CFG_VAR = "yes"
        [profiles.fast]
        repeats = 1
        args = ["from-profile"]
        [profiles.fast.backends.cpu]
        interval_s = 0.002
        """)
    # found in the working directory, its [env] applies only once trusted (docs/config.md); the
    # trust store goes to the test's own config home
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))
    assert main(["plugins", "--trust", "omniprof.toml"]) == 0
    return tmp_path


def test_run_config_runs_the_file(proj, capsys):
    """`omniprof run --config FILE` runs the file's target with its args, env, repeats and reporter output."""
    assert main(["run", "--config", "omniprof.toml"]) == 0
    assert (proj / "runs.txt").read_text().splitlines() == ["from-file|yes"] * 2
    result = omniprof.load(proj / "out" / "result.json")
    assert result.metadata.backend_options["cpu"]["interval_s"] == 0.0005
    assert "json report written to" in capsys.readouterr().err


def test_run_without_target_discovers_omniprof_toml(proj):
    """`omniprof run` alone uses ./omniprof.toml."""
    assert main(["run"]) == 0
    assert len((proj / "runs.txt").read_text().splitlines()) == 2


def test_profile_and_cli_flags_override_the_file(proj, capsys):
    """--profile applies the named profile; -O, -r, -o and a script argv on the command line win over both."""
    code = main(["run", "--config", "omniprof.toml", "--profile", "fast", "-O", "cpu.interval_s=0.003",
                 "-r", "json", "-o", str(proj / "cli-out"), "work.py", "from-cli"])
    assert code == 0
    assert (proj / "runs.txt").read_text().splitlines() == ["from-cli|yes"]
    (written,) = (proj / "cli-out").iterdir()
    assert omniprof.load(written).metadata.backend_options["cpu"]["interval_s"] == 0.003
    assert not (proj / "out").exists()


def test_profile_from_environment(proj, monkeypatch):
    """OMNIPROF_PROFILE selects a profile like --profile does."""
    monkeypatch.setenv("OMNIPROF_PROFILE", "fast")
    assert main(["run", "--config", "omniprof.toml"]) == 0
    assert (proj / "runs.txt").read_text().splitlines() == ["from-profile|yes"]


def test_run_with_invalid_config_fails_before_running(proj, capsys):
    """A config with problems exits 2 listing them, and the target never runs."""
    write(proj / "bad.toml", 'script = "work.py"\n[backends.cpu]\ninterval_s = -1\n')
    assert main(["run", "--config", "bad.toml"]) == 2
    err = capsys.readouterr().err
    assert "bad.toml:3: $.backends.cpu.interval_s: backend 'cpu': 'interval_s' must be > 0.0 (got -1)" in err
    assert not (proj / "runs.txt").exists()


def test_run_without_target_or_config_is_a_usage_error(tmp_path, monkeypatch, capsys):
    """`omniprof run` with nothing to run and no config exits 2 and says what to give."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OMNIPROF_CONFIG", raising=False)
    assert main(["run"]) == 2
    assert "no configuration found" in capsys.readouterr().err


def test_config_check_exit_codes(proj, capsys):
    """config check: 0 and 'ok' for a valid file, 1 with every problem for a bad one, 2 when no file is found."""
    assert main(["config", "check", "omniprof.toml"]) == 0
    assert "omniprof.toml: ok" in capsys.readouterr().out
    write(proj / "bad.toml", 'function = "work:hot_function"\nrepets = 2\n[options]\nhost_tracer_level = 9\n')
    assert main(["config", "check", "bad.toml"]) == 1
    err = capsys.readouterr().err
    assert "bad.toml:2: $.repets: unknown key 'repets'; did you mean 'repeats'?" in err
    assert "bad.toml:4: $.options.host_tracer_level: 'host_tracer_level' must be one of 0, 1, 2, 3 (got 9)" in err
    assert "2 problem(s) in bad.toml" in err
    (proj / "omniprof.toml").unlink()
    assert main(["config", "check"]) == 2


def test_config_check_of_a_plugins_file(proj, capsys):
    """config check plugins.toml validates plugin defaults with the plugin's Options."""
    write(proj / "plugins.toml", "[backend.cpu]\noptions = { engine = \"turbo\" }\n")
    assert main(["config", "check", "plugins.toml", "--plugins", str(proj / "plugins.toml")]) == 1
    assert "plugins.toml:2: $.backend.cpu.options.engine: backend 'cpu': 'engine' must be one of auto, native, signal, thread" \
        in capsys.readouterr().err


def test_config_show_prints_effective_configuration(proj, capsys, monkeypatch):
    """config show prints TOML (or JSON) with defaults filled in and env overrides applied."""
    monkeypatch.setenv("OMNIPROF_HOST_TRACER_LEVEL", "3")
    assert main(["config", "show", "--profile", "fast"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# effective configuration from ") and "profile fast" in out
    assert "host_tracer_level = 3" in out and "interval_s = 0.002" in out and "max_samples = 1000000" in out
    assert main(["config", "show", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["repeats"] == 2 and data["backends"]["cpu"]["engine"] == "auto"
    assert data["reporters"]["json"]["output"] == str(proj / "out" / "result.json")


# -- diff --------------------------------------------------------------------------------------------
def _result(ops: dict[str, int]) -> ProfileResult:
    table = Table("op_stats", ("name", "count", "total_ns"), [(n, 1, t) for n, t in ops.items()])
    return ProfileResult(parts=(BackendResult(backend="xla", tables=(table,)),))


def test_diff_exit_codes_and_rows(tmp_path, capsys):
    """diff prints the op table deltas; --fail-on-regression exits 1 only when something regressed past the threshold."""
    a = _result({"dot": 1000, "add": 100}).save(tmp_path / "a.json")
    b = _result({"dot": 1300, "conv": 50}).save(tmp_path / "b.json")
    assert main(["diff", str(a), str(b)]) == 0  # reports, but does not fail without the flag
    out = capsys.readouterr().out
    assert "op_stats (xla, by total_ns)" in out and "vanished  add" in out and "new       conv" in out
    assert main(["diff", str(a), str(b), "--fail-on-regression"]) == 1
    assert "regression(s) past 10.0%" in capsys.readouterr().err
    assert main(["diff", str(a), str(b), "--fail-on-regression", "--threshold-pct", "50",
                 "--min-share-pct", "5"]) == 0
    assert main(["diff", str(a), str(a), "--fail-on-regression"]) == 0


def test_diff_json_output(tmp_path, capsys):
    """--format json gives the plain rows with deltas and statuses."""
    a = _result({"dot": 1000}).save(tmp_path / "a.json")
    b = _result({"dot": 500}).save(tmp_path / "b.json")
    assert main(["diff", str(a), str(b), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["key"]: r for r in data["tables"][0]["rows"]}
    assert rows["dot"]["delta_ns"] == -500 and rows["dot"]["delta_pct"] == -50.0 and not rows["dot"]["regressed"]
    assert data["regressions"] == 0


def test_diff_unreadable_file_is_an_error(tmp_path, capsys):
    """A missing input exits non-zero naming the file."""
    a = _result({"dot": 1}).save(tmp_path / "a.json")
    assert main(["diff", str(a), str(tmp_path / "missing.json")]) == 2  # a missing input is a user mistake
    assert "missing.json" in capsys.readouterr().err


# -- report ------------------------------------------------------------------------------------------
def test_report_rerenders_a_saved_result_with_any_reporter(tmp_path, capsys):
    """`omniprof report FILE -r R` renders a saved result with table (stdout) and json (file) alike."""
    from omniprof.testing import make_result

    saved = make_result().save(tmp_path / "run.json")
    assert main(["report", str(saved), "-r", "table", "-R", "table.max_rows=1"]) == 0
    out = capsys.readouterr().out
    assert "Op statistics (top 1 of 2)" in out
    assert main(["report", str(saved), "-r", "json", "-o", str(tmp_path / "new-dir")]) == 0
    assert omniprof.load(tmp_path / "new-dir" / "omniprof.result.json") == omniprof.load(saved)


def test_report_of_an_unreadable_file_fails_with_its_name(tmp_path, capsys):
    """A file that is neither a result nor a trace exits 2 naming it."""
    bad = tmp_path / "notes.txt"
    bad.write_text("hello", encoding="utf-8")
    assert main(["report", str(bad)]) == 2
    assert "notes.txt: unrecognised file format" in capsys.readouterr().err


def test_reporter_options_from_the_command_line_override_the_file(proj, capsys):
    """-R REPORTER.KEY=VALUE on the command line wins over [reporters.NAME] in the file."""
    write(proj / "r.toml", 'script = "work.py"\nreporter = "table"\n[reporters.table]\nformat = "tree"\n')
    assert main(["run", "--config", "r.toml", "-R", "table.format=flat"]) == 0
    out = capsys.readouterr().out
    assert "Flat (by self time" in out and "Call tree" not in out


def test_config_plugins_key_registers_local_plugins(proj, monkeypatch):
    """`plugins = "FILE"` in a config makes that plugins.toml's local backends selectable in the same file."""
    write(proj / "tickmod.py", """
        from omniprof.plugin import Backend
        from omniprof.core.results import BackendResult

        class TickBackend(Backend):
            name = "tick"
            single_session = False
            def start(self):
                self.t0 = self.clock.now_ns()
            def stop(self):
                return BackendResult(backend=self.name, start_ns=self.t0, end_ns=self.clock.now_ns())
        """)
    monkeypatch.syspath_prepend(str(proj))
    write(proj / "local-plugins.toml", '[backend.tick]\ntarget = "tickmod:TickBackend"\n')
    write(proj / "t.toml", """
        script = "work.py"
        plugins = "local-plugins.toml"
        backend = ["cpu", "tick"]
        [reporters.json]
        output = "t.json"
        """)
    assert main(["config", "check", "t.toml"]) == 0
    assert main(["run", "--config", "t.toml"]) == 0
    assert [p.backend for p in omniprof.load(proj / "t.json").parts] == ["cpu", "tick"]


def test_plugins_command_lists_a_broken_local_plugin_with_the_fix(tmp_path, monkeypatch, capsys):
    """`omniprof plugins` shows a plugins.toml backend with a wrong api_version as broken, with the fix; exit 0."""
    (tmp_path / "oldplug.py").write_text(textwrap.dedent("""
        from omniprof.plugin import Backend
        class OldBackend(Backend):
            name = "old"
            api_version = 2
            def start(self): pass
            def stop(self): pass
        """), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    pf = write(tmp_path / "plugins.toml", '[backend.old]\ntarget = "oldplug:OldBackend"\n')
    assert main(["plugins", "--plugins", str(pf)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("old "))
    assert f"plugins.toml ({pf})" in line and "broken: backend 'old'" in line
    assert "api_version=2" in line and "Upgrade the plugin or omniprof" in line


def test_config_in_current_directory_applies_to_a_script_run(proj, capsys):
    """`omniprof run other.py` in a directory with omniprof.toml uses its settings with the script replaced;
    --no-config ignores the file."""
    write(proj / "other.py", "open('other.txt', 'a').write('ran\\n')\n")
    assert main(["run", "other.py"]) == 0
    assert (proj / "other.txt").read_text() == "ran\nran\n"  # repeats = 2 from the file
    assert (proj / "out" / "result.json").is_file()
    assert main(["run", "--no-config", "other.py"]) == 0
    assert (proj / "other.txt").read_text() == "ran\nran\nran\n"
    assert "== omniprof cpu" in capsys.readouterr().out  # the default table reporter, not the file's json


def test_run_a_function_from_the_command_line(tmp_path, monkeypatch, capsys):
    """`omniprof run pkg.mod:function ARGS` calls it with JSON-parsed args, and --config repeats apply."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    write(tmp_path / "fnmod.py", "def go(n, tag):\n    open('fn.txt', 'a').write(f'{n + 1}:{tag}\\n')\n")
    assert main(["run", "--no-config", "-r", "json", "-o", str(tmp_path / "o"), "fnmod:go", "41", "x"]) == 0
    assert (tmp_path / "fn.txt").read_text() == "42:x\n"
    write(tmp_path / "omniprof.toml", "repeats = 3\n")
    assert main(["run", "fnmod:go", "1", "y"]) == 0
    assert (tmp_path / "fn.txt").read_text() == "42:x\n" + "2:y\n" * 3


def test_outdir_that_does_not_exist_is_created(tmp_path, monkeypatch):
    """`omniprof run -o DIR` makes DIR and writes the report inside it, not a file called DIR."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "job.py", "x = sum(range(1000))\n")
    assert main(["run", "--no-config", "-r", "json", "-o", "reports/run1", "job.py"]) == 0
    assert (tmp_path / "reports" / "run1" / "omniprof.result.json").is_file()
