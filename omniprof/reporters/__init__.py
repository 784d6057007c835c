"""The built-in reporters (entry-point group ``omniprof.reporters``).

``omniprof.reporters.base``, the old home of the reporter plugin API, names :mod:`omniprof.plugin`.
"""

import sys as _sys

from omniprof import plugin as base

_sys.modules[__name__ + ".base"] = base
