"""Cross-rank analysis of a distributed run: where each rank's time went, and who held the others up.

Input: a merged distributed result, an omniprof distributed run directory (``rank<N>/`` parts), or
a directory of per-rank Kineto traces (what Holistic Trace Analysis takes: the rank from the
trace's ``distributedInfo.rank``, else from a ``rank<N>`` in the file name). Each rank is reduced
alone first to a small :class:`RankSummary` by a :class:`RankReducer` fed as the rank's spans stream
by (:func:`reduce_file` reads a Kineto trace in a stream, never whole), in worker processes here or
on a Dask cluster (:mod:`~omniprof.analysis.crossrank.executor`); only those summaries meet, folded into a
:class:`Combiner` as they arrive. A summary's size follows the rank's steps and collectives, not
its events nor the number of ranks: per step and per collective one row of int64 columns, and per
kernel/op name (at most :data:`MAX_DURATION_NAMES`, the rest summed into one counted sketch) a
:class:`~omniprof.analysis.sketch.DurationSketch` whose median and p90 are exact up to 1,024
distinct durations and within 1 % past that. Everything else is exact.

Per rank (:class:`RankSummary`), over its profiled steps (its ``step`` spans, from the framework's
``ProfilerStep#N`` markers where several backends mark steps; else from its first to its last
classified event):

* **Temporal breakdown.** GPU kernels when the rank has any (``source="gpu"``), else CPU ops
  (``source="cpu"``). Communication: spans named like a collective (NCCL/RCCL kernels,
  ``gloo:``/``nccl:`` annotations, ``c10d::`` ops, ``record_param_comms``); memory: memcpy and
  memset (GPU only); compute: every other kernel (GPU) or CPU op. Each class is the union of its
  intervals on all streams/threads. The four shares partition the window:
  ``compute_ns + exposed_communication_ns + exposed_memory_ns + idle_ns == window_ns``, where
  "exposed" is the time not hidden under compute (nor, for memory, under communication).
* **Overlap:** ``overlap_ns`` is communication time during compute; ``overlap_pct`` its share of
  all communication time.
* **Idle causes:** CPU: idle is host time outside any op (Python code, data loading, sleeps). GPU:
  a gap before a kernel (a communication kernel too) whose launch (CUDA runtime call linked by a
  flow) began after the GPU went idle counts as waiting on the host; other gaps as waiting on
  synchronisation or dependencies.

Across ranks (:func:`combine`): collectives are matched by name and order of occurrence; in each,
a rank waited ``its duration - the shortest duration of that collective on any rank`` (the last
rank to arrive waits least; no clock alignment needed). A step's **own time** is its duration minus
that waiting. On the ranks' aligned clock, each collective's waiting is charged to the rank that
arrived last (started it last; ranks within their clocks' uncertainty of the last share it): the
**waiting caused** by each rank, in all, per step and per collective. A rank is a **straggler** when
it cost the others more than ``fair_share`` (1.5) times an even share of all the waiting caused and
at least ``min_caused_ns`` (1 ms) for each other rank on average; the report names it with what it
cost and where, and its own time beside the median rank's, its slowest ops and idle time there.

The package, one module per seam: :mod:`~.intervals` (interval algebra), :mod:`~.summary` (what a
rank reduces to), :mod:`~.reduce` (the per-rank reducer), :mod:`~.distribution` (duration
distributions across ranks), :mod:`~.combine` (the combiner and the straggler rule), :mod:`~.report`
(the report's data), :mod:`~.text` (the report as text), :mod:`~.pool` (each rank's file read and
reduced, in a process pool), :mod:`~.executor` (the same on Dask), :mod:`~.api` (the entry points).
Finding each rank's file is :mod:`omniprof.formats.rankdir`'s.

.. versionadded:: 0.2
"""

from omniprof.analysis.crossrank.api import analyze, analyze_dir, analyze_result, is_rank_dir
from omniprof.analysis.crossrank.combine import Combiner, combine
from omniprof.analysis.crossrank.distribution import DurationRow, RankDurations, duration_rows, duration_stats
from omniprof.analysis.crossrank.intervals import union
from omniprof.analysis.crossrank.pool import iter_reduce_local, reduce_file, reduce_local
from omniprof.analysis.crossrank.reduce import COMM_PATTERN, MAX_DURATION_NAMES, RankReducer, is_comm, reduce_rank
from omniprof.analysis.crossrank.report import CrossRankReport, Straggler, WaitCaused, WaitTable
from omniprof.analysis.crossrank.summary import CollectiveTable, RankSummary, StepRow, StepTable
from omniprof.analysis.crossrank.text import text_blocks
from omniprof.analysis.sketch import DurationSketch
from omniprof.formats.rankdir import load_kineto_dir, rank_inputs

__all__ = [
    "RankSummary", "StepRow", "StepTable", "CollectiveTable", "Straggler", "CrossRankReport", "RankReducer",
    "reduce_rank", "reduce_file", "reduce_local", "iter_reduce_local", "Combiner", "WaitTable", "WaitCaused",
    "DurationSketch",
    "rank_inputs", "combine", "analyze", "is_rank_dir", "MAX_DURATION_NAMES",
    "analyze_result", "analyze_dir", "is_comm", "union", "COMM_PATTERN", "text_blocks", "load_kineto_dir",
    "DurationRow", "RankDurations", "duration_stats", "duration_rows",
]
