"""CLI rough edges, each run as a user would: ``python -m omniprof ...`` in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def omniprof(*args: str, cwd: Path | None = None, timeout: float = 120, stdin: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    env.pop("OMNIPROF_REPORTER", None)
    return subprocess.run([sys.executable, "-m", "omniprof", *args], capture_output=True, text=True, cwd=cwd or ROOT,
                          env=env, timeout=timeout, input=stdin)


def script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


# A program with its own SIGALRM handler and 10 ms timer, counting the alarms it gets in 0.3 s.
OWN_ALARMS = """
    import signal, time
    hits = []
    signal.signal(signal.SIGALRM, lambda *a: hits.append(1))
    signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)
    t = time.perf_counter()
    while time.perf_counter() - t < 0.3:
        pass
    signal.setitimer(signal.ITIMER_REAL, 0)
    print("own alarms:", len(hits))
"""


def test_a_scripts_own_sigalrm_is_detected_and_left_working(tmp_path):
    """A script that installs its own SIGALRM handler and timer keeps them (its 10 ms alarms all
    arrive), and the run says the signal engine lost its timer (a timer_taken loss and a warning)."""
    prog = script(tmp_path, "alarm.py", OWN_ALARMS)
    proc = omniprof("run", "-O", "cpu.engine=signal", "-r", "json", "-o", str(tmp_path), str(prog))
    assert proc.returncode == 0, proc.stderr
    alarms = int(proc.stdout.split("own alarms:")[1].split()[0])
    assert 20 <= alarms <= 31  # 0.3 s / 10 ms, less what a loaded machine delays
    assert "installed its own SIGALRM handler" in proc.stderr
    data = json.loads((tmp_path / "omniprof.result.json").read_text())
    kinds = [loss["kind"] for part in data["parts"] for loss in part["losses"]]
    assert "timer_taken" in kinds


def test_a_scripts_own_sigalrm_needs_no_warning_under_the_native_engine(tmp_path):
    """The default (native) engine uses no signal: the script's alarms all arrive, the samples are
    there, and nothing is lost or warned about."""
    prog = script(tmp_path, "alarm.py", OWN_ALARMS)
    proc = omniprof("run", "-O", "cpu.engine=native", "-r", "json", "-o", str(tmp_path), str(prog))
    assert proc.returncode == 0, proc.stderr
    alarms = int(proc.stdout.split("own alarms:")[1].split()[0])
    assert 20 <= alarms <= 31
    assert "SIGALRM" not in proc.stderr
    data = json.loads((tmp_path / "omniprof.result.json").read_text())
    part = data["parts"][0]
    assert "timer_taken" not in [loss["kind"] for loss in part["losses"]]
    assert len(part["samples"]) >= 50  # 0.3 s at 1 kHz, on a loaded machine


def test_sys_exit_0_is_success(tmp_path):
    """A script ending in sys.exit(0) exits 0 with a complete profile; sys.exit(3) keeps its code
    and is recorded as the workload's failure."""
    ok = script(tmp_path, "ok.py", """
        import sys
        s = sum(i * i for i in range(300_000))
        sys.exit(0)
    """)
    proc = omniprof("run", str(ok))
    assert proc.returncode == 0, proc.stderr
    # the failure line the sys.exit(3) run below prints (not any "failed": a loss line may say
    # "failed validation" of a torn sample)
    assert "PARTIAL" not in proc.stdout and "workload failed" not in proc.stdout, proc.stdout
    bad = script(tmp_path, "bad.py", "import sys\nsys.exit(3)\n")
    proc = omniprof("run", str(bad))
    assert proc.returncode == 3
    assert "workload failed at run: SystemExit: 3" in proc.stdout


def test_library_profile_of_sys_exit_0_is_complete():
    import pytest

    import omniprof

    with pytest.raises(SystemExit), omniprof.Profiler(backend="cpu") as prof:
        raise SystemExit(0)
    assert not prof.result.partial and prof.result.errors == ()


