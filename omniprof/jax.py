"""The xla backend's own helpers for jax code: time a function (``time``, ``timed``), profile it
with XLA's cost analysis (``profile``), and serve or collect profiles of running processes.
``omniprof.time``, ``omniprof.timed``, ``omniprof.profile``, ``omniprof.start_server`` and
``omniprof.stop_server`` are deprecated spellings of these functions. Importing this module does not
import jax; calling a function does. ``omniprof.jax.profile(f, *args)`` profiles one call of a jax
function; ``omniprof.memory.profile()`` is another helper: a Profiler on the memory backend."""

from omniprof.backends.xla.remote import collect, start_server, stop_server
from omniprof.backends.xla.timing import profile, time, timed

__all__ = ["time", "timed", "profile", "start_server", "stop_server", "collect"]
