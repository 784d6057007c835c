"""Reporter ``collapsed``: Brendan Gregg's folded stacks, the input of ``flamegraph.pl``.

One line per distinct stack, frames root first and separated by ``;``, then a space and the
weight: ``main (prog.py);work (prog.py) 3000000``. ``flamegraph.pl out.collapsed > out.svg``
draws it; speedscope, inferno and most flame-graph tools read it too.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import IO

import attrs

from omniprof.analysis.stackdata import SOURCES, StackNode, StackProfile, frame_label, stack_profile
from omniprof.core import validators as v
from omniprof.core.results import ProfileResult
from omniprof.plugin import Reporter

__all__ = ["CollapsedReporter", "CollapsedOptions", "collapsed_lines"]


@attrs.frozen(kw_only=True)
class CollapsedOptions:
    """Options of the ``collapsed`` reporter.

    Attributes:
        source: ``"auto"`` (samples, else allocations, else spans), ``"samples"``, ``"spans"``
            (nested spans per track, self time) or ``"allocations"``.
        weight: ``"value"``: nanoseconds for samples and spans, bytes for allocations;
            ``"count"``: samples, spans or allocated objects.
        in_use: allocations only: count only what was still allocated at the end.
        frame_format: ``"function"``, ``"function_file"`` (default) or ``"function_line"``.
        thread_prefix: start every stack with its thread (or track) name, so threads get
            separate towers (py-spy's ``--threads``).
    """

    source: str = attrs.field(default="auto", validator=v.one_of(*SOURCES))
    weight: str = attrs.field(default="value", validator=v.one_of("value", "count"))
    in_use: bool = attrs.field(default=False, validator=v.is_bool)
    frame_format: str = attrs.field(default="function_file",
                                    validator=v.one_of("function", "function_file", "function_line"))
    thread_prefix: bool = attrs.field(default=False, validator=v.is_bool)


_TRAILING_NUMBER = re.compile(r"\s(\d+(?:\.\d*)?)$")


def _clean(label: str) -> str:
    # ';' separates frames and a line ends the record: neither may appear inside a frame.
    label = " ".join(label.replace(";", ":").split()) or "?"
    # flamegraph.pl reads "stack N M" as a differential profile, so a frame ending in
    # " <number>" ("step 1") would lose its number to a second count. A no-break space looks
    # the same and is not whitespace to flamegraph.pl.
    return _TRAILING_NUMBER.sub("\u00a0\\1", label)


def collapsed_lines(profile: StackProfile, opts: CollapsedOptions = CollapsedOptions()) -> list[tuple[str, int]]:
    """``(folded stack, weight)`` pairs, sorted by stack; zero-weight stacks are left out."""
    if profile.source == "allocations":
        index = (2 if opts.weight == "count" else 3) if opts.in_use else (0 if opts.weight == "count" else 1)
    else:
        index = 0 if opts.weight == "count" else 1
    # Sum per stack node (and thread) first: a folded line is written only for a stack that has
    # weight, once, however many records share it (nested spans 10,000 deep: one line, not 10,000).
    by_node: dict[tuple[StackNode, str], int] = {}
    for rec in profile.records:
        key = (rec.node, rec.thread if opts.thread_prefix else "")
        by_node[key] = by_node.get(key, 0) + rec.values[index]
    totals: Counter[str] = Counter()
    labels: dict[object, str] = {}
    for (node, thread), weight in by_node.items():
        if weight == 0:
            continue
        parts = []
        for f in node.frames():
            lab = labels.get(f)
            if lab is None:
                lab = labels[f] = _clean(frame_label(f, opts.frame_format))
            parts.append(lab)
        if opts.thread_prefix:
            parts.insert(0, _clean(thread))
        totals[";".join(parts or ["[no frames]"])] += weight
    return sorted((k, w) for k, w in totals.items() if w > 0)


class CollapsedReporter(Reporter):
    """Folded stacks for flamegraph.pl (and speedscope, inferno, ...)."""

    name = "collapsed"
    output = "file"
    default_filename = "profile.collapsed"
    summary = "folded stacks for flamegraph.pl (Brendan Gregg's collapsed format)"
    Options = CollapsedOptions

    def lines(self, result: ProfileResult) -> list[tuple[str, int]]:
        return collapsed_lines(stack_profile(result, self.options.source, aggregate=True), self.options)

    def report(self, result: ProfileResult, dest: IO[bytes]) -> None:  # type: ignore[override]
        text = "".join(f"{stack} {weight}\n" for stack, weight in self.lines(result))
        dest.write(text.encode("utf-8"))
