"""Conformance suites a plugin's own tests reuse (as keyring's backend tests are reused).

::

    from omniprof.testing.conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        backend_cls = MyBackend

The suites are pytest classes: every ``test_*`` method runs against your class. Override
``backend_options()`` / ``reporter_options()`` to pass options; ``workload()`` to change what runs.
"""

from __future__ import annotations

import importlib.metadata as md
import io
import json
import threading
from pathlib import Path
from typing import Any, ClassVar

import attrs

from omniprof.plugin import SUPPORTED_API_VERSIONS, Backend, BackendContext
from omniprof.core.options import build_options
from omniprof.core.profiler import Profiler
from omniprof.core.registry import KINDS, Registry
from omniprof.core.results import BackendResult, ProfileResult
from omniprof.errors import BackendUnavailableError, InvalidArgumentError
from omniprof.plugin import Reporter
from omniprof.testing.fakes import make_result

__all__ = ["BackendConformance", "ReporterConformance"]


class BackendConformance:
    """Checks every backend must pass. Skips (with the probe's reason) where the backend is unavailable."""

    backend_cls: ClassVar[type[Backend]]

    def backend_options(self) -> Any:
        return None

    def workload(self) -> None:
        total = 0
        for i in range(20_000):
            total += i * i
        self._sink = total

    def _make(self, tmp_path: Path | None = None) -> Backend:
        import pytest

        try:
            self.backend_cls.probe()
        except BackendUnavailableError as e:
            pytest.skip(f"{self.backend_cls.name} unavailable: {e.reason}")
        return self.backend_cls(self.backend_options(), context=BackendContext(session_dir=tmp_path))

    def _session(self, tmp_path: Path | None = None) -> BackendResult:
        """One whole session (prepare, start, workload, stop, close); the backend's result."""
        b = self._make(tmp_path)
        b.prepare()
        b.start()
        self.workload()
        part = b.stop()
        b.close()
        return part

    def test_declares_plugin_api(self) -> None:
        cls = self.backend_cls
        assert isinstance(cls.name, str) and cls.name
        assert cls.api_version in SUPPORTED_API_VERSIONS
        assert attrs.has(cls.Options)
        assert not getattr(cls, "__abstractmethods__", None)

    def test_options_default_constructible(self) -> None:
        self.backend_cls.Options()

    def test_lifecycle_returns_plain_result(self, tmp_path: Path) -> None:
        b = self._make(tmp_path)
        b.prepare()
        b.start()
        self.workload()
        part = b.stop()
        b.close()
        b.close()  # idempotent
        assert isinstance(part, BackendResult)
        assert part.backend == self.backend_cls.name
        r = ProfileResult(parts=(part,))
        assert ProfileResult.from_dict(json.loads(r.to_json())) == r

    def test_times_are_integer_ns_within_session(self, tmp_path: Path) -> None:
        part = self._session(tmp_path)
        for s in part.spans:
            assert isinstance(s.start_ns, int) and isinstance(s.dur_ns, int) and s.dur_ns >= 0
        for s in part.samples:
            assert 0 <= s.stack_id < len(part.stacks)
            assert all(0 <= f < len(part.frames) for f in part.stacks[s.stack_id])
        track_ids = {t.id for t in part.tracks}
        assert all(s.track in track_ids for s in part.spans)

    def test_close_without_start_is_safe(self) -> None:
        b = self._make()
        b.close()

    def test_probe_returns_none_or_says_why(self) -> None:
        """probe() is a classmethod that returns None or raises BackendUnavailableError with a reason."""
        try:
            assert self.backend_cls.probe() is None
        except BackendUnavailableError as e:
            assert e.reason.strip(), "BackendUnavailableError needs a reason"

    def test_options_reject_unknown_keys(self) -> None:
        """Unknown option keys are refused with the nearest valid key, as every omniprof option is."""
        import pytest

        with pytest.raises(InvalidArgumentError, match="no_such_option_xyz"):
            build_options(self.backend_cls.Options, {"no_such_option_xyz": 1}, owner=f"backend {self.backend_cls.name!r}")

    def test_leaves_no_threads_running(self, tmp_path: Path) -> None:
        """After stop() and close() every thread the backend started has ended."""
        before = {t.ident for t in threading.enumerate()}
        self._session(tmp_path)
        left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
        assert not left, f"threads still running after close(): {left}"

    def test_counters_and_spans_reference_declared_tracks(self, tmp_path: Path) -> None:
        """Every counter and instant names a track of the part; counter times and values pair up."""
        part = self._session(tmp_path)
        track_ids = {t.id for t in part.tracks}
        for c in part.counters:
            assert c.track in track_ids, f"counter {c.name!r} on undeclared track {c.track!r}"
            assert len(c.t_ns) == len(c.values)
            assert list(c.t_ns) == sorted(c.t_ns), f"counter {c.name!r} times are not sorted"
        for i in part.instants:
            assert i.track in track_ids

    def test_times_line_up_with_the_reference_clock(self, tmp_path: Path) -> None:
        """Shifted by ``clock.offset_ns``, the session bounds, spans, instants and counter samples fall between
        the reference-clock readings taken just before start() and just after stop() (5 ms slack)."""
        from omniprof.analysis.timeline import merge

        b = self._make(tmp_path)
        b.prepare()
        before = b.clock.now_ns()
        b.start()
        self.workload()
        part = b.stop()
        after = b.clock.now_ns()
        b.close()
        lo, hi = before - 5_000_000, after + 5_000_000
        tl = merge(ProfileResult(parts=(part,)))
        if part.start_ns or part.end_ns:
            start, end = tl.parts[part.backend]
            assert lo <= start <= end <= hi, (
                f"session [{start}, {end}] is outside [{lo}, {hi}] on the reference clock: is clock.offset_ns right?")
        for s in tl.spans:
            assert lo <= s.start_ns and s.start_ns + s.dur_ns <= hi, f"span {s.name!r} outside the session"
        for i in tl.instants:
            assert lo <= i.t_ns <= hi, f"instant {i.name!r} outside the session"
        for c in tl.counters:
            assert all(lo <= t <= hi for t in c.t_ns), f"counter {c.name!r} has samples outside the session"

    def test_annotation_hook_is_none_or_a_context_manager(self, tmp_path: Path) -> None:
        """annotation() returns None or a context manager that can be entered while recording."""
        b = self._make(tmp_path)
        b.prepare()
        b.start()
        try:
            cm = b.annotation("conformance", {"k": 1})
            if cm is not None:
                with cm:
                    self.workload()
        finally:
            b.stop()
            b.close()

    def test_runs_under_the_profiler_through_an_entry_point(self, tmp_path: Path) -> None:
        """Registered through an entry point, the backend runs under Profiler with a step() in the middle."""
        reg = _registry_for("backend", self.backend_cls, tmp_path)
        self._make()  # skips when unavailable
        opts = self.backend_options()
        prof = Profiler(backend=self.backend_cls.name, registry=reg, logdir=tmp_path / "logdir",
                        backend_options={self.backend_cls.name: opts} if opts is not None else None)
        with prof:
            self.workload()
            prof.step()
            self.workload()
        part = prof.result.part(self.backend_cls.name)
        assert not prof.result.errors, prof.result.errors
        assert part.backend == self.backend_cls.name
        assert (prof.session_dir / "omniprof.result.json").is_file()


