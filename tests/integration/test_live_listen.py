"""On-demand capture through a target's listener (``omniprof.live.listen()``): real processes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from omniprof.cli import main
from tests.tools import cli_as_nobody

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = textwrap.dedent('''
    from omniprof.live.listen import listen
    def crunch():
        x = 0
        for i in range(20000):
            x += i * i
        return x
    print(listen(), flush=True)
    while True:
        crunch()
''')


@pytest.fixture
def listening():
    p = subprocess.Popen([sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    path = p.stdout.readline().strip()
    yield p, path
    p.kill()
    p.wait()


def _collector(pid: int, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "omniprof", "attach", str(pid), "-b", "cpu", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})


def test_capture_runs_the_backend_inside_and_brings_the_result_back(listening, tmp_path, capsys):
    p, path = listening
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    out = tmp_path / "o"
    assert main(["attach", str(p.pid), "-b", "cpu", "--duration-ms", "400", "-r", "json", "-o", str(out)]) == 0
    doc = json.loads(next(out.iterdir()).read_text())
    from omniprof.core.results import ProfileResult

    result = ProfileResult.from_dict(doc)
    part = result.part("cpu")
    assert result.metadata.pid == p.pid  # recorded inside the target
    leafs = [part.frames[part.stacks[s.stack_id][-1]].name for s in part.samples if part.stacks[s.stack_id]]
    assert leafs.count("crunch") > len(leafs) / 2


def test_a_second_collector_is_refused_naming_the_first_and_a_killed_one_leaves_nothing(listening, tmp_path):
    p, _ = listening
    first = None
    deadline = time.monotonic() + 30
    while True:  # the first capture is running once the second is refused
        if first is None or first.poll() is not None:
            # (again where the probe below got in first: then the first was the one refused)
            first = _collector(p.pid, "--duration-ms", "4000", "-r", "json", "-o", str(tmp_path / "first"))
        second = _collector(p.pid, "--duration-ms", "100")
        _, err = second.communicate(timeout=60)
        if second.returncode == 2 and "already running" in err:
            break
        assert time.monotonic() < deadline, err
        time.sleep(0.2)
    assert f"collector pid {first.pid}" in err and len(err.strip().splitlines()) == 1
    first.kill()  # the collector dies mid-capture: the window ends by itself, the target keeps running
    first.wait()
    deadline = time.monotonic() + 30
    while True:
        third = _collector(p.pid, "--duration-ms", "100", "-r", "json", "-o", str(tmp_path / "third"))
        _, err = third.communicate(timeout=60)
        if third.returncode == 0:
            break
        assert "already running" in err and time.monotonic() < deadline, err
        time.sleep(0.3)
    assert p.poll() is None


def test_not_listening_and_another_user_exit_2(listening, capsys):
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert main(["attach", str(plain.pid), "-b", "cpu", "--duration-ms", "100"]) == 2
        err = capsys.readouterr().err.strip()
        assert "is not listening" in err and len(err.splitlines()) == 1
    finally:
        plain.kill()
        plain.wait()
    p, _ = listening
    code, err = cli_as_nobody(["attach", str(p.pid), "-b", "cpu", "--duration-ms", "100"])
    assert code == 2, err
    assert "permission denied" in err and len(err.strip().splitlines()) == 1
