"""Run a target -- a script, ``-m module`` or ``package.module:function`` -- under a Profiler.

The one way ``omniprof run`` runs anything, with or without a config file: the CLI builds a
:class:`~omniprof.config.RunConfig` (file < ``OMNIPROF_*`` environment < flags) and calls
:func:`run`. Library code may call :func:`execute` directly::

    cfg = load_config("omniprof.toml")
    outcome = execute(cfg)         # outcome.results, outcome.exit_code, outcome.error

The target's own exceptions are caught into the :class:`RunOutcome`; omniprof's errors propagate.
Nothing here prints: the CLI reports the outcome.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import runpy
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from omniprof.config import RunConfig, TargetSpec
from omniprof.core.clock import monotonic
from omniprof.core.profiler import Profiler
from omniprof.core.registry import get_registry
from omniprof.errors import InvalidArgumentError, OmniprofError

__all__ = ["RunOutcome", "Terminated", "execute", "run", "make_call", "call_function", "environment",
           "sigterm_unwinds", "sigint_once", "CtrlC", "launcher_codes", "exit_code"]


class Terminated(BaseException):
    """SIGTERM arrived while the target ran: unwinds it like KeyboardInterrupt, so the profile is
    stopped and saved (marked partial) before omniprof dies of the same signal."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


#: Signals that end the target as SIGTERM does: SIGHUP is what a closed SSH session or terminal
#: sends, and must keep the profile as much as a ``kill`` does.
_UNWINDING = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While the target runs, SIGTERM and SIGHUP raise :class:`Terminated` in the main thread (once;
    a second one kills at once). Each is left alone when its handler is not the default one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    from omniprof.core.forks import OwnedHandler

    def handler(signum: int, frame: Any) -> None:
        for sig in _UNWINDING:
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(sig) is handler:
                    signal.signal(sig, signal.SIG_DFL)
        raise Terminated(signum)

    # Owned by this process: a forked child (multiprocessing's fork start method) gets the
    # default action back, so Process.terminate() and Pool.terminate() work as under python.
    owned = [OwnedHandler(sig, handler).install() for sig in _UNWINDING if signal.getsignal(sig) == signal.SIG_DFL]
    try:
        yield
    finally:
        for o in owned:
            o.restore()


class CtrlC:
    """Ctrl-C while the target runs: the first SIGINT raises ``KeyboardInterrupt`` in the target,
    as python's own handler does; the ones that follow while it unwinds and the profile is saved
    are counted in :attr:`more` instead of raised. Raised, a second one replaced the program's
    traceback with one into omniprof's stop (``contextlib.py``) or died of SIGINT outside it."""

    def __init__(self) -> None:
        self.fired = False
        self.more = 0

    def __call__(self, signum: int, frame: Any) -> None:
        if self.fired:
            self.more += 1
            return
        self.fired = True
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigint_once(ctrl_c: CtrlC) -> Iterator[None]:
    """Install ``ctrl_c`` for SIGINT while the block runs, if python's own handler is there (the
    program's own handler is left alone)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    from omniprof.core.forks import OwnedHandler

    owned = OwnedHandler(signal.SIGINT, ctrl_c).install()
    try:
        yield
    finally:
        owned.restore()


def launcher_codes() -> tuple[Any, ...]:
    """The code objects of the frames that hand over to the target: ``runpy``'s ``_run_code``
    (scripts, ``-m`` modules) and :func:`call_function` (``module:function`` targets). The runner's
    Profiler gets them (``Profiler(launcher_codes=...)``), so its stacks start at the target; a
    Profiler made elsewhere in the same process is not affected."""
    return (runpy._run_code.__code__, call_function.__code__)  # type: ignore[attr-defined]


def run(cfg: RunConfig, *, registry: Any = None, peek: bool = False) -> RunOutcome:
    """:func:`execute` as ``omniprof run`` does it: sampled stacks start at the target, SIGTERM
    unwinds the target (:class:`Terminated` in ``outcome.error``), and with ``peek`` SIGUSR1 prints
    every thread's stack."""
    if peek:
        from omniprof.backends.cpu import api as sampler_api

        sampler_api.enable_peek(launcher_codes=launcher_codes())
    pid = os.getpid()
    ctrl_c = CtrlC()
    try:
        with sigterm_unwinds(), sigint_once(ctrl_c):
            out = execute(cfg, registry=registry)
    finally:
        if peek and os.getpid() == pid:
            sampler_api.disable_peek()
    out.forked_child = os.getpid() != pid
    out.more_interrupts = ctrl_c.more
    return out


@attrs.define
class RunOutcome:
    """What :func:`execute` did.

    Attributes:
        results: every finished result (one per recorded schedule cycle).
        runs: how many times the target ran.
        exit_code: the target's ``SystemExit`` code (0 when it returned normally; 1 for a message).
        exit_message: the message of ``SystemExit("message")``, which python prints, or None.
        error: the exception the target raised (not SystemExit), or None.
        session_dir: the last session directory, when ``logdir`` was set.
        problem: omniprof's own failure after results were recorded (e.g. the session could not be
            saved), or None.
        forked_child: this is a process the program forked, returning from the target.
    """

    results: list[Any] = attrs.field(factory=list)
    runs: int = 0
    exit_code: int = 0
    exit_message: str | None = None
    error: BaseException | None = None
    session_dir: Path | None = None
    problem: OmniprofError | None = None
    #: True in a child the program forked (os.fork()) that came back here: the profile is the
    #: parent's, the child reports and prints nothing of omniprof's.
    forked_child: bool = False
    #: Ctrl-Cs that came after the first while the target unwound and the profile was saved.
    more_interrupts: int = 0