def test_unwritable_logdir_hint_names_the_logdir_flag(tmp_path):
    """A --logdir that cannot be written (/sys: read-only in containers, root-only elsewhere) gets
    one error line whose hint names --logdir, not -o."""
    prog = script(tmp_path, "p.py", "x = 1\n")
    proc = omniprof("run", "--logdir", "/sys/omniprof-test-logs", str(prog))
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("omniprof: error:")]
    assert len(err) == 1, proc.stderr
    assert "(--logdir DIR)" in err[0] and "-o DIR" not in err[0]


def test_an_existing_name_hint_names_no_missing_flag():
    from omniprof.core.fileio import output_error

    msg = str(output_error("/x/report.json", FileExistsError(17, "exists")))
    assert "allow overwriting" not in msg and "never replaces" in msg


def test_backend_name_in_the_wrong_case_gets_a_suggestion(tmp_path):
    prog = script(tmp_path, "p.py", "x = 1\n")
    proc = omniprof("run", "-b", "CPU", str(prog))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]  # one line
    assert "did you mean 'cpu'?" in proc.stderr.lower()


def _closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """Run omniprof with stdout a pipe whose reader has already gone (``| head`` that exited)."""
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run([sys.executable, "-m", "omniprof", *args], stdout=w, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT, env=env, timeout=120)
    finally:
        os.close(w)
    return proc


def _quiet_141(proc: subprocess.CompletedProcess[str], what: object) -> None:
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, (what, proc.stderr)
    assert "Broken pipe" not in proc.stderr and "Exception ignored" not in proc.stderr, (what, proc.stderr)
    assert proc.returncode == 141, (what, proc.returncode, proc.stderr)


def test_closed_pipe_is_quiet(tmp_path):
    """plugins, config show, doctor, --version and diff (text and json) into a pipe whose reader
    is gone: no traceback, no message, exit 141 (128 + SIGPIPE) as a shell reports git or cat."""
    from omniprof.testing.fakes import make_result

    a = make_result().save(tmp_path / "a.json")
    cfg = tmp_path / "omniprof.toml"
    cfg.write_text('script = "x.py"\n')
    (tmp_path / "x.py").write_text("x = 1\n")
    for args in (["plugins", "--no-probe"], ["config", "show", str(cfg)], ["doctor", "--no-frameworks"],
                 ["--version"], ["diff", "--format", "json", str(a), str(a)], ["diff", str(a), str(a)]):
        _quiet_141(_closed_pipe(*args), args)


def test_closed_pipe_report_is_quiet_and_file_reports_are_still_written(tmp_path):
    """`omniprof report -r table,json -o DIR | head`: the table cannot be written (no 'cannot write
    <stdout>' error), the json report after it still is, then exit 141."""
    from omniprof.testing.fakes import make_result

    a = make_result().save(tmp_path / "a.json")
    proc = _closed_pipe("report", str(a), "-r", "table,json", "-o", str(tmp_path / "out"))
    _quiet_141(proc, "report")
    assert proc.stderr.splitlines() == [f"omniprof: json report written to {tmp_path / 'out' / 'omniprof.result.json'}"]
    assert json.loads((tmp_path / "out" / "omniprof.result.json").read_text())["parts"]


def test_closed_pipe_run_is_quiet_and_keeps_the_profile(tmp_path):
    """`omniprof run chatty.py | head`: the target's BrokenPipeError on its own prints is the reader
    going away, not the target's failure (no traceback); the file report is written; exit 141.
    A BrokenPipeError of the target's own (a socket) is still the target's error."""
    prog = script(tmp_path, "chatty.py", """
        for i in range(200_000):
            print(i)
    """)
    proc = _closed_pipe("run", "-r", "table,json", "-o", str(tmp_path / "out"), str(prog))
    _quiet_141(proc, "run")
    saved = json.loads((tmp_path / "out" / "omniprof.result.json").read_text())
    assert saved["parts"] and proc.stderr.splitlines() == [
        f"omniprof: json report written to {tmp_path / 'out' / 'omniprof.result.json'}"]
    own = script(tmp_path, "own.py", """
        import socket
        a, b = socket.socketpair()
        b.close()
        a.send(b"x" * 100_000)
    """)
    proc = omniprof("run", str(own))
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "BrokenPipeError" in proc.stderr, proc.stderr
    assert "own.py" in proc.stderr and proc.stdout.startswith("== omniprof")


