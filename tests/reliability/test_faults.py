"""Faults: the profiled program raising, exiting, interrupted or killed; backends, reporters and
plugins failing; the output disk full or read-only.

In each case the program's own exit status and exception are kept, what was recorded is saved as a
readable result marked partial, and the other backends and reporters still deliver. Signals are
sent to a real ``omniprof run`` child process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import omniprof
from omniprof.cli import main
from omniprof.core.fileio import OutputError
from omniprof.core.profiler import PARTIAL_FILENAME, RESULT_FILENAME, Profiler
from omniprof.errors import OmniprofWarning

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = """
[backend.fake]
target = "omniprof.testing.fakes:FakeBackend"
[backend.failstart]
target = "tests.reliability.fault_plugins:FailingStartBackend"
[backend.failstop]
target = "tests.reliability.fault_plugins:FailingStopBackend"
[backend.broken]
target = "tests.reliability.raises_at_import:Nothing"
[reporter.boom]
target = "tests.reliability.fault_plugins:FailingReporter"
"""
# A target that says when it is running, then works until told (or killed).
BUSY = """
import sys, time
import omniprof
def work(seconds):
    end = time.time() + seconds
    while time.time() < end:
        with omniprof.annotate("chunk"):
            sum(i * i for i in range(2000))
print("ready", flush=True)
work(float(sys.argv[1]) if len(sys.argv) > 1 else 60)
"""


@pytest.fixture
def proj(tmp_path, monkeypatch):
    """A project directory with the busy target and a plugins.toml of failing plugins."""
    (tmp_path / "busy.py").write_text(BUSY)
    (tmp_path / "plugins.toml").write_text(PLUGINS)
    monkeypatch.setenv("OMNIPROF_PLUGINS", str(tmp_path / "plugins.toml"))  # named: never loaded from cwd alone
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.syspath_prepend(str(ROOT))
    return tmp_path


def _child(args: list[str], cwd: Path, env: dict[str, str] | None = None, prefix: list[str] | None = None
           ) -> subprocess.Popen[str]:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen([*(prefix or []), sys.executable, "-m", "omniprof", *args], cwd=cwd, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_ready(p: subprocess.Popen[str]) -> None:
    line = p.stdout.readline()
    assert line.strip() == "ready", (line, p.stderr.read() if p.poll() is not None else "")
    time.sleep(0.5)  # let the sampler record a few hundred samples


def _session_files(logdir: Path, name: str) -> list[Path]:
    return sorted(logdir.glob(f"plugins/profile/*/{name}"))


def _load_one(logdir: Path, name: str = RESULT_FILENAME) -> omniprof.ProfileResult:
    files = _session_files(logdir, name)
    assert len(files) == 1, list(logdir.rglob("*"))
    return omniprof.load(files[0])


# -- the program fails -------------------------------------------------------------------------------
def test_target_raising_keeps_exception_status_and_partial_result(proj, capsys, tally):
    """A raising target exits 1 with its own traceback; the result on disk is partial, names the
    exception, and every reporter still delivers."""
    (proj / "bad.py").write_text("def f():\n    sum(range(300000))\n    raise LookupError('nope')\nf()\n")
    tally.fault("target raises")
    rc = main(["run", "--logdir", "L", "-r", "table,json", "-o", "out", "bad.py"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "LookupError: nope" in err and "omniprof/cli.py" not in err
    assert "== omniprof cpu" in out
    r = _load_one(proj / "L")
    assert r.partial and [(e.source, e.type, e.message) for e in r.errors] == [("workload", "LookupError", "nope")]
    assert omniprof.load(proj / "out" / RESULT_FILENAME) == r


@pytest.mark.parametrize("code", [0, 3, "message"])
def test_target_sys_exit_status_kept(proj, capsys, code, tally):
    """sys.exit(N) in the target becomes omniprof's exit status (a message exits 1, as python does),
    and the profile is saved."""
    (proj / "ex.py").write_text(f"import sys\nsum(range(100000))\nsys.exit({code!r})\n")
    tally.fault("target sys.exit")
    rc = main(["run", "--logdir", "L", "ex.py"])
    assert rc == (1 if code == "message" else code)
    assert _load_one(proj / "L").parts[0].backend == "cpu"


def test_sigint_exits_130_with_partial_result(proj, tally):
    """SIGINT (Ctrl-C) stops the target with KeyboardInterrupt: exit 130, samples saved, partial."""
    p = _child(["run", "--logdir", "L", "-r", "json", "-o", "out", "busy.py"], proj)
    _wait_ready(p)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    tally.fault("SIGINT")
    assert p.returncode == 130, err
    assert "KeyboardInterrupt" in err
    r = _load_one(proj / "L")
    assert r.partial and r.errors[0].type == "KeyboardInterrupt"
    assert r.part("cpu").samples
    assert (proj / "out" / RESULT_FILENAME).is_file()


@pytest.mark.parametrize("via", ["script", "config"])
def test_sigterm_saves_partial_result_then_dies_of_sigterm(proj, tally, via):
    """SIGTERM stops profiling, writes the partial result and the reports, then omniprof dies of
    SIGTERM itself, so the parent sees 'killed by SIGTERM' as without omniprof."""
    if via == "config":
        (proj / "omniprof.toml").write_text('script = "busy.py"\nlogdir = "L"\noutdir = "out"\n'
                                            '[reporters.json]\n')
        args = ["run", "--config", "omniprof.toml"]
    else:
        args = ["run", "--logdir", "L", "-r", "json", "-o", "out", "busy.py"]
    p = _child(args, proj)
    _wait_ready(p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    tally.fault("SIGTERM")
    assert p.returncode == -signal.SIGTERM, err
    assert "terminated by SIGTERM" in err and "Traceback" not in err
    r = _load_one(proj / "L")
    assert r.partial and (r.errors[0].source, r.errors[0].type) == ("workload", "Terminated")
    assert r.part("cpu").samples
    assert omniprof.load(proj / "out" / RESULT_FILENAME) == r


def test_target_with_own_sigterm_handler_keeps_it(proj, tally):
    """A target that handles SIGTERM itself keeps its handler: omniprof does not take it over."""
    (proj / "own.py").write_text(textwrap.dedent("""
        import signal, sys, time
        def bye(signum, frame):
            print("target handled", signum, flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        while True:
            time.sleep(0.01)
    """))
    p = _child(["run", "--logdir", "L", "own.py"], proj)
    _wait_ready(p)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    tally.fault("SIGTERM (target's own handler)")
    assert p.returncode == 7 and "target handled 15" in out, err
    assert _load_one(proj / "L").part("cpu")


def test_sigkill_leaves_readable_checkpoint(proj, tally):
    """A run killed with SIGKILL (nothing can run at kill time) still leaves a readable partial
    result: the checkpoint written while recording, with what was recorded up to it."""
    p = _child(["run", "--plugins", "plugins.toml", "-b", "cpu,fake", "--logdir", "L", "busy.py"], proj,
               env={"OMNIPROF_CHECKPOINT_S": "0.2"})
    _wait_ready(p)
    time.sleep(1.0)
    p.kill()
    p.communicate(timeout=60)
    tally.fault("SIGKILL")
    assert p.returncode == -signal.SIGKILL
    assert not _session_files(proj / "L", RESULT_FILENAME)
    r = _load_one(proj / "L", PARTIAL_FILENAME)
    assert r.partial and any(e.type == "Incomplete" for e in r.errors)
    assert [p.backend for p in r.parts] == ["cpu", "fake"]
    assert any(s.name == "chunk" for s in r.part("fake").spans), "annotations recorded before the kill"
    cpu = r.part("cpu")
    assert cpu.samples and cpu.metadata.get("checkpoint"), "the cpu samples taken before the kill"
    assert any(f.name == "work" for f in cpu.frames) and any(s.name == "chunk" for s in cpu.spans)
    # the partial file is an ordinary result: every tool reads it
    assert main(["report", str(_session_files(proj / "L", PARTIAL_FILENAME)[0]), "-r", "json", "-o", "rep"]) == 0


def test_checkpoint_removed_after_normal_end_and_cost_counted(proj, registry_with, monkeypatch, tally):
    """A run that ends normally leaves only the final result; checkpoints were taken and timed."""
    monkeypatch.setenv("OMNIPROF_CHECKPOINT_S", "0.05")
    reg = registry_with(("backend", "fake", "omniprof.testing.fakes:FakeBackend"))
    with Profiler(backend=["cpu", "fake"], logdir=proj / "L", registry=reg) as prof:
        end = time.time() + 0.4
        while time.time() < end:
            with omniprof.annotate("x"):
                sum(range(1000))
    tally.fault("checkpoint during normal run")
    assert prof.checkpoints >= 2 and prof.checkpoint_max_ns > 0
    assert _session_files(proj / "L", RESULT_FILENAME) and not _session_files(proj / "L", PARTIAL_FILENAME)


def test_first_checkpoint_is_written_off_the_step_that_starts_recording(tmp_path, registry_with, monkeypatch, tally):
    """With a schedule, the step() that starts recording returns before the first checkpoint is taken
    (its snapshot waits here on a gate), and nothing is compiled between that step and the written
    file: cattrs' hooks were built in the warm-up. Before, the first checkpoint ran inside that step
    (30-50 ms of cattrs compiling in each rank of a 4-rank DDP job) and was read as the user's time."""
    from tests.reliability.fault_plugins import GatedSnapshotBackend as Gated

    monkeypatch.setenv("OMNIPROF_CHECKPOINT_S", "60")
    reg = registry_with(("backend", "gated", "tests.reliability.fault_plugins:GatedSnapshotBackend"))
    Gated.gate.clear()
    Gated.snapshot_threads.clear()
    compiled: list[str] = []
    watching = [False]

    def audit(event: str, args: tuple) -> None:
        if watching[0] and event == "compile":
            compiled.append(str(args[1]))

    sys.addaudithook(audit)
    prof = Profiler(backend="gated", logdir=tmp_path / "L", registry=reg,
                    schedule=omniprof.schedule(wait=0, warmup=1, active=2, repeat=1))
    try:
        prof.start()  # step 0: warm-up (prepare)
        watching[0] = True
        prof.step()  # step 1 records: the backend starts; the checkpoint thread is told to write one
        assert Gated.gate.is_set() is False  # step() did not wait on the gated snapshot
        Gated.gate.set()
        deadline = time.monotonic() + 30
        while not _session_files(tmp_path / "L", PARTIAL_FILENAME) and time.monotonic() < deadline:
            time.sleep(0.01)
        watching[0] = False
        assert _session_files(tmp_path / "L", PARTIAL_FILENAME), "the first checkpoint was written"
        assert Gated.snapshot_threads[:1] == ["omniprof-checkpoint"]
        assert compiled == []
    finally:
        watching[0] = False
        Gated.gate.set()
        prof.stop()
    tally.fault("first checkpoint off the recording step")
    assert _session_files(tmp_path / "L", RESULT_FILENAME) and not _session_files(tmp_path / "L", PARTIAL_FILENAME)


# -- omniprof's own parts fail ------------------------------------------------------------------------
def test_backend_failing_at_start_others_deliver(proj, capsys, tally):
    """A backend that fails to start is recorded and warned about; the cpu profile is reported."""
    tally.fault("backend fails at start")
    with pytest.warns(OmniprofWarning, match="'failstart' failed to start"):
        rc = main(["run", "--plugins", "plugins.toml", "-b", "cpu,failstart", "--logdir", "L", "busy.py", "0.3"])
    out, err = capsys.readouterr()
    assert rc == 0
    r = _load_one(proj / "L")
    assert r.partial and [p.backend for p in r.parts] == ["cpu"] and r.part("cpu").samples
    assert [(e.source, e.phase) for e in r.errors] == [("failstart", "start")]
    assert "== omniprof cpu" in out


def test_backend_failing_at_stop_others_deliver(proj, capsys, tally):
    """A backend that fails at stop: exit 1 with one error line, yet the result is saved and the
    reports of the other backends' data are written."""
    tally.fault("backend fails at stop")
    rc = main(["run", "--plugins", "plugins.toml", "-b", "cpu,failstop", "--logdir", "L", "-r", "table,json",
               "-o", "out", "busy.py", "0.3"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "failstop" in err and "lost connection" in err and "Traceback" not in err
    assert "== omniprof cpu" in out
    r = omniprof.load(proj / "out" / RESULT_FILENAME)
    assert r.partial and [p.backend for p in r.parts] == ["cpu"]
    assert _load_one(proj / "L") == r


def test_workload_exception_wins_over_backend_stop_failure(registry_with, tally):
    """When the workload raises and a backend then fails at stop, the workload's exception
    propagates (not omniprof's), the failure is warned about and recorded."""
    reg = registry_with(("backend", "fake", "omniprof.testing.fakes:FakeBackend"),
                        ("backend", "failstop", "tests.reliability.fault_plugins:FailingStopBackend"))
    prof = Profiler(backend=["fake", "failstop"], registry=reg)
    tally.fault("workload raises + backend fails at stop")
    with pytest.warns(OmniprofWarning, match="failstop.*while the profiled code raised KeyError"):
        with pytest.raises(KeyError, match="user bug"):
            with prof:
                raise KeyError("user bug")
    r = prof.result
    assert [(e.source, e.phase) for e in r.errors] == [("workload", "run"), ("failstop", "stop")]
    assert [p.backend for p in r.parts] == ["fake"]


def test_reporter_failing_others_deliver(proj, capsys, tally):
    """A reporter that raises is reported in one line naming it; the other reporters still write."""
    tally.fault("reporter fails")
    rc = main(["run", "--plugins", "plugins.toml", "-r", "boom,json", "-o", "out", "busy.py", "0.2"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "boom" in err and "reporter exploded" in err and "Traceback" not in err
    assert omniprof.load(proj / "out" / RESULT_FILENAME).part("cpu").samples


def test_plugin_raising_at_import(proj, capsys, tally):
    """A plugin whose module raises at import is listed as broken, breaks nothing unselected, and
    selecting it is one clear error (exit 2) naming it and the import failure."""
    tally.fault("plugin raises at import")
    assert main(["plugins", "--plugins", "plugins.toml", "--no-probe"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("broken "))
    assert "broken" in line.split(None, 3)[3] and "native library is missing" in line
    assert main(["run", "--plugins", "plugins.toml", "busy.py", "0.1"]) == 0
    capsys.readouterr()
    assert main(["run", "--plugins", "plugins.toml", "-b", "broken", "busy.py", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "broken" in err and "native library is missing" in err and "Traceback" not in err


def test_session_save_failing_keeps_result_and_workload_exception(tmp_path, registry_with, tally, monkeypatch):
    """When the session directory cannot be written at the end (here: it was replaced by a file),
    the result stays in memory marked partial with the reason, and a workload exception still wins."""
    # No checkpoint thread writing into the directory while the test replaces it (the first
    # checkpoint is written by that thread at once, not by start()).
    monkeypatch.setenv("OMNIPROF_CHECKPOINT_S", "0")
    reg = registry_with(("backend", "fake", "omniprof.testing.fakes:FakeBackend"))
    prof = Profiler(backend="fake", logdir=tmp_path / "L", registry=reg)
    tally.fault("session save fails")
    with pytest.warns(OmniprofWarning, match="cannot write"):
        with pytest.raises(ZeroDivisionError):
            with prof:
                shutil.rmtree(prof.session_dir)
                prof.session_dir.write_text("not a directory")
                1 / 0  # noqa: B018
    r = prof.result
    assert r.partial and [e.phase for e in r.errors] == ["run", "save"]
    prof2 = Profiler(backend="fake", logdir=tmp_path / "L2", registry=reg)
    prof2.start()
    shutil.rmtree(prof2.session_dir)
    prof2.session_dir.write_text("x")
    with pytest.raises(OutputError, match="cannot write"):
        prof2.stop()
    assert prof2.result.errors[-1].phase == "save" and not prof2.is_running


def _unshare() -> list[str] | None:
    """A prefix running a command as root of a private user+mount namespace, or None."""
    exe = shutil.which("unshare")
    if exe is None:
        return None
    probe = subprocess.run([exe, "-rm", "true"], capture_output=True)
    return [exe, "-rm"] if probe.returncode == 0 else None


@pytest.mark.parametrize("fault", ["disk full", "read-only"])
def test_output_disk_full_or_read_only(proj, tally, fault):
    """With the output directory on a full (tiny tmpfs) or read-only file system: the target's exit
    status is kept, the error is one line naming the path and the reason, the terminal report is
    still printed, the result is saved in the working directory (one line says so), and no
    temporary or torn file is left behind. A read-only one is found before the target runs: exit
    2, one line, nothing run."""
    prefix = _unshare()
    if prefix is None:
        pytest.skip("needs `unshare -rm` (user and mount namespaces) to mount a small or read-only tmpfs")
    out_dir = proj / "out"
    out_dir.mkdir()
    opts = "size=4k" if fault == "disk full" else "ro"
    (proj / "ex.py").write_text(textwrap.dedent("""
        import sys
        def rec(n):
            return sum(range(3000)) if n == 0 else rec(n - 1)
        for i in range(4000):
            rec(i % 80)
        sys.exit(4)
    """))
    saved = proj / "saved"
    script = (f"mount -t tmpfs -o {opts} tmpfs {out_dir} && "
              f"{sys.executable} -m omniprof run -r table,json,speedscope -o {out_dir} ex.py; rc=$?; "
              f"cp -a {out_dir} {saved}; exit $rc")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([*prefix, "sh", "-c", script], cwd=proj, env=env, capture_output=True, text=True, timeout=120)
    tally.fault(f"output {fault}")
    if fault == "read-only":
        assert p.returncode == 2 and p.stdout == "", p.stderr
        assert p.stderr.splitlines() == [f"omniprof: error: cannot write '{out_dir}': the file system is read-only; "
                                         f"write to another directory (-o DIR) (nothing was run)"]
        return
    assert p.returncode == 4, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("omniprof: error:")]
    assert errors and all("the disk is full" in ln and str(out_dir) in ln for ln in errors), p.stderr
    assert "Traceback" not in p.stderr
    assert "== omniprof cpu" in p.stdout
    assert f"the result is saved in {proj / RESULT_FILENAME}" in p.stderr
    assert omniprof.load(proj / RESULT_FILENAME).part("cpu").samples
    left = sorted(f.name for f in saved.iterdir())
    assert not [f for f in left if f.endswith(".tmp")], left
    for f in saved.iterdir():  # whatever was published is complete
        json.loads(f.read_bytes())



def test_full_logdir_never_says_session_saved(proj, tally):
    """--logdir on a full tmpfs: one error line naming it, the reports still written elsewhere, and no
    "session saved" line (nothing was saved there)."""
    prefix = _unshare()
    if prefix is None:
        pytest.skip("needs `unshare -rm` (user and mount namespaces) to mount a small tmpfs")
    logdir = proj / "L"
    logdir.mkdir()
    (proj / "ex.py").write_text("print(sum(i * i for i in range(2_000_000)))\n")
    script = (f"mount -t tmpfs -o size=8k tmpfs {logdir} && head -c 8192 /dev/zero > {logdir}/fill; "
              f"OMNIPROF_CHECKPOINT_S=0 {sys.executable} -m omniprof run --logdir {logdir} -r json -o out ex.py")
    p = subprocess.run([*prefix, "sh", "-c", script], cwd=proj, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                       capture_output=True, text=True, timeout=120)
    tally.fault("logdir full")
    assert p.returncode == 1, p.stderr
    assert "session saved" not in p.stderr, p.stderr
    assert any(ln.startswith("omniprof: error:") and "the disk is full" in ln for ln in p.stderr.splitlines())
    assert omniprof.load(proj / "out" / RESULT_FILENAME).partial


SLOW_REPORTER = """
[reporter.slow]
target = "tests.reliability.fault_plugins:SlowFileReporter"
"""


@pytest.mark.parametrize("logdir", [False, True])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_while_writing_reports_keeps_the_result(proj, logdir, signum, tally):
    """Ctrl-C (often the second one: the first stopped the program) or SIGTERM while a report is
    written: that report is dropped whole, the json report after it is not written, but the result
    is never lost: it is in the session directory, or (no ``--logdir``) saved now beside the
    reports, and the last line says where. The file is read back and holds the program's samples."""
    (proj / "plugins.toml").write_text(PLUGINS + SLOW_REPORTER)
    (proj / "w.py").write_text("def spin():\n    return sum(i * i for i in range(400000))\nfor _ in range(5):\n"
                               "    spin()\n")
    p = _child(["run", *(["--logdir", "L"] if logdir else []), "-r", "slow,json", "-o", "out", "w.py"], proj)
    for line in p.stderr:
        if "slow reporter writing" in line:
            break
    p.send_signal(signum)
    out, err = p.communicate(timeout=60)
    tally.fault(f"{signal.Signals(signum).name} while writing reports")
    assert p.returncode == (130 if signum == signal.SIGINT else -signal.SIGTERM), err
    assert "Traceback" not in err, err
    if logdir:
        result = _load_one(proj / "L")
        assert sorted(f.name for f in (proj / "out").iterdir()) == [], "a temporary or torn file was left"
        saved_in = str(_session_files(proj / "L", RESULT_FILENAME)[0].parent)
    else:
        assert sorted(f.name for f in (proj / "out").iterdir()) == [RESULT_FILENAME]
        result = omniprof.load(proj / "out" / RESULT_FILENAME)
        saved_in = str(proj / "out" / RESULT_FILENAME)
    assert f"omniprof: interrupted while writing the reports; the result is saved in {saved_in}" in err, err
    cpu = result.part("cpu")
    names = {cpu.frames[i].name for s in cpu.samples for i in cpu.stacks[s.stack_id]}
    assert "spin" in names, names


def test_sigterm_while_writing_reports_leaves_no_tmp(proj, tally):
    """SIGTERM while a report is being written: the temporary file is removed, nothing half-written is
    published, omniprof dies of SIGTERM (-15), and the session result is on disk."""
    (proj / "plugins.toml").write_text(PLUGINS + SLOW_REPORTER)
    (proj / "w.py").write_text("sum(range(300000))\n")
    p = _child(["run", "--logdir", "L", "-r", "slow", "-o", "out", "w.py"], proj)
    for line in p.stderr:  # the reporter says when it is half-way
        if "slow reporter writing" in line:
            break
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    tally.fault("SIGTERM while writing reports")
    assert p.returncode == -signal.SIGTERM, err
    assert sorted(f.name for f in (proj / "out").iterdir()) == [], "a temporary or torn file was left"
    assert _load_one(proj / "L").parts[0].backend == "cpu"
