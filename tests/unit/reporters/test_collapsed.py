"""The collapsed reporter: folded stacks that flamegraph.pl draws without ignoring a line."""

from __future__ import annotations

import io
import re

import pytest

import omniprof
from omniprof.core.results import BackendResult, Frame, ProfileResult, StackSample, ThreadInfo
from omniprof.reporters.collapsed import CollapsedOptions, CollapsedReporter
from omniprof.testing.conformance import ReporterConformance
from omniprof.testing.fakes import make_result


class TestCollapsedConformance(ReporterConformance):
    reporter_cls = CollapsedReporter


def _text(result: ProfileResult, **opts) -> str:
    buf = io.BytesIO()
    CollapsedReporter(CollapsedOptions(**opts)).report(result, buf)
    return buf.getvalue().decode()


def test_samples_fold_root_first_with_ns_weights():
    """Each distinct stack is one line, root first, weighted by sampled nanoseconds."""
    assert _text(make_result()).splitlines() == [
        "main (prog.py);helper (lib.py) 1000000",
        "main (prog.py);work (prog.py) 4000000",
        "main (prog.py);work (prog.py);helper (lib.py) 4000000",
        "main (prog.py);work (prog.py);memcpy (libc.so.6) 1000000",
    ]


def test_weight_count_thread_prefix_and_frame_format():
    """weight='count' counts samples; thread_prefix adds the thread; function_line adds lines."""
    text = _text(make_result(), weight="count", thread_prefix=True, frame_format="function_line")
    assert "MainThread;main (prog.py:10);work (prog.py:20);helper (lib.py:5) 4" in text.splitlines()
    assert _text(make_result(), frame_format="function").splitlines()[0] == "main;helper 1000000"


def test_spans_and_allocations_sources():
    """source='spans' folds nested spans by self time; allocations weigh bytes, optionally in use only."""
    assert _text(make_result(), source="spans").splitlines() == [
        "gemm_kernel 1000000", "step\u00a01 4900000", "step\u00a01;launch 100000"]
    assert _text(make_result(), source="allocations").splitlines() == [
        "main (prog.py);helper (lib.py) 128", "main (prog.py);work (prog.py);helper (lib.py) 4096"]
    assert _text(make_result(), source="allocations", in_use=True).splitlines() == [
        "main (prog.py);work (prog.py);helper (lib.py) 4096"]


def test_separator_and_newline_in_names_are_replaced():
    """A ';' or newline inside a frame name cannot split a frame or a line."""
    part = BackendResult(backend="cpu", frames=(Frame("a;b\nc", "f.py"),), stacks=((0,),),
                         samples=(StackSample(0, 1, 0, 7),))
    assert _text(ProfileResult(parts=(part,))) == "a:b c (f.py) 7\n"


def _svg_total(svg: str) -> int:
    m = re.search(r"<title>all \(([\d,]+) samples", svg)
    assert m, "no root frame in the SVG"
    return int(m.group(1).replace(",", ""))


@pytest.mark.parametrize("which", ["fake", "real", "threads"])
def test_flamegraph_pl_draws_it_without_ignored_lines(which, cpu_result, flamegraph_pl, run_tool, tmp_path):
    """flamegraph.pl makes an SVG from our file, ignores no line, and its total is our total."""
    result = make_result() if which == "fake" else cpu_result
    opts = {"thread_prefix": True} if which == "threads" else {}
    path = omniprof.report(result, "collapsed", tmp_path, options=opts)
    proc = run_tool(flamegraph_pl, str(path))
    svg, err = proc.stdout.decode(), proc.stderr.decode()
    assert "Ignored" not in err and "ERROR" not in err, err
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    # negative weights (a cpu sampler bug seen under load) are drawn as 0
    assert _svg_total(svg) == sum(max(0, s.weight_ns) for p in result.parts for s in p.samples)


def test_flamegraph_pl_handles_odd_names(flamegraph_pl, run_tool, tmp_path):
    """Names with spaces, digits at the end, brackets and unicode still parse in flamegraph.pl."""
    frames = (Frame("step 1"), Frame("<lambda>", "a b.py"), Frame("f 42"), Frame("naïve;x"))
    part = BackendResult(backend="cpu", frames=frames, stacks=((0, 1, 2), (0, 3)),
                         threads=(ThreadInfo(1, "worker 2"),),
                         samples=(StackSample(0, 1, 0, 5), StackSample(1, 1, 1, 9)))
    path = omniprof.report(ProfileResult(parts=(part,)), "collapsed", tmp_path, options={"thread_prefix": True})
    proc = run_tool(flamegraph_pl, str(path))
    assert "Ignored" not in proc.stderr.decode()
    assert _svg_total(proc.stdout.decode()) == 14
    assert "f\u00a042 (5 samples" in proc.stdout.decode()


def test_flamegraph_pl_draws_spans_named_like_counts(flamegraph_pl, run_tool, tmp_path):
    """Span names ending in a number ("step 1") keep their number and their time in flamegraph.pl."""
    path = omniprof.report(make_result(), "collapsed", tmp_path, options={"source": "spans"})
    proc = run_tool(flamegraph_pl, str(path))
    svg = proc.stdout.decode()
    assert "Ignored" not in proc.stderr.decode()
    assert _svg_total(svg) == 6_000_000
    assert "<title>step\u00a01 (5,000,000 samples" in svg


def test_identical_nested_spans_are_one_line_flamegraph_pl_draws(flamegraph_pl, run_tool, tmp_path):
    """Spans nested 400 deep with self time only in the innermost: one folded line of 400 frames
    (the others weigh 0 and are left out), drawn 400 boxes deep by flamegraph.pl."""
    from omniprof.core.results import Span

    depth, dur = 400, 7_000
    r = ProfileResult(parts=(BackendResult(backend="cpu", spans=[Span("step", "t", 100, dur) for _ in range(depth)]),))
    assert _text(r, source="spans") == ";".join(["step"] * depth) + f" {dur}\n"
    path = omniprof.report(r, "collapsed", tmp_path, options={"source": "spans"})
    proc = run_tool(flamegraph_pl, str(path))
    assert "Ignored" not in proc.stderr.decode()
    assert proc.stdout.decode().count(f"<title>step ({dur:,} samples") == depth
