"""The pytest plugin, run on a real inner test session (pytester, in a subprocess)."""

from __future__ import annotations

import importlib.metadata as md
import json

import pytest

pytest_plugins = ["pytester"]

_REGISTERED = any(ep.value == "omniprof.pytest_plugin" for ep in md.entry_points(group="pytest11"))
PLUGIN = () if _REGISTERED else ("-p", "omniprof.pytest_plugin")

TESTS = """
import time

def hot(n):
    s = 0
    for i in range(n):
        s += i * i
    return s

def test_hot():
    t = time.perf_counter()
    while time.perf_counter() - t < {seconds}:
        hot(20_000)

def test_quick():
    assert sum(range(10)) == 45
"""


def _run(pytester: pytest.Pytester, *args: str, seconds: float = 0.2) -> pytest.RunResult:
    pytester.makepyfile(test_inner=TESTS.format(seconds=seconds))
    return pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", *args)


def test_each_test_profiled_and_hot_spots_in_the_summary(pytester: pytest.Pytester):
    """--omniprof writes one readable result per test; the summary names the hot function of
    the slowest test with most of its time (it loops in hot() by construction)."""
    res = _run(pytester, "--omniprof", "--omniprof-dir", "prof")
    assert res.ret == 0, res.stdout.str()
    files = sorted(p.name for p in (pytester.path / "prof").iterdir())
    assert files == ["test_inner.py_test_hot.json", "test_inner.py_test_quick.json"]
    data = json.loads((pytester.path / "prof" / files[0]).read_text())
    assert data["parts"][0]["samples"]
    out = res.stdout.str()
    assert "omniprof: 2 test(s) profiled" in out
    line = next(ln for ln in out.splitlines() if ln.strip().endswith("hot  test_inner.py"))
    assert float(line.split("%")[0].split()[-1]) >= 50.0


def test_marked_only(pytester: pytest.Pytester):
    pytester.makepyfile(test_m="""
import pytest

@pytest.mark.omniprof
def test_a():
    sum(range(100_000))

def test_b():
    pass
""")
    res = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", "--omniprof=marked", "--omniprof-dir", "p")
    assert res.ret == 0
    assert [p.name for p in (pytester.path / "p").iterdir()] == ["test_m.py_test_a.json"]


def test_without_the_flag_nothing_happens(pytester: pytest.Pytester):
    res = _run(pytester)
    assert res.ret == 0 and "omniprof:" not in res.stdout.str()
    assert not (pytester.path / ".omniprof").exists()


def test_regression_gate(pytester: pytest.Pytester):
    """A baseline run, then the hot test made 4x slower: with --omniprof-fail-on-regression 50 the
    run fails and names the test; the same code against its own baseline at 300% passes."""
    assert _run(pytester, "--omniprof", "--omniprof-dir", "base", seconds=0.1).ret == 0
    slow = _run(pytester, "--omniprof", "--omniprof-dir", "new", "--omniprof-baseline", "base",
                "--omniprof-fail-on-regression", "50", seconds=0.4)
    assert slow.ret == 1, slow.stdout.str()
    assert "regression(s) against the baseline" in slow.stdout.str()
    assert "test_inner.py::test_hot" in slow.stdout.str().split("against the baseline")[1]
    same = _run(pytester, "--omniprof", "--omniprof-dir", "again", "--omniprof-baseline", "base",
                "--omniprof-fail-on-regression", "300", seconds=0.1)
    assert same.ret == 0, same.stdout.str()


def test_a_missing_or_empty_baseline_is_an_error(pytester: pytest.Pytester):
    """--omniprof-baseline naming a directory that is not there, or holds no result, would compare
    nothing and pass: it is a usage error naming the directory and how to record one."""
    missing = _run(pytester, "--omniprof", "--omniprof-baseline", "nosuchdir/", "--omniprof-fail-on-regression", "25")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    assert "--omniprof-baseline nosuchdir: the directory does not exist; record one first with: pytest --omniprof " \
           "--omniprof-dir nosuchdir" in missing.stderr.str()
    (pytester.path / "empty").mkdir()
    empty = _run(pytester, "--omniprof", "--omniprof-baseline", "empty")
    assert empty.ret == pytest.ExitCode.USAGE_ERROR
    assert "--omniprof-baseline empty: the directory holds no results (*.json)" in empty.stderr.str()
