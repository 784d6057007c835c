"""The built-in backends (entry-point group ``omniprof.backends``).

``omniprof.backends.base``, the old home of the backend plugin API, names :mod:`omniprof.plugin`.
"""

import sys as _sys

from omniprof import plugin as base

_sys.modules[__name__ + ".base"] = base
