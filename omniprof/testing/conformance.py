"""Conformance suites a plugin's own tests reuse (as keyring's backend tests are reused).

::

    from omniprof.testing.conformance import BackendConformance

    class TestMyBackend(BackendConformance):
        backend_cls = MyBackend

The suites are pytest classes: every ``test_*`` method runs against your class. Override
``backend_options()`` / ``reporter_options()`` to pass options; ``workload()`` to change what runs.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, ClassVar

import attrs

from omniprof.backends.base import SUPPORTED_API_VERSIONS, Backend, BackendContext
from omniprof.core.results import BackendResult, ProfileResult
from omniprof.errors import BackendUnavailableError
from omniprof.reporters.base import Reporter
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
        b = self._make(tmp_path)
        b.prepare()
        b.start()
        self.workload()
        part = b.stop()
        b.close()
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