def _registry_for(kind: str, cls: type, tmp_path: Path) -> Registry:
    """A registry holding omniprof's own plugins and ``cls`` under its name, as an installed plugin would be."""
    group = KINDS[kind]
    empty = tmp_path / "empty-plugins.toml"
    empty.write_text("", encoding="utf-8")
    builtin = [ep for g in KINDS.values() for ep in md.entry_points(group=g)
               if ep.dist is not None and ep.dist.metadata["Name"] == "omniprof" and ep.name != cls.name]
    own = md.EntryPoint(name=cls.name, value=f"{cls.__module__}:{cls.__qualname__}", group=group)
    return Registry(entry_points=[*builtin, own], plugins_file=empty)


class ReporterConformance:
    """Checks every reporter must pass, over an empty result and a one-of-each result."""

    reporter_cls: ClassVar[type[Reporter]]

    def reporter_options(self) -> Any:
        return None

    def _write(self, result: ProfileResult, tmp_path: Path) -> Any:
        rep = self.reporter_cls(self.reporter_options())
        if rep.output == "stream":
            buf = io.StringIO()
            rep.report(result, buf)
            return buf.getvalue()
        if rep.output == "file":
            buf2 = io.BytesIO()
            rep.report(result, buf2)
            return buf2.getvalue()
        out = tmp_path / "out"
        out.mkdir()
        rep.report(result, out)
        return out

    def test_declares_plugin_api(self) -> None:
        cls = self.reporter_cls
        assert isinstance(cls.name, str) and cls.name
        assert cls.api_version in SUPPORTED_API_VERSIONS
        assert cls.output in ("stream", "file", "dir")
        assert attrs.has(cls.Options)

    def test_empty_result(self, tmp_path: Path) -> None:
        out = self._write(make_result(empty=True), tmp_path)
        assert out is not None

    def test_full_result_produces_output(self, tmp_path: Path) -> None:
        out = self._write(make_result(), tmp_path)
        if isinstance(out, (str, bytes)):
            assert len(out) > 0
        else:
            assert any(p.is_file() and p.stat().st_size > 0 for p in out.rglob("*"))

    def test_output_is_deterministic(self, tmp_path: Path) -> None:
        """The same result gives the same output twice (stream and file reporters)."""
        if self.reporter_cls.output == "dir":
            return
        first = self._write(make_result(), tmp_path)
        assert self._write(make_result(), tmp_path) == first

    def test_options_reject_unknown_keys(self) -> None:
        """Unknown option keys are refused, naming the key."""
        import pytest

        with pytest.raises(InvalidArgumentError, match="no_such_option_xyz"):
            build_options(self.reporter_cls.Options, {"no_such_option_xyz": 1},
                          owner=f"reporter {self.reporter_cls.name!r}")

    def test_runs_through_report_by_name(self, tmp_path: Path) -> None:
        """Registered through an entry point, omniprof.report(result, name, path) writes a non-empty output."""
        from omniprof.core.reporting import report

        reg = _registry_for("reporter", self.reporter_cls, tmp_path)
        dest = tmp_path / "report-out"
        written = report(make_result(), self.reporter_cls.name, dest, options=self.reporter_options(), registry=reg)
        assert written is not None and written.exists()
        files = [written] if written.is_file() else [p for p in written.rglob("*") if p.is_file()]
        assert files and any(p.stat().st_size > 0 for p in files)
