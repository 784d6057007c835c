"""Checkpoints: while a session records with a ``logdir``, what the backends hold so far is written to
``<session>/omniprof.partial.json`` every few seconds, so a run killed without warning (SIGKILL,
the OOM killer, a power cut) leaves a readable partial result.

:class:`Checkpointer` is the thread that asks for them; what a checkpoint holds, and the lock it
takes, stay with ``Profiler.checkpoint()``: the thread knows the profiler only through
:class:`Checkpointable`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Protocol

from omniprof.core.clock import perf_counter_ns
from omniprof.errors import InvalidArgumentError

__all__ = ["CHECKPOINT_INTERVAL_S", "CHECKPOINT_ENV", "Checkpointable", "Checkpointer", "checkpoint_interval_s"]

#: Seconds between checkpoints; ``OMNIPROF_CHECKPOINT_S=0`` switches them off.
CHECKPOINT_INTERVAL_S = 5.0
CHECKPOINT_ENV = "OMNIPROF_CHECKPOINT_S"
# A checkpoint may cost at most this share of the run: the next one waits 1/share times as long as
# the last one took (a 1 s checkpoint of a huge profile is followed by >= 20 s of recording).
_CHECKPOINT_MAX_SHARE = 0.05
_FIRST_CHECKPOINT_TRIES = 400  # 5 ms apart: the first checkpoint waits up to 2 s for a busy profiler


def checkpoint_interval_s() -> float:
    """Seconds between checkpoints: :data:`CHECKPOINT_ENV` if set, else :data:`CHECKPOINT_INTERVAL_S`
    (0: none)."""
    raw = os.environ.get(CHECKPOINT_ENV)
    if raw is None or not raw.strip():
        return CHECKPOINT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgumentError(f"{CHECKPOINT_ENV} must be a number of seconds, 0 to switch checkpoints off "
                                   f"(got {raw!r})") from None
    return value if value == value and value > 0 else 0.0


class Checkpointable(Protocol):
    """What the checkpoint thread needs of the profiler."""

    #: checkpoints written in this session so far.
    checkpoints: int

    def checkpoint(self, *, blocking: bool = True) -> Path | None: ...


class Checkpointer:
    """A daemon thread calling ``profiler.checkpoint()`` every ``interval_s`` (longer after a slow one)."""

    def __init__(self, profiler: Checkpointable, interval_s: float) -> None:
        self.profiler = profiler
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._go = threading.Event()
        self._thread = threading.Thread(target=self._run, name="omniprof-checkpoint", daemon=True)

    def _run(self) -> None:
        self._go.wait()  # recording has started (or stop() came first)
        wait = 0.0  # the first at once
        first_tries = _FIRST_CHECKPOINT_TRIES
        while not self._stop.wait(wait):
            t0 = perf_counter_ns()
            written = self.profiler.checkpoint(blocking=False)
            if written is None and self.profiler.checkpoints == 0 and first_tries > 0:
                # Busy (the step() that started recording still holds the profiler): the first
                # checkpoint is retried soon rather than a whole interval later.
                first_tries -= 1
                wait = 0.005
                continue
            cost_s = (perf_counter_ns() - t0) / 1e9
            # The first one, of an almost empty recording, pays one-time costs (a first fsync, a
            # sampler's first drain): it does not stretch the interval.
            wait = self.interval_s if first_tries else max(self.interval_s, cost_s / _CHECKPOINT_MAX_SHARE)
            first_tries = 0

    def start(self) -> None:
        self._thread.start()

    def go(self) -> None:
        """Recording has started: write the first checkpoint now."""
        self._go.set()

    def stop(self) -> None:
        self._stop.set()
        self._go.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
