"""Step schedules (wait / warmup / active / repeat), as torch.profiler has, for every backend.

A schedule is a pure function ``step -> Action``; the Profiler applies :data:`TRANSITIONS` between
the previous and the current action.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs

from omniprof.core import validators as v

__all__ = ["Action", "Schedule", "schedule", "TRANSITIONS"]


class Action(enum.Enum):
    """What the profiler does during a step."""

    NONE = "none"            #: not profiling
    WARMUP = "warmup"        #: backend prepared (costly setup done), nothing recorded
    RECORD = "record"        #: recording
    RECORD_AND_SAVE = "record_and_save"  #: recording; the cycle's result is produced after this step


@attrs.frozen(kw_only=True)
class Schedule:
    """``skip_first`` steps idle, then cycles of ``wait`` idle, ``warmup``, ``active`` recorded steps.

    ``repeat`` cycles (0: forever). Callable as ``schedule(step) -> Action``.

    >>> s = Schedule(wait=1, warmup=1, active=2)
    >>> [s(i).name for i in range(5)]
    ['NONE', 'WARMUP', 'RECORD', 'RECORD_AND_SAVE', 'NONE']

    .. versionadded:: 0.1
    """

    wait: int = attrs.field(default=0, validator=v.int_in_range(0))
    warmup: int = attrs.field(default=0, validator=v.int_in_range(0))
    active: int = attrs.field(default=1, validator=v.int_in_range(1))
    repeat: int = attrs.field(default=0, validator=v.int_in_range(0))
    skip_first: int = attrs.field(default=0, validator=v.int_in_range(0))

    def __call__(self, step: int) -> Action:
        if step < self.skip_first:
            return Action.NONE
        step -= self.skip_first
        cycle = self.wait + self.warmup + self.active
        if self.repeat and step // cycle >= self.repeat:
            return Action.NONE
        pos = step % cycle
        if pos < self.wait:
            return Action.NONE
        if pos < self.wait + self.warmup:
            return Action.WARMUP
        return Action.RECORD if pos < cycle - 1 else Action.RECORD_AND_SAVE

    def to_dict(self) -> dict[str, int]:
        return attrs.asdict(self)


def schedule(*, wait: int = 0, warmup: int = 0, active: int = 1, repeat: int = 0, skip_first: int = 0) -> Schedule:
    """Build a :class:`Schedule` (same arguments as ``torch.profiler.schedule``)."""
    return Schedule(wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first)


# (previous, current) -> what to do, in order. "save" stops the backends and emits a result.
TRANSITIONS: dict[tuple[Action, Action], tuple[str, ...]] = {
    (Action.NONE, Action.NONE): (),
    (Action.NONE, Action.WARMUP): ("prepare",),
    (Action.NONE, Action.RECORD): ("prepare", "start"),
    (Action.NONE, Action.RECORD_AND_SAVE): ("prepare", "start"),
    (Action.WARMUP, Action.NONE): ("close",),
    (Action.WARMUP, Action.WARMUP): (),
    (Action.WARMUP, Action.RECORD): ("start",),
    (Action.WARMUP, Action.RECORD_AND_SAVE): ("start",),
    (Action.RECORD, Action.NONE): ("save",),
    (Action.RECORD, Action.WARMUP): ("save", "prepare"),
    (Action.RECORD, Action.RECORD): (),
    (Action.RECORD, Action.RECORD_AND_SAVE): (),
    (Action.RECORD_AND_SAVE, Action.NONE): ("save",),
    (Action.RECORD_AND_SAVE, Action.WARMUP): ("save", "prepare"),
    (Action.RECORD_AND_SAVE, Action.RECORD): ("save", "prepare", "start"),
    (Action.RECORD_AND_SAVE, Action.RECORD_AND_SAVE): ("save", "prepare", "start"),
}

ScheduleFn = Callable[[int], Action]
