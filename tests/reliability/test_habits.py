"""The program's own habits never cost its profile (issue 31): patched clocks, a deleted working
directory, a replaced or closed ``sys.stdout``, a terminal that cannot take UTF-8.

Each case is a real ``omniprof run`` of a small script; what the profile says is checked against
what the test measured around the run (its wall time, its wall-clock start) and against
``omniprof.load``.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import omniprof

ROOT = Path(__file__).resolve().parents[2]

WORK = """
def work():
    return sum(i * i for i in range(20000))
end = time.thread_time() + 0.25
while time.thread_time() < end:
    work()
print("program done", flush=True)
"""

PATCHES = {
    # freezegun, as a test suite leaves it running: it also swaps every module attribute that holds
    # a real time function, in every loaded module (omniprof's too)
    "freezegun": "import freezegun\nfreezegun.freeze_time('2001-01-01').start()\n",
    # a mock.patch started and never stopped
    "mock_patch": ("from unittest import mock\nmock.patch('time.perf_counter_ns', return_value=0).start()\n"
                   "mock.patch('time.time_ns', return_value=0).start()\n"
                   "mock.patch('time.monotonic_ns', return_value=0).start()\n"),
    "magicmock": ("from unittest import mock\n"
                  "time.perf_counter_ns = time.time_ns = time.monotonic_ns = mock.MagicMock()\n"),
    "beyond_64_bits": "time.perf_counter_ns = time.time_ns = time.monotonic_ns = lambda: 2**70\n",
}


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            **(env or {})}
    return subprocess.run([sys.executable, "-m", "omniprof", "run", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout)


def _session_s(stdout: str) -> float:
    m = re.search(r"== omniprof \S+  ([0-9.]+) s", stdout)
    assert m, f"no table header in:\n{stdout}"
    return float(m.group(1))


@pytest.mark.parametrize(("patch", "options"), [
    ("freezegun", []), ("mock_patch", []), ("magicmock", []),
    ("beyond_64_bits", ["-O", "cpu.engine=signal"]), ("beyond_64_bits", ["-O", "cpu.engine=thread"]),
    ("beyond_64_bits", ["-O", "cpu.engine=native"]), ("beyond_64_bits", ["-b", "memory"]),
])
def test_patched_clocks_never_reach_the_profile(tmp_path, patch, options):
    (tmp_path / "prog.py").write_text("import time\n" + PATCHES[patch] + WORK)
    t0_unix_ns, t0 = time.time_ns(), time.perf_counter()
    proc = _run([*options, "--logdir", "logs", "prog.py"], tmp_path)
    elapsed_s, t1_unix_ns = time.perf_counter() - t0, time.time_ns()
    assert proc.returncode == 0, proc.stderr
    assert "program done" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr
    # the session lasted no longer than the test's own wait for the whole command, and not 0
    assert 0.0 < _session_s(proc.stdout) <= elapsed_s
    assert " Hz achieved" not in proc.stdout or not re.search(r"\d{7,} Hz achieved", proc.stdout)
    (saved,) = glob.glob(str(tmp_path / "logs" / "**" / "omniprof.result.json"), recursive=True)
    result = omniprof.load(saved)  # always loads
    md = result.metadata
    assert t0_unix_ns <= md.start_unix_ns <= t1_unix_ns  # the wall clock, not the program's
    assert 0 < md.end_ns - md.start_ns <= elapsed_s * 1e9
    assert not [loss for loss in result.losses if loss.kind == "sampler_errors"]
    if "memory" not in options:
        assert result.part("cpu").samples  # the sampler kept sampling


def test_program_that_deletes_its_working_directory_keeps_its_table(tmp_path):
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import os, tempfile, time
        with tempfile.TemporaryDirectory() as d:
            os.chdir(d)
        """) + WORK)
    proc = _run(["prog.py"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "program done" in proc.stdout
    assert "Call tree" in proc.stdout and "work" in proc.stdout, proc.stdout
    assert "error" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("replacement", ["io.StringIO()", "None", "open(os.devnull, 'w')", "closed"])
def test_program_that_replaces_stdout_still_gets_the_table(tmp_path, replacement):
    setup = ("sys.stdout.close()" if replacement == "closed" else
             f"f = {replacement}\nif f is not None and not isinstance(f, io.StringIO):\n    f.close()\nsys.stdout = f")
    (tmp_path / "prog.py").write_text("import io, os, sys, time\n" + WORK + setup + "\n")
    proc = _run(["prog.py"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "error" not in proc.stderr, proc.stderr
    assert "program done" in proc.stdout
    assert "== omniprof cpu" in proc.stdout and "work" in proc.stdout, proc.stdout


# LC_ALL=C alone gives UTF-8 (python coerces the C locale, PEP 538/540); without the coercion the
# terminal's encoding is ASCII, as on a system whose python does not coerce.
@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"},
                                 {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
                                  "PYTHONIOENCODING": ""}])
def test_terminal_without_utf8_gets_the_table_with_ascii_rules(tmp_path, env):
    (tmp_path / "prog.py").write_text("import time\n" + WORK.replace("work", "caf\u00e9_work"), encoding="utf-8")
    proc = _run(["prog.py"], tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "error" not in proc.stderr, proc.stderr
    out = proc.stdout
    assert out.isascii()  # what an ASCII terminal can show
    assert "Call tree" in out and "\\xe9_work" in out  # the name spelled out, not lost
    rule = next(ln for ln in out.splitlines() if set(ln) == {"-"})  # the rule under the header
    header = out.splitlines()[out.splitlines().index(rule) - 1]
    assert len(rule) >= len(header.rstrip())
