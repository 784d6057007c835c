"""The :class:`Profiler`: one API over every backend.

Options -> Profiler -> backends -> ProfileResult. The profiler never hands itself to reporters
or callbacks; they get the plain result.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import CodeType
from typing import Any

import attrs

from omniprof._version import __version__
from omniprof.core import annotations
from omniprof.core.backend import Backend, BackendContext
from omniprof.core.checkpoints import Checkpointer, checkpoint_interval_s
from omniprof.core.clock import DEFAULT_CLOCK, Clock, perf_counter_ns, time_ns
from omniprof.core.collectives import Collectives
from omniprof.core.fileio import atomic_write_bytes
from omniprof.core.forks import deferred_signals, on_fork_child
from omniprof.core.options import ProfileOptions
from omniprof.core.registry import Registry, get_registry, options_for
from omniprof.core.results import BackendResult, ErrorRecord, ProfileResult, RunMetadata
from omniprof.core.rundir import PARTIAL_FILENAME, RESULT_FILENAME, name_job_run, new_session_dir
from omniprof.core.schedule import TRANSITIONS, Action, Schedule
from omniprof.core.stopping import check_stop_thread, workload_failed
from omniprof.core.views import Viewer, default_viewer, set_default_viewer
from omniprof.errors import (
    BackendError,
    BackendOptionError,
    InvalidArgumentError,
    OmniprofError,
    OmniprofWarning,
    PluginError,
    ProfilerStateError,
)

__all__ = ["Profiler", "RESULT_FILENAME", "PARTIAL_FILENAME", "Viewer", "set_default_viewer"]

#: The Profiler's start, stop and step paths: whatever runs under them (the standard library's
#: signal, threading, json) is omniprof's time, and the cpu engines leave it out of the profile.
LIFECYCLE_METHODS = ("start", "stop", "step", "__enter__", "__exit__")

# Backends (by name) with a session running in this process, for single-session backends.
_active: dict[str, Profiler] = {}
_active_lock = threading.Lock()


def _reset_after_fork() -> None:
    # A forked child runs none of the parent's sessions (their lock may have been held by a
    # thread that did not survive the fork).
    global _active_lock
    _active_lock = threading.Lock()
    _active.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


@attrs.define
class _Window:
    """A recording window that stopped: what :meth:`Profiler._publish` makes its result from.

    A window that ended inside ``step()`` waits in ``Profiler._pending`` with ``builders`` (the
    backends that stopped and build their part later, by name); the others' parts are in ``parts``.
    ``failures`` are the backends that failed to stop, ``views`` what backends asked to show.
    """

    metadata: RunMetadata
    parts: list[BackendResult]
    errors: list[ErrorRecord]
    session_dir: Path | None
    failures: list[tuple[str, BaseException]]
    views: list[dict[str, Any]]
    builders: list[tuple[str, Callable[[], BackendResult]]] = attrs.field(factory=list)


class Profiler:
    """Profile code with one or several backends.

    Args:
        backend: a backend name (``"cpu"``, ``"xla"``, ``"torch"``, ``"cupti"``) or a list of names
            run together on one timeline.
        options: :class:`ProfileOptions` (or a mapping of its fields).
        backend_options: ``{backend_name: Options instance or mapping}``.
        logdir: where sessions are saved, in the XProf layout
            ``<logdir>/plugins/profile/<run>/`` with ``omniprof.result.json`` and native artifacts.
        schedule: a :class:`~omniprof.core.schedule.Schedule` driven by :meth:`step`.
        on_result: called with each finished :class:`ProfileResult` (never with the profiler).
        clock: reference clock (tests pass a FakeClock).
        registry: plugin registry (default: the process-wide one).
        label: free text stored in the result's metadata.
        verbose: let native profiler libraries log to the terminal.
        distributed: every rank of a ``torch.distributed`` job (or of a JAX job after
            ``jax.distributed.initialize``) profiles the same steps into one run directory
            (``<logdir>/plugins/profile/<run>/rank<N>/``, each rank's xplane as
            ``<run>/<host>_rank<N>.xplane.pb``), with clock offsets to rank 0 measured over the
            job's own communication layer; rank 0 gathers the ranks' results and writes the merged
            one (:attr:`merged_result`). Every rank must construct, start, step and stop its
            Profiler alike. See docs/distributed.md.
        launcher_codes: code objects of a launcher's frames that hand over to the profiled code
            (``omniprof.runner`` passes ``runpy``'s ``_run_code`` and its ``call_function``):
            backends that record stacks (cpu, memory) leave these frames and their callers out,
            so stacks start at the target. Given to every backend as
            ``BackendContext.launcher_codes``; this Profiler's alone (default: cut nothing).
        viewer: opens what a backend asks to show once the result is saved (the xla backend's
            ``create_perfetto_link``), such as ``omniprof.viewers.open_views``: the front end
            passes it (default: the one ``core.views.set_default_viewer`` installed; with none, a
            warning names the saved trace).

    Use as a context manager, a decorator, or with start()/stop():

    >>> import omniprof
    >>> with omniprof.Profiler(backend="cpu") as prof:
    ...     _ = sum(range(1000))
    >>> prof.result.parts[0].backend
    'cpu'

    .. versionadded:: 0.1
    """

    def __init__(self, backend: str | Sequence[str] = "cpu", options: ProfileOptions | Mapping[str, Any] | None = None,
                 *, backend_options: Mapping[str, Any] | None = None, logdir: str | os.PathLike[str] | None = None,
                 schedule: Schedule | Callable[[int], Action] | None = None,
                 on_result: Callable[[ProfileResult], None] | None = None, clock: Clock | None = None,
                 registry: Registry | None = None, label: str = "", verbose: bool = False,
                 distributed: bool = False, launcher_codes: Sequence[CodeType] = (),
                 viewer: Viewer | None = None) -> None:
        names = [backend] if isinstance(backend, str) else list(backend)
        if not names:
            raise InvalidArgumentError("'backend' must name at least one backend")
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"'backend' lists a backend twice: {names}")
        if options is None:
            options = ProfileOptions()
        elif isinstance(options, Mapping):
            options = ProfileOptions.from_dict(options)
        elif not isinstance(options, ProfileOptions):
            raise InvalidArgumentError(
                f"'options' must be omniprof.ProfileOptions or a mapping (got {type(options).__name__})")
        backend_options = dict(backend_options or {})
        unknown = set(backend_options) - set(names)
        if unknown:
            raise InvalidArgumentError(
                f"backend_options given for {sorted(unknown)}, which are not among the selected backends {names}")
        self._registry = registry or get_registry()
        self._classes: dict[str, type[Backend]] = {}
        self._backend_opts: dict[str, Any] = {}
        for name in names:
            cls = self._registry.backend(name)
            self._classes[name] = cls
            self._backend_opts[name] = options_for("backend", name, cls, backend_options.get(name), self._registry)
        self.backend_names = tuple(names)
        self.options = options
        self.logdir = Path(logdir) if logdir is not None else None
        self.schedule = schedule
        self.on_result = on_result
        self.clock = clock or DEFAULT_CLOCK
        self.label = label
        self.verbose = verbose
        if not isinstance(distributed, bool):
            raise InvalidArgumentError(f"'distributed' must be True or False (got {distributed!r})")
        self.distributed = distributed
        codes = tuple(launcher_codes)
        if any(not isinstance(c, CodeType) for c in codes):
            raise InvalidArgumentError(f"'launcher_codes' must be code objects (a function's __code__; got "
                                       f"{[type(c).__name__ for c in codes if not isinstance(c, CodeType)]})")
        self.launcher_codes = codes
        if viewer is not None and not callable(viewer):
            raise InvalidArgumentError(f"'viewer' must be callable, such as omniprof.viewers.open_views "
                                       f"(got {type(viewer).__name__})")
        self.viewer = viewer
        #: the job's communication layer (set at the first start() of a distributed profiler).
        self._coll: Collectives | None = None
        self._rank: dict[str, Any] = {}
        #: ``<logdir>/plugins/profile/<run>`` of the latest distributed session (rank dirs inside).
        self.run_dir: Path | None = None
        #: rank 0 of a distributed run: every rank's parts on rank 0's clock (None elsewhere).
        self.merged_result: ProfileResult | None = None
        self._results: list[ProfileResult] = []
        # Windows that ended inside step(), their results built when first asked for.
        self._pending: list[_Window] = []
        self.session_dir: Path | None = None
        #: inside stop(): viewer requests and saved files, opened once stop() lets signals through.
        self._views_after_stop: tuple[list[dict[str, Any]], list[str]] | None = None
        self._backends: dict[str, Backend] = {}
        self._recording: list[str] = []
        self._errors: list[ErrorRecord] = []
        self._failed_parts: list[BackendResult] = []
        self._started = False
        self._step_num = 0
        self._action = Action.NONE
        self._t0_ns = 0
        self._t0_unix_ns = 0
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._start_thread = threading.current_thread()
        self._checkpointer: Checkpointer | None = None
        #: checkpoints written in this session, and the longest one's cost in ns.
        self.checkpoints = 0
        self.checkpoint_max_ns = 0

    # -- public API ----------------------------------------------------------------------------
    @property
    def results(self) -> list[ProfileResult]:
        """Every finished result, oldest first. A window that ended inside :meth:`step` is built here,
        when first asked for (or at :meth:`stop`), not on the training loop's critical path."""
        self._finish_pending()
        return self._results

    @property
    def result(self) -> ProfileResult:
        """The most recent finished result."""
        if not self.results:
            raise ProfilerStateError("no result yet: the profiler has not been stopped after recording")
        return self.results[-1]

    @property
    def is_running(self) -> bool:
        return self._started

    @property
    def step_num(self) -> int:
        return self._step_num

    def start(self) -> Profiler:
        """Start profiling (with a schedule: enter step 0's action)."""
        with self._lock:
            if self._started:
                raise ProfilerStateError("Profiler is already running; call stop() before start()")
            if self.distributed:
                self._join_job()
            self._claim()
            self._started = True
            self._pid = os.getpid()
            self._start_thread = threading.current_thread()
            on_fork_child(self._forked)
            self._step_num = 0
            try:
                first = self._schedule_action(0)
                self._apply((Action.NONE, first))
                self._action = first
            except BaseException:
                self._abort()
                raise
        return self

    def stop(self) -> ProfileResult | None:
        """Stop profiling and return the last result (None if a schedule never recorded).

        In the main thread, SIGINT and SIGTERM arriving while the profiler stops are held back
        and delivered once the result is saved: a second Ctrl-C never loses the profile.

        In a process forked from the one that started the session, nothing is saved or returned:
        the session is the parent's (see :mod:`omniprof.core.forks`).
        """
        if self._pid != os.getpid():  # checked before the lock: another thread of the parent may have held it
            self._abandon()
            return None
        self._views_after_stop = ([], [])
        try:
            with self._lock, deferred_signals():
                if not self._started:
                    raise ProfilerStateError("Profiler is not running; call start() before stop()")
                check_stop_thread(self._classes, self._start_thread)
                try:
                    if self._recording:
                        self._save()
                    else:
                        self._close_all()
                finally:
                    self._started = False
                    self._action = Action.NONE
                    self._release()
                self._finish_pending()
        finally:
            # Viewers (xla's Perfetto link) wait for a person: opened only now, after the result is
            # saved and outside the block that holds Ctrl-C back, so Ctrl-C can end that wait.
            (views, saved), self._views_after_stop = self._views_after_stop, None
            if views:
                self._open_views(views, saved)
        return self._results[-1] if self._results else None

    def _forked(self) -> None:
        """In a forked child: the session is the parent's; leave it without a trace."""
        for name in self._recording:
            backend = self._backends.get(name)
            if backend is not None:
                annotations.remove_sink(backend)
        self._checkpointer = None  # its thread did not survive the fork
        self.session_dir = None  # the parent's directory: never written from here

    def _abandon(self) -> None:
        self._forked()
        self._recording = []
        self._backends = {}
        self._errors = []
        self.session_dir = None
        self._started = False
        self._action = Action.NONE
        self._lock = threading.RLock()  # the parent's may have been held by a thread that is not here

    def step(self) -> None:
        """Mark the end of a step: advances the schedule (start/stop backends as it says)."""
        if self._pid != os.getpid():
            return  # a forked child: the schedule is the parent's
        with self._lock:
            if not self._started:
                raise ProfilerStateError("Profiler.step() called while the profiler is not running")
            self._step_num += 1
            nxt = self._schedule_action(self._step_num)
            self._apply((self._action, nxt))
            self._action = nxt
            for name in self._recording:
                self._backends[name].step(self._step_num)

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            exc = None  # sys.exit(0) / sys.exit(): the workload succeeded, the profile is complete
        if exc is not None:
            self._errors.append(ErrorRecord(source="workload", phase="run", type=exc_type.__name__,
                                            message=_one_line(exc)))
        if self._started:
            if exc is None:
                self.stop()
            else:
                try:
                    self.stop()
                except OmniprofError as e:
                    # The workload's own exception wins; omniprof's failure is in the result and warned.
                    warnings.warn(f"{e} (while the profiled code raised {exc_type.__name__})", OmniprofWarning,
                                  stacklevel=2)
        # Returning None lets the workload's exception propagate unchanged.

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """Use as a decorator: each call of ``func`` is profiled; ``wrapper.profiler`` is this object."""

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        wrapper.profiler = self  # type: ignore[attr-defined]
        return wrapper

    # -- internals -----------------------------------------------------------------------------
    def _schedule_action(self, step: int) -> Action:
        if self.schedule is None:
            return Action.RECORD
        action = self.schedule(step)
        if not isinstance(action, Action):
            raise InvalidArgumentError(f"schedule({step}) returned {action!r}; it must return an omniprof Action")
        return action

    def _join_job(self) -> None:
        from omniprof.core import distributed as dist

        if self._coll is None:
            self._coll = dist.job_collectives(self._registry)
            env = dist.detect_environment()
            layer = self._coll.layer
            self._rank = {"rank": self._coll.rank, "world_size": self._coll.world_size,
                          "local_rank": env.local_rank if env is not None else None,
                          "launcher": env.launcher if env is not None else layer,
                          "process_group_backend": self._coll.backend}
        dist.check_agreement(self._coll, self.backend_names, self.schedule)

    def _claim(self) -> None:
        with _active_lock:
            for name, cls in self._classes.items():
                holder = _active.get(name)
                if cls.single_session and holder is not None and holder is not self:
                    raise ProfilerStateError(
                        f"backend {name!r} is already profiling in this process (another Profiler started it); "
                        f"stop that profiler first, or use one Profiler for both")
            for name in self._classes:
                _active[name] = self

    def _release(self) -> None:
        with _active_lock:
            for name in self._classes:
                if _active.get(name) is self:
                    del _active[name]

    def _apply(self, transition: tuple[Action, Action]) -> None:
        for verb in TRANSITIONS[transition]:
            if verb == "prepare":
                self._prepare_all()
            elif verb == "start":
                self._start_all()
            elif verb == "save":
                self._save(deferred=True)
            elif verb == "close":
                self._close_all()

    def _context(self) -> BackendContext:
        return BackendContext(profile_options=self.options, clock=self.clock, session_dir=self.session_dir,
                              run_name=self.session_dir.name if self.session_dir else "", verbose=self.verbose,
                              step_num=lambda: self._step_num, scheduled=self.schedule is not None,
                              launcher_codes=self.launcher_codes)

    def _prepare_all(self) -> None:
        self._errors = [e for e in self._errors if e.source == "workload"]
        self._failed_parts = []
        if self.distributed:
            self._name_run()
        elif self.logdir is not None:
            self.session_dir = new_session_dir(self.logdir)
        _pay_one_time_costs(with_files=self.session_dir is not None)
        ctx = self._context()
        failures: list[tuple[str, BaseException, str]] = []
        for name, cls in self._classes.items():
            backend = None
            try:
                cls.probe()
                backend = cls(self._backend_opts[name], context=ctx)
                backend.prepare()
            except Exception as e:
                # With several backends, one that cannot prepare is recorded and the others go on.
                phase = "probe" if backend is None and isinstance(e, PluginError) else "prepare"
                failures.append((name, e, phase))
                self._errors.append(ErrorRecord(source=name, phase=phase, type=type(e).__name__, message=_one_line(e)))
                if backend is not None:
                    try:
                        backend.close()
                    except Exception:
                        pass
                continue
            self._backends[name] = backend
        if failures and not self._backends:
            name, e, _ = failures[0]
            if isinstance(e, PluginError):
                raise e
            if isinstance(e, InvalidArgumentError):  # the user's input (CLI exit 2), still a BackendError
                raise BackendOptionError(f"backend {name!r} failed to prepare: {e}", plugin=name) from e
            raise BackendError(f"backend {name!r} failed to prepare: {type(e).__name__}: {e}", plugin=name) from e
        for name, e, phase in failures:
            what = "is unavailable" if phase == "probe" else "failed to prepare"
            warnings.warn(f"backend {name!r} {what} ({type(e).__name__}: {e}); the other backends go on "
                          f"and the failure is recorded in the result", OmniprofWarning, stacklevel=_user_stacklevel())

    def _name_run(self) -> None:
        """Rank 0 names the run directory once for the whole job; rank N works in ``<run>/rank<N>``."""
        from omniprof.core import distributed as dist

        coll = self._coll
        name, self.run_dir, self.session_dir = name_job_run(
            self.logdir, coll.rank, lambda mine: dist.agree_session(coll, self._step_num, mine))
        self._rank["run"] = name or ""

    def _start_all(self) -> None:
        if not self._backends:
            self._prepare_all()
        self._t0_unix_ns = time_ns()
        self._t0_ns = self.clock.now_ns()
        # The checkpoint thread is started first and waits: a sampler started below finds it
        # among omniprof's own threads (``omniprof-*``) and never samples it. Started after the
        # backends, the native engine sampled it until its next drain (its Event.wait and file
        # writes were shown as a thread of the user's program).
        self._start_checkpoints()
        failures: list[tuple[str, BaseException]] = []
        for name, backend in self._backends.items():
            try:
                backend.start()
            except Exception as e:
                failures.append((name, e))
                self._errors.append(ErrorRecord(source=name, phase="start", type=type(e).__name__, message=_one_line(e)))
                continue
            self._recording.append(name)
        if failures and not self._recording:
            self._stop_checkpoints()
            self._close_all()
            name, e = failures[0]
            raise BackendError(f"backend {name!r} failed to start: {type(e).__name__}: {e}", plugin=name) from e
        for name, e in failures:
            warnings.warn(f"backend {name!r} failed to start ({type(e).__name__}: {e}); the other backends go on "
                          f"and the failure is recorded in the result", OmniprofWarning, stacklevel=_user_stacklevel())
        for name in self._recording:
            annotations.add_sink(self._backends[name])
        if self._checkpointer is not None:
            self._checkpointer.go()

    def _start_checkpoints(self) -> None:
        interval = checkpoint_interval_s()
        if self.session_dir is None or interval <= 0:
            return
        self.checkpoints = 0
        self.checkpoint_max_ns = 0
        # The checkpoint thread writes the first one at once (even a run killed in its first second
        # leaves a readable file), off the step that started recording: that step is the user's.
        self._checkpointer = Checkpointer(self, interval)
        self._checkpointer.start()

    def _stop_checkpoints(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None

    def checkpoint(self, *, blocking: bool = True) -> Path | None:
        """Write what the recording backends hold so far to ``<session>/omniprof.partial.json``
        (atomically, marked partial); returns its path, or None when there is no session directory.

        Runs by itself every few seconds while recording with a ``logdir``; the file is removed once
        the final result is saved, so only a run that never finished leaves it.
        """
        if not self._lock.acquire(blocking=blocking):
            return None  # the profiler is busy stopping or stepping: the next round will do
        try:
            if self.session_dir is None or not self._recording:
                return None
            t0 = perf_counter_ns()
            parts = []
            for name in self._recording:
                try:
                    snap = self._backends[name].snapshot()
                except Exception:  # a checkpoint never disturbs the run
                    snap = None
                parts.append(snap if snap is not None else BackendResult(backend=name))
            note = ErrorRecord(source="omniprof", phase="run", type="Incomplete",
                               message="checkpoint taken while recording: the run did not finish (killed or crashed)")
            result = ProfileResult(metadata=self._metadata(self.clock.now_ns()), parts=tuple(parts), partial=True,
                                   errors=(*self._errors, note))
            path = self.session_dir / PARTIAL_FILENAME
        finally:
            self._lock.release()
        # Written outside the lock (fsync can take a while on a busy disk); stop() joins the
        # checkpoint thread before saving the final result, so no checkpoint outlives it.
        try:
            result.save(path)
        except OSError:
            return None
        self.checkpoints += 1
        self.checkpoint_max_ns = max(self.checkpoint_max_ns, perf_counter_ns() - t0)
        return path

    def _save(self, *, deferred: bool = False) -> None:
        """Stop every recording backend (each even if another fails), build and publish the result.

        ``deferred`` (a window ending inside ``step()``): backends that can (``stop_deferred``) only
        stop now; their results are built by :meth:`_finish_pending`, at ``stop()`` or when asked for.
        """
        # The checkpoint thread is stopped only after the backends (it cannot start a checkpoint
        # meanwhile: this holds the lock): waking and joining it, or waiting for a checkpoint
        # still being written (outside the lock, fsync included), happens off the recording, so
        # it is neither in the session's time nor sampled as the program's.
        end_ns = self.clock.now_ns()
        parts: list[BackendResult] = []
        builders: list[tuple[str, Callable[[], BackendResult]]] = []
        failures: list[tuple[str, BaseException]] = []
        views: list[dict[str, Any]] = []
        # Every backend that can stops recording before any builds its part: nothing the program's
        # leftover threads do meanwhile is recorded (issue 31 F1).
        halted: dict[str, Callable[[], BackendResult] | None] = {}
        for name in list(self._recording):
            backend = self._backends[name]
            annotations.remove_sink(backend)
            try:
                halted[name] = backend.stop_deferred()
            except Exception as e:
                failures.append((name, e))
                self._errors.append(ErrorRecord(source=name, phase="stop", type=type(e).__name__, message=_one_line(e)))
        for name, build in halted.items():
            backend = self._backends[name]
            try:
                if build is None:
                    parts.append(backend.stop())
                elif deferred:
                    builders.append((name, build))
                else:
                    parts.append(build())
            except Exception as e:
                failures.append((name, e))
                self._errors.append(ErrorRecord(source=name, phase="stop", type=type(e).__name__, message=_one_line(e)))
            else:
                request = getattr(backend, "view_request", None)
                if isinstance(request, dict):
                    views.append(request)
        if not deferred:
            order = {n: i for i, n in enumerate(self.backend_names)}
            parts.sort(key=lambda p: order.get(p.backend, len(order)))
        self._recording = []
        self._stop_checkpoints()  # before anything is published: no checkpoint outlives the result
        self._close_all()
        if self.distributed and not workload_failed(self._errors):
            # A rank whose program raised never waits on the others (they may never come: issue 31
            # F8, a job hung for gloo's 30 min): its part is saved locally, marked partial, and the
            # exception goes on, so the launcher sees the rank fail and can stop the job.
            from omniprof.core.distributed import sync_clock

            sync = sync_clock(self._coll, self.clock.now_ns)
            self._rank.update({f"clock_{k}": v for k, v in sync.to_dict().items()})
        metadata = self._metadata(end_ns)
        errors, self._errors = self._errors, []
        window = _Window(metadata, parts, errors, self.session_dir, failures, views, builders)
        if builders:
            self._pending.append(window)
            return
        self._publish(window)

    def _finish_pending(self) -> None:
        """Build the results of windows that ended inside ``step()`` (oldest first)."""
        if not self._pending:
            return
        with self._lock:
            while self._pending:
                self._finish_one(self._pending.pop(0))

    def _finish_one(self, w: _Window) -> None:
        for name, build in w.builders:
            try:
                w.parts.append(build())
            except Exception as e:
                w.failures.append((name, e))
                w.errors.append(ErrorRecord(source=name, phase="stop", type=type(e).__name__, message=_one_line(e)))
        w.builders = []
        order = {n: i for i, n in enumerate(self.backend_names)}
        w.parts.sort(key=lambda p: order.get(p.backend, len(order)))
        self._publish(w)

    def _publish(self, w: _Window) -> None:
        metadata, session_dir, failures, views = w.metadata, w.session_dir, w.failures, w.views
        parts = w.parts
        run_dir = session_dir.parent if self.distributed and session_dir is not None else None
        if run_dir is not None:
            from omniprof.core.distributed import place_xplanes

            parts = place_xplanes(parts, run_dir, metadata.host, int(metadata.distributed.get("rank", 0)))
        result = ProfileResult(
            metadata=metadata,
            parts=tuple(parts),
            partial=bool(w.errors),
            errors=tuple(w.errors),
        )
        save_error: OSError | None = None
        if session_dir is not None:
            try:
                result.save(session_dir / RESULT_FILENAME)
                (session_dir / PARTIAL_FILENAME).unlink(missing_ok=True)
            except OSError as e:  # disk full, read-only: the result stays in memory for the reporters
                save_error = e
                result = result.evolve(partial=True, errors=(*result.errors, ErrorRecord(
                    source="omniprof", phase="save", type=type(e).__name__, message=_one_line(e))))
        self._results.append(result)
        if self.distributed and not workload_failed(w.errors):
            self._gather(result, run_dir)
        if self.on_result is not None:
            self.on_result(result)
        if views:  # only now: the trace and the result are saved, so no viewer, port or Ctrl-C loses them
            saved = [] if session_dir is None or save_error else [str(session_dir / RESULT_FILENAME)]
            if self._views_after_stop is not None:  # inside stop(): opened when it lets Ctrl-C through
                self._views_after_stop[0].extend(views)
                self._views_after_stop[1].extend(saved)
            else:
                self._open_views(views, saved)
        if failures:
            if len(failures) == 1:
                name, e = failures[0]
                raise BackendError(f"backend {name!r} failed to stop: {type(e).__name__}: {e}. The other backends' "
                                   f"data is in Profiler.result (marked partial)", plugin=name) from e
            raise BackendError("backends failed to stop: " + "; ".join(
                f"{n!r}: {type(e).__name__}: {e}" for n, e in failures) + ". The other backends' data is in Profiler.result")
        if save_error is not None:
            raise save_error

    def _gather(self, result: ProfileResult, run_dir: Path | None) -> None:
        """Every rank's result to rank 0 over the process group; rank 0 writes the merged one."""
        from omniprof.core import distributed as dist

        everyone = self._coll.gather_object(result.to_dict())
        results = [ProfileResult.from_dict(d) for d in everyone] if everyone is not None else []
        # The xplanes rank 0 cannot see (no shared filesystem) travel to it too: rank 0 says which.
        missing = dist.xplanes_missing(run_dir, results) if results and run_dir is not None else {}
        missing = self._coll.all_gather_object(missing)[0]
        if missing:
            mine = missing.get(self._coll.rank)
            files = self._coll.gather_object(dist.xplane_bytes(result.parts, mine) if mine else {})
            if files is not None and run_dir is not None:
                for rank, got in enumerate(files):
                    for name, data in (got or {}).items():
                        atomic_write_bytes(run_dir / name, data)
                    if got:
                        results = [dist.repoint_artifacts(r, run_dir, list(got))
                                   if int(r.metadata.distributed.get("rank", 0)) == rank else r for r in results]
        if self._coll.rank != 0 or everyone is None:
            return
        merged = dist.merge_ranks(results)
        if run_dir is not None:
            for r in results:
                path = dist.rank_dir(run_dir, int(r.metadata.distributed["rank"])) / RESULT_FILENAME
                if not path.exists():  # no shared filesystem: rank 0 keeps a copy of every part
                    path.parent.mkdir(parents=True, exist_ok=True)
                    r.save(path)
            merged.save(run_dir / RESULT_FILENAME)
        self.merged_result = merged

    def _close_all(self) -> None:
        self._stop_checkpoints()
        for name, backend in list(self._backends.items()):
            annotations.remove_sink(backend)
            try:
                backend.close()
            except Exception as e:
                self._errors.append(ErrorRecord(source=name, phase="close", type=type(e).__name__, message=_one_line(e)))
        self._backends = {}

    def _abort(self) -> None:
        self._stop_checkpoints()
        for name in self._recording:
            annotations.remove_sink(self._backends[name])
            try:
                self._backends[name].stop()
            except Exception:
                pass
        self._recording = []
        self._close_all()
        self._started = False
        self._release()

    def _open_views(self, requests: list[dict[str, Any]], saved: list[str]) -> None:
        """Open what backends asked to show once the result was saved (``create_perfetto_link``),
        through this Profiler's viewer; never raises."""
        viewer = self.viewer or default_viewer()
        if viewer is not None:
            viewer(requests, saved)
            return
        for req in requests:
            warnings.warn(f"{req.get('viewer', 'a viewer')} was asked for, but this Profiler has no viewer "
                          f"(Profiler(viewer=omniprof.viewers.open_views)). Nothing is lost: open "
                          f"{req.get('path', 'the trace')} with omniprof view --perfetto", OmniprofWarning,
                          stacklevel=_user_stacklevel())

    def _metadata(self, end_ns: int) -> RunMetadata:
        import platform
        import socket

        from omniprof.core.host import platform_string

        return RunMetadata(
            host=socket.gethostname(), pid=os.getpid(), argv=tuple(sys.argv), python=platform.python_version(),
            platform=platform_string(), versions={"omniprof": __version__},
            backends=self.backend_names, options=self.options.to_dict(),
            backend_options={n: _opts_dict(o) for n, o in self._backend_opts.items()},
            start_unix_ns=self._t0_unix_ns, start_ns=self._t0_ns, end_ns=end_ns, label=self.label,
            distributed=dict(self._rank) if self.distributed else {},
        )


def _pay_one_time_costs(*, with_files: bool) -> None:
    """Costs paid once per process, at prepare (a schedule's wait/warm-up), so that none of them
    lands in the first recorded step, where it would be read as the user's time.

    The platform string is found once (``host.platform_string()``); writing a result first imports
    cattrs and compiles the schema's hooks (30-50 ms loaded, measured in a 4-rank DDP job's step).
    """
    from omniprof.core.host import platform_string  # here, not at import: `import omniprof` stays light

    platform_string()
    if with_files:
        from omniprof.core.results import warm_converter

        warm_converter()


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first caller outside omniprof's core."""
    here = Path(__file__).resolve().parent
    frame = sys._getframe(1)
    level = 1
    while frame is not None and Path(frame.f_code.co_filename).resolve().parent == here:
        frame = frame.f_back
        level += 1
    return level


def _opts_dict(opts: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(opts) if attrs.has(type(opts)) else {}


def _one_line(exc: BaseException) -> str:
    """The first line of what ``exc`` says; empty where it says nothing (the type names it)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else ""