def test_closed_pipe_view_perfetto_is_quiet(tmp_path):
    """`omniprof view --perfetto FILE | head`: the link cannot be printed; the server stops, exit 141."""
    import omniprof as op
    from omniprof.testing.fakes import make_result

    trace = op.report(make_result(), "perfetto", tmp_path / "t.perfetto-trace")
    proc = _closed_pipe("view", "--perfetto", str(trace), "--port", "0", "--timeout-s", "30")
    _quiet_141(proc, "view")


def test_run_m_missing_module_is_one_line(tmp_path):
    proc = omniprof("run", "-m", "no_such_module_xyz", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("omniprof: error: no module named 'no_such_module_xyz' "
                                   "(run from the directory that holds it, or install it)")
    assert proc.stdout == ""


def test_function_target_whose_module_fails_shows_the_users_traceback(tmp_path):
    """mod:function where mod raises on import: the user's traceback (their file and line), no
    omniprof or importlib frame, exit 1."""
    script(tmp_path, "badmod.py", """
        def helper():
            raise RuntimeError("config missing")
        helper()
        def main():
            pass
    """)
    proc = omniprof("run", "badmod:main", cwd=tmp_path)
    assert proc.returncode == 1
    err = proc.stderr
    assert err.startswith("Traceback (most recent call last):")
    assert 'badmod.py", line 4, in <module>' in err and 'line 3, in helper' in err
    assert err.strip().endswith("RuntimeError: config missing")
    assert "omniprof/" not in err and "importlib" not in err
    missing = omniprof("run", "nomod_xyz:main", cwd=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr and "not found" in missing.stderr


def test_unknown_no_plugin_is_rejected(tmp_path):
    prog = script(tmp_path, "p.py", "x = 1\n")
    proc = omniprof("run", "--no-plugin", "nosuch", str(prog))
    assert proc.returncode == 2
    assert proc.stderr.startswith("omniprof: error: --no-plugin 'nosuch': no plugin of that name")
    ok = omniprof("run", "--no-plugin", "tensorboard", str(prog))
    assert ok.returncode == 0, ok.stderr


def test_report_on_json_that_is_no_profile(tmp_path):
    """{"a": 1} and [1, 2, 3] are one clear error line each, exit 2."""
    for name, text, needle in (("obj.json", '{"a": 1}', "neither an omniprof result"),
                               ("arr.json", "[1, 2, 3]", "not a Chrome/Kineto trace")):
        (tmp_path / name).write_text(text)
        proc = omniprof("report", str(tmp_path / name))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and needle in proc.stderr and proc.stdout == ""


def test_warnings_are_one_omniprof_line(tmp_path):
    """A warning of omniprof's (a dropped sample buffer) is one 'omniprof: warning:' line with no
    source line; a warning of the user's own script looks as Python prints it."""
    prog = script(tmp_path, "w.py", """
        import warnings
        s = 0
        for i in range(3_000_000):
            s += i
        warnings.warn("user's own warning")
    """)
    proc = omniprof("run", "-O", "cpu.max_samples=10", str(prog))
    assert proc.returncode == 0, proc.stderr
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("omniprof: warning:")]
    assert ours, proc.stderr
    assert "DataLossWarning" not in proc.stderr and "omniprof/" not in proc.stderr
    assert "w.py:6: UserWarning: user's own warning" in proc.stderr
