"""omniprof's clocks are bound at import (issue 31, F2); a sampler's failure is counted, never raised
into the program; a result that would not load back is never saved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import omniprof
from omniprof.core import clock
from omniprof.errors import DataLossWarning, OutputError

ROOT = Path(__file__).resolve().parents[3]


def test_clocks_are_the_interpreters_even_when_patched_before_import():
    # The program patched time before omniprof was imported (freezegun started in a conftest):
    # omniprof's clocks come from a fresh built-in time module.
    code = ("import time\n"
            "time.perf_counter_ns = time.time_ns = time.monotonic_ns = lambda: 2**70\n"
            "time.perf_counter = time.monotonic = time.time = lambda: 1e30\n"
            "from omniprof.core import clock\n"
            "import json\n"
            "print(json.dumps([clock.perf_counter_ns(), clock.time_ns(), clock.monotonic_ns(), clock.perf_counter(),"
            " clock.wall_time(), clock.DEFAULT_CLOCK.now_ns()]))\n")
    before = time.time_ns()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    after = time.time_ns()
    perf_ns, unix_ns, mono_ns, perf_s, unix_s, now_ns = json.loads(out)
    assert before <= unix_ns <= after and before / 1e9 - 1 <= unix_s <= after / 1e9 + 1
    for ns in (perf_ns, mono_ns, now_ns):  # CLOCK_MONOTONIC: the same clock in both processes here
        assert 0 < ns <= time.monotonic_ns()
    assert 0 < perf_s <= time.perf_counter()


def test_clocks_ignore_patches_made_after_import(monkeypatch):
    monkeypatch.setattr(time, "perf_counter_ns", lambda: 2**70)
    monkeypatch.setattr(time, "time_ns", lambda: 0)
    a = clock.DEFAULT_CLOCK.now_ns()
    b = clock.perf_counter_ns()
    assert 0 < a <= b < 2**63
    assert clock.time_ns() > 1_600_000_000 * 10**9


class _BeyondClock:
    """A reference clock 2**70 ns ahead: no 64-bit buffer holds its stamps (what a program's
    ``time.perf_counter_ns = lambda: 2**70`` gave every engine before the clocks were bound)."""

    name = "beyond"

    def now_ns(self) -> int:
        return 2**70 + clock.perf_counter_ns()


def _spin(seconds: float) -> int:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += sum(range(200))
    return n


@pytest.mark.parametrize("engine", ["signal", "thread"])
def test_sampler_failures_are_counted_never_raised_into_the_program(tmp_path, engine):
    prof = omniprof.Profiler(backend="cpu", backend_options={"cpu": {"engine": engine, "interval_s": 0.002}},
                             clock=_BeyondClock(), logdir=tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the result would not load back (times beyond 64 bits): not saved, one line at the stop
        with pytest.raises(OutputError, match="would not load back .*outside the signed 64-bit range"):
            with prof:
                _spin(0.3)  # the signal engine's handler runs in here: an error there would end the program
    result = prof.result
    (loss,) = [x for x in result.losses if x.kind == "sampler_errors"]
    assert loss.count > 10 and "OverflowError" in loss.detail  # every tick failed, and each was counted
    assert any(issubclass(w.category, DataLossWarning) and "sampler failed" in str(w.message) for w in caught)
    assert not list(tmp_path.rglob("omniprof.result.json"))
    assert result.partial and any(e.phase == "save" and "would not load back" in e.message for e in result.errors)


def test_save_refuses_a_result_load_would_refuse(tmp_path):
    from unittest import mock

    bad = omniprof.ProfileResult(metadata=omniprof.core.results.RunMetadata(start_unix_ns=mock.MagicMock()))
    with pytest.raises(OutputError, match="would not load back.*start_unix_ns"):
        bad.save(tmp_path / "r.json")
    beyond = omniprof.ProfileResult(metadata=omniprof.core.results.RunMetadata(end_ns=2**70))
    with pytest.raises(OutputError, match="would not load back.*64-bit"):
        beyond.save(tmp_path / "r.json")
    assert not list(tmp_path.iterdir())  # nothing written, not even a temporary file
    good = omniprof.ProfileResult(metadata=omniprof.core.results.RunMetadata(end_ns=5))
    assert omniprof.load(good.save(tmp_path / "r.json")) == good
