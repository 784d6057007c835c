"""omniprof's own readers of native trace files (entry-point group ``omniprof.readers``).

A reader plugin reads a file through its format module (:mod:`omniprof.formats`) and attaches the
tables users read through the analyses (:mod:`omniprof.analysis`): it stands above both, beside the
backends and reporters, as a format never calls an analysis. Each imports its modules only when a
file is read, so listing plugins stays fast.
"""

from __future__ import annotations

from pathlib import Path

from omniprof.core.reader import Reader
from omniprof.core.results import ProfileResult

__all__ = ["XPlaneReader", "KinetoReader"]


class XPlaneReader(Reader):
    """``.xplane.pb`` files, XProf run directories and logdirs (needs jax's profiler bindings)."""

    name = "xplane"
    summary = "XProf .xplane.pb files, run directories and logdirs"

    def read(self, path: Path) -> ProfileResult:
        from omniprof.analysis.xla_ops import op_stats_table
        from omniprof.formats.xplane import read_xplane

        return read_xplane(path, op_table=op_stats_table)


class KinetoReader(Reader):
    """PyTorch Kineto trace JSON (``.json`` or ``.json.gz``); torch is not imported. A directory of
    per-rank Kineto traces (HTA's input) reads as one merged distributed result."""

    name = "kineto"
    summary = "PyTorch Kineto trace JSON (.json, .json.gz), or a directory of per-rank traces"

    def read(self, path: Path) -> ProfileResult:
        from omniprof.analysis.torch_ops import with_tables

        if Path(path).is_dir():
            from omniprof.formats.rankdir import load_kineto_dir

            return with_tables(load_kineto_dir(path))
        from omniprof.formats.kineto import read_trace

        return with_tables(read_trace(path))
