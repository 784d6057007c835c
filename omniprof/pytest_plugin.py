"""pytest plugin (entry point ``pytest11``): profile tests with omniprof.

``pytest --omniprof`` profiles each test's call phase (``--omniprof=marked``: only tests marked
``@pytest.mark.omniprof``), writes one result per test (``<dir>/<test id>.json``, readable with
``omniprof report``) and prints the hottest functions of the slowest tests in the summary.

``--omniprof-baseline DIR --omniprof-fail-on-regression PCT`` compares each test with the result
of the same name in ``DIR`` (an earlier run's ``--omniprof-dir``) using ``omniprof diff``: the run
fails (exit 1) when a function or table total grew by more than ``PCT`` percent -- a CI gate.

Without ``--omniprof`` the plugin does nothing (it only registers the marker).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

_KEY = pytest.StashKey[dict]() if hasattr(pytest, "StashKey") else None


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("omniprof", "profiling with omniprof")
    g.addoption("--omniprof", nargs="?", const="all", default=None, choices=("all", "marked"),
                help="profile each test (or, with =marked, those marked @pytest.mark.omniprof)")
    g.addoption("--omniprof-backend", default="cpu", help="backend(s), comma-separated (default: cpu)")
    g.addoption("--omniprof-dir", default=".omniprof/pytest", help="where each test's result is written")
    g.addoption("--omniprof-top", type=int, default=5, help="tests (and functions each) shown in the summary")
    g.addoption("--omniprof-baseline", default=None, metavar="DIR", help="results of an earlier run to compare with")
    g.addoption("--omniprof-fail-on-regression", type=float, default=None, metavar="PCT",
                help="fail the run when a test's function or table time grew by more than PCT percent")
    g.addoption("--omniprof-min-ms", type=float, default=5.0, metavar="MS",
                help="entries under this time (in the new run) never count as regressions: noise (default 5)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "omniprof: profile this test with omniprof (pytest --omniprof=marked)")
    mode = config.getoption("--omniprof", None)
    if config.getoption("--omniprof-fail-on-regression", None) is not None and not config.getoption(
            "--omniprof-baseline", None):
        raise pytest.UsageError("--omniprof-fail-on-regression needs --omniprof-baseline DIR")
    baseline = config.getoption("--omniprof-baseline", None)
    if mode is None and baseline:
        raise pytest.UsageError("--omniprof-baseline needs --omniprof")
    if baseline:
        _check_baseline(Path(baseline))
    if mode is not None:
        config.pluginmanager.register(_Session(config, mode), "omniprof-session")


def _check_baseline(path: Path) -> None:
    """A baseline that is not there, or holds no result, would compare nothing and pass: an error."""
    record = f"record one first with: pytest --omniprof --omniprof-dir {path}"
    if not path.is_dir():
        why = "is a file, not a directory" if path.exists() else "does not exist"
        raise pytest.UsageError(f"--omniprof-baseline {path}: the directory {why}; {record}")
    if not any(path.glob("*.json")):
        raise pytest.UsageError(f"--omniprof-baseline {path}: the directory holds no results (*.json); {record}")


def _file_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:180] + ".json"


class _Session:
    def __init__(self, config: pytest.Config, mode: str) -> None:
        self.config = config
        self.mode = mode
        self.dir = Path(config.getoption("--omniprof-dir"))
        self.backends = [b.strip() for b in config.getoption("--omniprof-backend").split(",") if b.strip()]
        self.results: dict[str, Any] = {}
        self.regressions: list[tuple[str, str]] = []
        self.compared = 0

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        if self.mode == "marked" and item.get_closest_marker("omniprof") is None:
            yield
            return
        import omniprof

        prof = omniprof.Profiler(backend=self.backends)
        prof.start()
        try:
            yield
        finally:
            prof.stop()
            result = prof.result
            self.dir.mkdir(parents=True, exist_ok=True)
            result.save(self.dir / _file_name(item.nodeid))
            self.results[item.nodeid] = result
            self._compare(item.nodeid, result)

    def _compare(self, nodeid: str, result: Any) -> None:
        base_dir = self.config.getoption("--omniprof-baseline")
        pct = self.config.getoption("--omniprof-fail-on-regression")
        if not base_dir:
            return
        path = Path(base_dir) / _file_name(nodeid)
        if not path.is_file():
            return
        import omniprof
        from omniprof.analysis.diff import diff

        # One run a side: functions judged by their share of the samples, the total against the
        # noise model, as `omniprof diff A B` does (docs/diff.md).
        d = diff(omniprof.load(path), result, threshold_pct=pct if pct is not None else 10.0)
        self.compared += 1
        if pct is not None:
            floor_ns = self.config.getoption("--omniprof-min-ms") * 1e6
            for table, row in d.regressions:
                if row.b_ns < floor_ns:
                    continue  # a few samples of a tiny test: noise, not a slowdown
                self.regressions.append((nodeid, f"{table.name}: {row.key} {row.a_ns / 1e6:.2f} ms -> "
                                                 f"{row.b_ns / 1e6:.2f} ms"))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.regressions and session.exitstatus == 0:
            session.exitstatus = 1

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from omniprof.analysis import calltree
        from omniprof.core.units import format_ns

        tr = terminalreporter
        top = self.config.getoption("--omniprof-top")
        tr.write_sep("-", f"omniprof: {len(self.results)} test(s) profiled, results in {self.dir}")
        by_time = sorted(self.results.items(), key=lambda kv: -(kv[1].metadata.end_ns - kv[1].metadata.start_ns))
        for nodeid, result in by_time[:top]:
            dur = result.metadata.end_ns - result.metadata.start_ns
            tr.write_line(f"{format_ns(dur):>10}  {nodeid}")
            for part in result.parts:
                if not part.samples:
                    continue
                stacks, _ = calltree.report_stacks(part)
                total = sum(s.weight for s in stacks) or 1
                for r in calltree.flat_rows(stacks)[:3]:
                    if r.self_ns:
                        tr.write_line(f"{'':>12}{format_ns(r.self_ns):>10} {100 * r.self_ns / total:5.1f}%  "
                                      f"{calltree.frame_label(r.frame, line=False)}")
        base_dir = self.config.getoption("--omniprof-baseline")
        if base_dir:
            tr.write_line(f"omniprof: {self.compared} of {len(self.results)} profiled test(s) compared with the "
                          f"baseline {base_dir} (the others have no result there)")
        if self.regressions:
            tr.write_sep("-", f"omniprof: {len(self.regressions)} regression(s) against the baseline")
            for nodeid, what in self.regressions:
                tr.write_line(f"{nodeid}: {what}")
