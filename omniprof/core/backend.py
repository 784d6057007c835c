"""The backend plugin API.

A backend is a source of profile data with the lifecycle ``probe -> prepare -> start -> stop ->
close``. It returns plain data (:class:`~omniprof.core.results.BackendResult`) and never writes
report files; native artifacts (xplane.pb, Kineto JSON) go in ``context.session_dir``.

Third parties subclass :class:`Backend` and register it under the ``omniprof.backends`` entry-point
group; the entry-point name must equal ``Backend.name``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from types import CodeType
from typing import Any, ClassVar

import attrs

from omniprof.core.clock import DEFAULT_CLOCK, Clock
from omniprof.core.collectives import Collectives
from omniprof.core.options import ProfileOptions
from omniprof.core.results import BackendResult

__all__ = ["Backend", "BackendContext", "Capability", "SUPPORTED_API_VERSIONS"]

#: Backend/Reporter ``api_version`` values this omniprof can load.
SUPPORTED_API_VERSIONS = frozenset({1})


def _code_tuple(value: Any) -> tuple[CodeType, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class BackendContext:
    """What the Profiler hands every backend.

    Attributes:
        profile_options: the validated :class:`ProfileOptions` (levels, advanced_configuration).
        clock: the reference clock (``now_ns()``); report times on it, or say your own clock's
            offset in ``BackendResult.clock``.
        session_dir: where native artifacts of this session go (the XProf layout
            ``<logdir>/plugins/profile/<run>/``), or None when the user gave no logdir.
        run_name: this session's unique run name.
        verbose: let native libraries log to the terminal.
        step_num: returns the Profiler's current step number (None when no Profiler drives the
            backend), so a backend started mid-schedule can label the step that is beginning.
        scheduled: the Profiler runs a schedule (so step() calls are expected from the start).
        launcher_codes: code objects of the launcher's frames that hand over to the profiled
            program (``omniprof run``: ``runpy``'s ``_run_code``, the runner's ``call_function``).
            A backend that records stacks leaves these frames and their callers out, so stacks
            start at the program. Empty (cut nothing) for a Profiler made in the user's own code.
    """

    profile_options: ProfileOptions = attrs.field(factory=ProfileOptions)
    clock: Clock = DEFAULT_CLOCK
    session_dir: Path | None = None
    run_name: str = ""
    verbose: bool = False
    step_num: Callable[[], int] | None = None
    scheduled: bool = False
    launcher_codes: tuple[CodeType, ...] = attrs.field(default=(), converter=_code_tuple)


@attrs.frozen
class Capability:
    """One thing a backend can or cannot do on this machine, as ``omniprof doctor`` lists it.

    Attributes:
        feature: what it is ("CUDA kernels", "native frames (py-spy)").
        available: whether it works here.
        detail: what was found, or why not and how to get it.
    """

    feature: str
    available: bool
    detail: str = ""


class Backend(abc.ABC):
    """A source of profile data. Lifecycle: probe -> prepare -> start -> stop -> close.

    Class attributes:
        name: entry-point name == CLI value == config key.
        api_version: the plugin API version this backend implements (checked at load).
        summary: one line for ``omniprof plugins``.
        single_session: True when only one session of this backend may run per process.
        stop_any_thread: False when only the thread that started the session may stop it.
        Options: an attrs class of backend-specific options (validated, settable from config).

    .. versionadded:: 0.1
    """

    name: ClassVar[str]
    api_version: ClassVar[int] = 1
    summary: ClassVar[str] = ""
    single_session: ClassVar[bool] = True
    #: False when the framework must be stopped from the thread that started it (torch's profiler
    #: crashes the process otherwise): the Profiler refuses such a stop() with a clear error.
    stop_any_thread: ClassVar[bool] = True

    @attrs.frozen(kw_only=True)
    class Options:
        """No backend-specific options."""

    @classmethod
    def probe(cls) -> None:
        """Raise :class:`~omniprof.errors.BackendUnavailableError` (reason, hint) if this machine can't
        run the backend. Must be cheap and import heavy libraries only inside."""

    @classmethod
    def capabilities(cls) -> list[Capability]:
        """What this backend can do on this machine, feature by feature, for ``omniprof doctor``.

        May import the backend's libraries (``omniprof plugins`` never calls it); should not raise
        for a machine that lacks something -- report the feature as unavailable, with the fix.
        """
        return []

    @classmethod
    def environment(cls, *, frameworks: bool = True) -> list[tuple[str, str]]:
        """``(key, value)`` facts about what this backend uses here (its library's version, the devices
        it sees), for ``omniprof doctor``'s environment section. ``frameworks=False``: without importing
        heavy libraries (their installed versions only). Should not raise for a broken install: report
        it as a fact."""
        return []

    @classmethod
    def checks(cls) -> list[Any]:
        """Checks of this machine for ``omniprof doctor``, in order, each with ``name``, ``ok``,
        ``detail`` and ``hint`` (the fix) attributes (cupti: driver, GPUs, CUPTI). Like
        :meth:`capabilities`, should not raise for a machine that lacks something."""
        return []

    @classmethod
    def job_collectives(cls) -> Collectives | None:
        """The communication layer of a multi-process job this backend's framework runs in this
        process, for ``Profiler(distributed=True)`` (torch: the process group; xla: jax's
        distributed runtime); None (the default) when it runs none. Must not import the
        framework when the program has not."""
        return None

    def __init__(self, options: Any = None, *, context: BackendContext | None = None) -> None:
        self.options = options if options is not None else self.Options()
        self.context = context if context is not None else BackendContext()

    @property
    def clock(self) -> Clock:
        return self.context.clock

    def prepare(self) -> None:
        """Costly setup (imports, warm-up); runs during a schedule's WARMUP. Optional."""

    @abc.abstractmethod
    def start(self) -> None:
        """Begin recording."""

    @abc.abstractmethod
    def stop(self) -> BackendResult:
        """End recording and return what was recorded. Must not write report files."""

    def stop_deferred(self) -> Callable[[], BackendResult] | None:
        """End recording now, and return a function that builds the result later; or None (the default),
        and the Profiler calls :meth:`stop` instead.

        Used when a schedule's recording window ends inside ``Profiler.step()``: the training loop
        then pays only for stopping, and the Profiler calls the function at ``stop()`` or when its
        result is asked for. The function may run after :meth:`close`. Optional.
        """
        return None

    def close(self) -> None:
        """Release resources. Called after stop(), and on failure paths; must be idempotent."""

    def snapshot(self) -> BackendResult | None:
        """What was recorded so far, without stopping; None when the backend cannot tell.

        Called from the Profiler's checkpoint thread while recording, so a run killed before
        ``stop()`` still leaves a readable partial result. Must not disturb the recording.
        """
        return None

    # -- hooks -----------------------------------------------------------------------------------
    def annotation(self, name: str, args: dict[str, Any] | None = None) -> AbstractContextManager[Any] | None:
        """Return a context manager that marks ``name`` in this backend's native trace, or None.

        Called by :func:`omniprof.annotate` only while this backend is recording.
        """
        return None

    def step(self, step_num: int) -> None:
        """A training step boundary: ``Profiler.step()`` was called and step ``step_num`` begins."""
