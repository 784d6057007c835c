"""The viewer a Profiler hands what backends ask to show once the result is saved.

A backend never serves: one that wants a view (the xla backend's ``create_perfetto_link``) leaves a
``view_request`` on itself, and the Profiler, after it saved the result, gives the requests to its
viewer. The viewer layer (``omniprof.viewers``) sits above the kernel, so the front end passes it
in: ``Profiler(viewer=...)``, or :func:`set_default_viewer`, which ``omniprof.cli.main`` and the
first use of ``omniprof.Profiler`` call with ``omniprof.viewers.open_views``. This module is light
(no import beyond typing), so a front end installs the viewer without loading the kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Viewer", "set_default_viewer", "default_viewer"]

#: Called with the requests and the saved files once the result is saved; never raises.
Viewer = Callable[[Sequence[Mapping[str, Any]], Sequence[str]], None]
_default_viewer: list[Viewer] = []


def set_default_viewer(viewer: Viewer | None) -> None:
    """The viewer of every Profiler made without ``viewer=`` (None: no default)."""
    _default_viewer[:] = [viewer] if viewer is not None else []


def default_viewer() -> Viewer | None:
    """The viewer :func:`set_default_viewer` installed, or None."""
    return _default_viewer[0] if _default_viewer else None
