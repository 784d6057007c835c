"""Plugins that fail on purpose, loaded by the fault tests through a plugins.toml."""

from __future__ import annotations

import threading
from typing import ClassVar

from omniprof.core.results import BackendResult
from omniprof.plugin import Reporter
from omniprof.testing.fakes import FakeBackend


class FailingReporter(Reporter):
    """A stream reporter that fails while writing."""

    name: ClassVar[str] = "boom"

    def report(self, result, dest):
        dest.write("partial output before the failure\n")
        raise RuntimeError("reporter exploded")


class FailingStartBackend(FakeBackend):
    name: ClassVar[str] = "failstart"

    def start(self) -> None:
        raise RuntimeError("device busy")


class FailingStopBackend(FakeBackend):
    name: ClassVar[str] = "failstop"

    def stop(self) -> BackendResult:
        raise RuntimeError("lost connection")


class SigintAtStopBackend(FakeBackend):
    """Sends this process a SIGINT while it stops (a second Ctrl-C landing during Profiler.stop())."""

    name: ClassVar[str] = "sigint"

    def stop(self) -> BackendResult:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # bytecodes: the moment Python runs the SIGINT handler
            pass
        return super().stop()


class SlowFileReporter(Reporter):
    """A file reporter that writes half its output, says so on stderr, then takes its time."""

    name: ClassVar[str] = "slow"
    output = "file"
    default_filename = "slow.txt"

    def report(self, result, dest):
        import sys
        import time

        dest.write(b"half of the report\n")
        dest.flush()
        print("slow reporter writing", file=sys.stderr, flush=True)
        time.sleep(30)
        dest.write(b"the other half\n")


class GatedSnapshotBackend(FakeBackend):
    """Its checkpoint snapshot waits until the test opens ``gate`` and notes the thread it ran on."""

    name: ClassVar[str] = "gated"
    gate: ClassVar[threading.Event] = threading.Event()
    snapshot_threads: ClassVar[list[str]] = []

    def snapshot(self) -> BackendResult:
        type(self).snapshot_threads.append(threading.current_thread().name)
        type(self).gate.wait(5)
        return super().snapshot()
