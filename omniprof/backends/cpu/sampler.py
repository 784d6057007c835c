"""The sampling engine: ``(stack_source, clock) -> bounded sample buffer``.

Pure logic, no timers: a trigger (signal timer or thread, see :mod:`.backend`) calls
:meth:`Sampler.sample`. Tests drive it with synthetic stacks and a FakeClock for exact counts.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from omniprof.backends.cpu.stacks import RawStack, StackSource, resolve_frame
from omniprof.core.clock import Clock
from omniprof.core.results import Frame, Loss, StackSample
from omniprof.errors import DataLossWarning

__all__ = ["Sampler"]

OVERFLOW_ENV_HINT = "Raise 'max_samples' (backend option) or lower the sampling rate ('interval_s')."


class Sampler:
    """Records stacks into a bounded buffer.

    Each sample is weighted by the time since that thread's previous sample (or since
    :meth:`begin` for its first), so a sample that stands for several coalesced timer ticks, as in
    a long C call, counts for its full time.

    Args:
        source: the stack source.
        clock: ``now_ns()`` provider.
        max_samples: buffer capacity; when full, recording stops, every sample not taken is
            counted in :attr:`dropped` and one :class:`DataLossWarning` is issued.
    """

    def __init__(self, source: StackSource, clock: Clock, max_samples: int,
                 on_full: Callable[[], None] | None = None,
                 on_new_thread: Callable[[int], None] | None = None) -> None:
        self.source = source
        self.clock = clock
        self.max_samples = max_samples
        self.on_full = on_full
        self.on_new_thread = on_new_thread
        self.t_ns: list[int] = []
        self.thread_ids: list[int] = []
        self.stack_ids: list[int] = []
        self.weights_ns: list[int] = []
        self.stack_index: dict[RawStack, int] = {}
        self.dropped = 0
        self.ticks = 0
        self.warned = False
        self.self_time_ns = 0
        self._last: dict[int, int] = {}
        self._t_begin = 0

    def begin(self) -> None:
        self._t_begin = self.clock.now_ns()
        self._last = {}

    def __len__(self) -> int:
        return len(self.t_ns)

    def sample(self) -> None:
        """Take one sample of every thread the source returns."""
        t0 = self.clock.now_ns()
        self.ticks += 1
        stacks = self.source()
        last = self._last
        for tid, raw in stacks:
            if len(self.t_ns) >= self.max_samples:
                self.dropped += 1
                last[tid] = t0
                if not self.warned:
                    self._warn_full()
                continue
            sid = self.stack_index.get(raw)
            if sid is None:
                sid = self.stack_index[raw] = len(self.stack_index)
            self.t_ns.append(t0)
            self.thread_ids.append(tid)
            self.stack_ids.append(sid)
            prev = last.get(tid)
            if prev is None:
                prev = self._t_begin
                if self.on_new_thread is not None:
                    self.on_new_thread(tid)
            self.weights_ns.append(t0 - prev)
            last[tid] = t0
        self.self_time_ns += self.clock.now_ns() - t0

    def _warn_full(self) -> None:
        self.warned = True
        warnings.warn(
            f"omniprof cpu sampler: the sample buffer is full ({self.max_samples} samples); recording has "
            f"stopped and the samples not taken are counted in the result. {OVERFLOW_ENV_HINT}",
            DataLossWarning, stacklevel=2)
        if self.on_full is not None:
            self.on_full()

    def clear(self) -> None:
        """Forget every sample (the buffer keeps its capacity)."""
        self.t_ns.clear()
        self.thread_ids.clear()
        self.stack_ids.clear()
        self.weights_ns.clear()
        self.stack_index.clear()
        self.dropped = 0
        self.ticks = 0
        self.warned = False
        self.self_time_ns = 0
        self._last = {}

    def export(self) -> tuple[tuple[Frame, ...], tuple[tuple[int, ...], ...], tuple[StackSample, ...], tuple[Loss, ...]]:
        """Resolve raw frames and return ``(frames, stacks, samples, losses)`` for a BackendResult."""
        frame_ids: dict[Any, int] = {}
        frames: list[Frame] = []
        resolved: dict[Frame, int] = {}
        stacks: list[tuple[int, ...]] = [()] * len(self.stack_index)
        for raw_stack, sid in self.stack_index.items():
            ids = []
            for raw in raw_stack:
                fid = frame_ids.get(raw)
                if fid is None:
                    fr = resolve_frame(raw)
                    fid = resolved.get(fr)
                    if fid is None:
                        fid = resolved[fr] = len(frames)
                        frames.append(fr)
                    frame_ids[raw] = fid
                ids.append(fid)
            stacks[sid] = tuple(ids)
        samples = tuple(StackSample(t, tid, sid, w) for t, tid, sid, w in
                        zip(self.t_ns, self.thread_ids, self.stack_ids, self.weights_ns))
        losses: tuple[Loss, ...] = ()
        if self.dropped:
            losses = (Loss(source="cpu", kind="samples_dropped", count=self.dropped, unit="samples",
                           detail=f"sample buffer full at {self.max_samples} samples; {OVERFLOW_ENV_HINT}"),)
        return tuple(frames), tuple(stacks), samples, losses
