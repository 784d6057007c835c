"""Reporter ``json``: the result as JSON (the schema of ``docs/schema/profile-result.schema.json``)."""

from __future__ import annotations

import gzip
from typing import IO

import attrs

from omniprof.core import validators as v
from omniprof.core.results import ProfileResult
from omniprof.plugin import Reporter

__all__ = ["JsonReporter"]


@attrs.frozen(kw_only=True)
class JsonOptions:
    """Options of the ``json`` reporter.

    Attributes:
        indent: spaces of indentation (None: compact).
        compress: gzip the output.
        include_cross_rank: in a merged distributed result, write the cross-rank analysis
            (:meth:`omniprof.analysis.crossrank.CrossRankReport.to_dict`) under
            ``metadata.distributed.cross_rank`` (docs/schema/cross-rank.schema.json).
    """

    indent: int | None = attrs.field(default=None, validator=v.int_in_range(0, 16, optional=True))
    compress: bool = attrs.field(default=False, validator=v.is_bool)
    include_cross_rank: bool = attrs.field(default=True, validator=v.is_bool)


class JsonReporter(Reporter):
    """The whole result as JSON; ``omniprof.load`` and ``omniprof report`` read it back."""

    name = "json"
    output = "file"
    default_filename = "omniprof.result.json"
    summary = "the whole result as JSON (reload with omniprof.load / omniprof report)"
    Options = JsonOptions

    def report(self, result: ProfileResult, dest: IO[bytes]) -> None:  # type: ignore[override]
        if self.options.include_cross_rank and result.metadata.distributed.get("merged"):
            from omniprof.analysis import crossrank

            cross = crossrank.analyze_result(result).to_dict()
            md = result.metadata
            result = result.evolve(metadata=attrs.evolve(md, distributed={**md.distributed, "cross_rank": cross}))
        data = result.to_json(indent=self.options.indent).encode("utf-8")
        if self.options.compress:
            data = gzip.compress(data, mtime=0)
        dest.write(data)