@contextlib.contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """Set ``env`` for the duration, then restore the previous values (and unset new ones)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def make_call(target: TargetSpec) -> Callable[[], Any]:
    """A no-argument callable that runs ``target`` once. A function's module is imported now."""
    if target.kind == "function":
        mod_name, _, attr = target.value.partition(":")
        added = False
        base = target.base_dir or os.getcwd()
        if base not in sys.path:
            sys.path.insert(0, base)
            added = True
        try:
            try:
                obj: Any = importlib.import_module(mod_name)
            except Exception as e:
                missing = isinstance(e, ModuleNotFoundError) and e.name is not None and (
                    mod_name == e.name or mod_name.startswith(e.name + "."))
                if not missing:  # the user's module itself failed: its traceback, not a usage error
                    from omniprof.errors import TargetImportError

                    raise TargetImportError(f"importing {mod_name!r} for {target.value!r} failed") from e
                raise
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise InvalidArgumentError(f"cannot load function {target.value!r}: {type(e).__name__}: {e}. Check the "
                                       f"module is importable from {base} and defines it") from e
        finally:
            if added:
                sys.path.remove(base)
        if not callable(obj):
            raise InvalidArgumentError(f"{target.value!r} is a {type(obj).__name__}, not a function")
        args, kwargs = tuple(target.args), dict(target.kwargs)
        return lambda: call_function(obj, args, kwargs)
    if target.kind == "module":
        _check_module(target.value)

        def run_module() -> Any:
            with _argv_path([target.value, *target.args], os.getcwd()):
                return runpy.run_module(target.value, run_name="__main__", alter_sys=True)
        return run_module

    # runpy.run_path imports pkgutil on its first use: import it here, before profiling starts, so
    # that the import (module code run once and freed: `<unknown code>` frames) is not in the profile
    import pkgutil  # noqa: F401

    def run_script() -> Any:
        with _argv_path([target.value, *target.args], str(Path(target.value).resolve().parent)):
            return runpy.run_path(target.value, run_name="__main__")
    return run_script


def _check_module(module: str) -> None:
    """A module target must be importable: one line naming it otherwise (as ``python -m``), before
    any profiling starts. A parent package that fails to import is the user's failure."""
    import importlib.util

    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        spec = None
    except Exception as e:
        from omniprof.errors import TargetImportError

        raise TargetImportError(f"importing the parents of {module!r} failed") from e
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(os.getcwd())
    if spec is None:
        raise InvalidArgumentError(f"no module named {module!r} (run from the directory that holds it, or install it)")


def call_function(func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """Call a function target (the runner's stacks are cut here, so they start at the target)."""
    return func(*args, **kwargs)


@contextlib.contextmanager
def _argv_path(argv: list[str], path0: str) -> Iterator[None]:
    saved_argv = list(sys.argv)
    sys.argv = list(argv)
    sys.path.insert(0, path0)
    try:
        yield
    finally:
        sys.argv = saved_argv
        with contextlib.suppress(ValueError):
            sys.path.remove(path0)


def execute(cfg: RunConfig, *, registry: Any = None, clock: Any = None) -> RunOutcome:
    """Run ``cfg``: set its environment, run the target ``repeats`` times (or for ``duration_s``)
    under one :class:`~omniprof.Profiler`, calling ``Profiler.step()`` between runs so the schedule
    applies. The target's own exceptions are caught into the outcome (and recorded in the result);
    omniprof's errors propagate. The Profiler's stacks start at the target (:func:`launcher_codes`).
    """
    if cfg.target is None:
        raise InvalidArgumentError("the configuration names nothing to run: set script, module or function")
    reg = registry or get_registry()
    out = RunOutcome()
    with environment(cfg.env):
        prof = Profiler(backend=list(cfg.backends), options=cfg.options, backend_options=dict(cfg.backend_options),
                        logdir=cfg.logdir, schedule=cfg.schedule, registry=reg, label=cfg.label,
                        verbose=cfg.verbose, clock=clock, distributed=cfg.distributed,
                        launcher_codes=launcher_codes())
        call = make_call(cfg.target)
        count = cfg.repeat_count()
        deadline = monotonic() + cfg.duration_s if cfg.duration_s is not None else None
        try:
            with prof:
                while True:
                    try:
                        call()
                    except SystemExit as e:
                        out.exit_code = exit_code(e.code)
                        if not isinstance(e.code, int) and e.code is not None:
                            out.exit_message = str(e.code)
                        if out.exit_code:
                            raise
                    out.runs += 1
                    if count is not None and out.runs >= count:
                        break
                    if deadline is not None and monotonic() >= deadline:
                        break
                    prof.step()
        except SystemExit:
            pass
        except OmniprofError as e:
            if not prof.results:
                raise
            out.problem = e  # e.g. the session could not be saved: the results still get reported
        except BaseException as e:  # the target's failure: reported, the partial result kept
            out.error = e
    out.results = list(prof.results)
    out.session_dir = prof.session_dir
    return out


def exit_code(code: Any) -> int:
    """The process exit status python gives ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


