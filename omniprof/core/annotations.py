"""User annotations: named ranges that reach every recording backend's native trace.

When nothing is recording, :class:`annotate` costs one attribute read and a tuple check.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

__all__ = ["annotate", "annotate_function", "StepTraceAnnotation", "set_sinks", "active_sinks", "STEP_MARK",
           "user_args"]

F = TypeVar("F", bound=Callable[..., Any])

# Tuple of objects with ``annotation(name, args) -> ContextManager | None`` (recording backends).
# Replaced wholesale (never mutated) so readers need no lock.
_sinks: tuple[Any, ...] = ()
_lock = threading.Lock()


def set_sinks(sinks: tuple[Any, ...]) -> None:
    global _sinks
    with _lock:
        _sinks = tuple(sinks)


def add_sink(sink: Any) -> None:
    global _sinks
    with _lock:
        _sinks = (*_sinks, sink)


def remove_sink(sink: Any) -> None:
    global _sinks
    with _lock:
        _sinks = tuple(s for s in _sinks if s is not sink)


def active_sinks() -> tuple[Any, ...]:
    return _sinks


#: The argument :class:`StepTraceAnnotation` adds to its ``args`` so that a backend with a native
#: notion of a step (xla: XProf's step view) can mark it; not the user's, so backends that store the
#: args store :func:`user_args`.
STEP_MARK = "_step"


def user_args(args: dict[str, Any] | None) -> dict[str, Any]:
    """``args`` of an annotation without :data:`STEP_MARK` (a new dict).

    >>> user_args({"step_num": 3, STEP_MARK: True})
    {'step_num': 3}
    """
    return {k: v for k, v in (args or {}).items() if k != STEP_MARK}


class annotate:  # noqa: N801 - public name mirrors jax.profiler.TraceAnnotation's use
    """Context manager marking a named range in every recording backend; a no-op otherwise.

    The one name for a user range (jax's ``TraceAnnotation``, torch's ``record_function``): each
    recording backend writes it to its own trace (a jax ``TraceMe``, a torch ``record_function``, an
    ``annotation`` span of the cpu sampler), with ``args`` attached.

    >>> with annotate("load_batch"):
    ...     pass

    .. versionadded:: 0.1
    """

    __slots__ = ("name", "args", "_stack")

    def __init__(self, name: str, **args: Any) -> None:
        self.name = name
        self.args = args
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> annotate:
        sinks = _sinks
        if sinks:
            stack = contextlib.ExitStack()
            for sink in sinks:
                cm: AbstractContextManager[Any] | None = sink.annotation(self.name, self.args)
                if cm is not None:
                    stack.enter_context(cm)
            self._stack = stack
        return self

    def __exit__(self, *exc: object) -> None:
        stack = self._stack
        if stack is not None:
            self._stack = None
            stack.__exit__(*exc)


class StepTraceAnnotation(annotate):
    """A range marking one training step: an :class:`annotate` range named ``name`` that carries
    ``step_num`` as an argument in every recording backend, and that the xla backend also marks as a
    step (jax's ``StepTraceAnnotation``: a ``step`` span, XProf's step view).

    >>> with StepTraceAnnotation("train", step_num=3):
    ...     pass
    """

    __slots__ = ()

    def __init__(self, name: str = "train", *, step_num: int, **args: Any) -> None:
        super().__init__(name, step_num=step_num, **args)
        self.args[STEP_MARK] = True


def annotate_function(func: F | None = None, *, name: str | None = None) -> Any:
    """Decorator: every call of ``func`` is an annotation named after it (or ``name``).

    >>> @annotate_function
    ... def train_step(x):
    ...     return x + 1
    >>> train_step(1)
    2
    """

    def wrap(f: F) -> F:
        label = name or getattr(f, "__qualname__", getattr(f, "__name__", "function"))

        @functools.wraps(f)
        def wrapper(*a: Any, **kw: Any) -> Any:
            if not _sinks:
                return f(*a, **kw)
            with annotate(label):
                return f(*a, **kw)

        return wrapper  # type: ignore[return-value]

    return wrap(func) if func is not None else wrap
