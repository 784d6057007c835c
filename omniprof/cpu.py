"""The cpu backend's own helpers: the process-wide sample buffer (Julia's ``Profile`` for Python)
and the SIGUSR1 peek. ``omniprof.sampler`` and the top-level ``enable_peek``/``disable_peek``/
``set_peek_duration`` are deprecated spellings of this module and its functions.

>>> import omniprof.cpu
>>> omniprof.cpu.init()                      # (max_samples, interval_s)
(1000000, 0.001)
"""

from omniprof.backends.cpu.api import (
    BYTES_PER_SAMPLE,
    PeekReport,
    PrintOptions,
    RawBuffer,
    callers,
    clear,
    default_peek_report,
    disable_peek,
    enable_peek,
    fetch,
    init,
    peek_duration,
    peek_report,
    print,
    report_groups,
    retrieve,
    set_peek_duration,
)

__all__ = ["init", "fetch", "retrieve", "clear", "print", "callers", "report_groups", "RawBuffer",
           "enable_peek", "disable_peek", "set_peek_duration", "peek_duration", "peek_report", "PeekReport",
           "default_peek_report", "PrintOptions", "BYTES_PER_SAMPLE"]
