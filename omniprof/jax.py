"""The xla backend's own helpers for jax code: time a function (``time``, ``timed``), profile it
with XLA's cost analysis (``profile``), and serve or collect profiles of running processes.
``omniprof.time``, ``omniprof.timed``, ``omniprof.profile``, ``omniprof.start_server`` and
``omniprof.stop_server`` are the same functions under their older names. Importing this module does
not import jax; calling a function does."""

from omniprof.backends.xla.remote import collect, start_server, stop_server
from omniprof.backends.xla.timing import profile, time, timed

__all__ = ["time", "timed", "profile", "start_server", "stop_server", "collect"]
