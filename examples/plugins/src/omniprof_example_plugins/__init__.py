"""Example third-party omniprof plugins: the ``rusage`` backend and the ``markdown`` reporter.

omniprof finds them through the entry points in this distribution's ``pyproject.toml``; nothing
here is imported until a user selects one of them.
"""

__version__ = "0.1.0"
