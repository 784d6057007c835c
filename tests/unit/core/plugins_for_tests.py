"""Plugins used by the tests through fake entry points (never imported directly by tests)."""

from __future__ import annotations

from typing import ClassVar

import attrs

from omniprof.plugin import Backend
from omniprof.core.results import BackendResult
from omniprof.plugin import Reporter
from omniprof.core import validators as v
from omniprof.errors import InvalidArgumentError
from omniprof.testing.fakes import FakeBackend


class FailingStartBackend(FakeBackend):
    name: ClassVar[str] = "fake2"

    def start(self) -> None:
        raise RuntimeError("device busy")


class FailingStopBackend(FakeBackend):
    name: ClassVar[str] = "fake2"

    def stop(self) -> BackendResult:
        raise RuntimeError("lost connection")


class WrongApiBackend(FakeBackend):
    name: ClassVar[str] = "wrongapi"
    api_version: ClassVar[int] = 99


class MissingStopBackend(Backend):
    name: ClassVar[str] = "nostop"

    def start(self) -> None:
        pass


class MisnamedBackend(FakeBackend):
    name: ClassVar[str] = "othername"


class NotABackend:
    name = "notabackend"


class BadOutputReporter(Reporter):
    name: ClassVar[str] = "badoutput"
    output = "printer"  # type: ignore[assignment]

    @attrs.frozen
    class Options:
        pass

    def report(self, result, dest):
        pass


class ProbeCrashBackend(FakeBackend):
    name: ClassVar[str] = "probecrash"

    @classmethod
    def probe(cls) -> None:
        raise KeyError("oops")


class UnavailableBackend(FakeBackend):
    name: ClassVar[str] = "unavail"

    @classmethod
    def probe(cls) -> None:
        from omniprof.errors import BackendUnavailableError

        raise BackendUnavailableError("no widget attached", "plug in a widget")


raise_on_import = None


class WindowBackend(FakeBackend):
    """Options whose two keys are checked together (lo < hi), as well as each on its own."""

    name = "window"

    @attrs.frozen(kw_only=True)
    class Options:
        lo: int = attrs.field(default=0, validator=v.int_in_range(0))
        hi: int = attrs.field(default=10, validator=v.int_in_range(1))

        def __attrs_post_init__(self) -> None:
            if self.lo >= self.hi:
                raise InvalidArgumentError(f"'lo' must be below 'hi' (got lo={self.lo}, hi={self.hi})")
