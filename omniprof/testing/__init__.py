"""Test helpers for omniprof and its third-party plugins: fakes and conformance suites."""

from omniprof.testing.fakes import FakeBackend, FakeClock, make_result

__all__ = ["FakeClock", "FakeBackend", "make_result"]
