"""The one column vocabulary of op-statistics tables (``op_stats`` and its grouped forms).

Every backend that builds an op table (torch/Kineto in :mod:`omniprof.analysis.torch_ops`, XLA in
:mod:`omniprof.formats.xplane`) names its columns from :data:`COLUMNS`, each with its unit in the
name; a backend fills the columns it has data for, in :data:`COLUMNS` order, and leaves the others
out. ``omniprof diff`` compares op tables by :data:`KEY_COLUMNS` and :data:`TIME_COLUMN` alone.

Results saved before this vocabulary (torch's ``total_cpu_ns`` / ``self_cpu_ns`` ..., XLA's
``occurrences`` / ``total_self_ns`` ...) are renamed on load by :func:`upgrade_columns`, so old
files read, report and diff like new ones. It lives in ``core`` because loading a result
(:func:`omniprof.core.results.load`) must apply it.

>>> upgrade_columns("op_stats", ("operation", "occurrences", "total_ns", "total_self_ns"))
('operation', 'occurrences', 'total_ns', 'total_self_ns')
>>> upgrade_columns("op_stats", LEGACY_TORCH)[:4]
('name', 'calls', 'total_ns', 'self_ns')
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["COLUMNS", "KEY_COLUMNS", "TIME_COLUMN", "OP_TABLES", "LEGACY_TORCH", "LEGACY_XLA", "LEGACY_ROOFLINE",
           "ROOFLINE_COLUMNS", "columns",
           "upgrade_columns", "is_op_table"]

#: column -> what it holds. Times are integer ns, memory integer bytes; None in a cell is "unknown"
#: (e.g. device columns of a run without GPU work), never 0.
COLUMNS: dict[str, str] = {
    "name": "the op, annotation or Python function (torch), or the HLO op (XLA)",
    "input_shapes": "grouping key: the op's input shapes, as JSON (torch's group_by_input_shape)",
    "stack": "grouping key: the top frames of the Python stack, innermost first, as JSON (torch's group_by_stack_n)",
    "op_type": "the op's category (XLA: convolution, fusion, ...)",
    "runs_on": "where the op's own time is spent: 'Host' or 'Device' (XLA)",
    "hlo_module": "the XLA module the op belongs to",
    "calls": "how many times it ran",
    "total_ns": "inclusive time where the op runs (host ops: CPU wall time; device ops: device time), children included",
    "self_ns": "total_ns minus the time of the op's children (what the op itself spent)",
    "avg_ns": "total_ns / calls",
    "avg_self_ns": "self_ns / calls",
    "self_share_pct": "self_ns as a percent of the table's self time",
    "device_total_ns": "GPU time of the work (kernels, memcpy, memset) launched inside the op, children included",
    "device_self_ns": "GPU time of the work the op launched itself",
    "flops": "floating-point operations counted for the op",
    "flops_per_s": "flops / self time",
    "memory_bandwidth_bytes_per_s": "bytes accessed / self time",
    "operational_intensity_flops_per_byte": "flops / bytes accessed (the roofline's x axis)",
    "bound_by": "what limits the op (XLA's roofline: 'Compute', 'HBM', ...)",
    "cpu_memory_total_bytes": "CPU memory allocated minus freed inside the op, children included",
    "cpu_memory_self_bytes": "CPU memory allocated minus freed by the op itself",
    "device_memory_total_bytes": "device memory allocated minus freed inside the op, children included",
    "device_memory_self_bytes": "device memory allocated minus freed by the op itself",
}

#: The columns that identify a row (those present in a table, in this order, form its key).
KEY_COLUMNS = ("name", "input_shapes", "stack", "hlo_module")
#: The time ``diff`` compares: self time (an op's total also holds its children's, so summing totals
#: counts nested time several times).
TIME_COLUMN = "self_ns"
#: Table names of op tables (the grouped forms add key columns after ``name``; ``roofline`` is XLA's
#: per-op roofline, from xprof).
OP_TABLES = ("op_stats", "op_stats_by_input_shape", "op_stats_by_stack", "op_stats_by_input_shape_and_stack",
             "roofline")

# Column sets written before the vocabulary, exactly as saved, and their new names.
LEGACY_TORCH = ("name", "calls", "total_cpu_ns", "self_cpu_ns", "avg_cpu_ns", "total_device_ns", "self_device_ns",
                "flops", "total_cpu_memory_bytes", "self_cpu_memory_bytes", "total_device_memory_bytes",
                "self_device_memory_bytes")
_TORCH_NEW = ("name", "calls", "total_ns", "self_ns", "avg_ns", "device_total_ns", "device_self_ns", "flops",
              "cpu_memory_total_bytes", "cpu_memory_self_bytes", "device_memory_total_bytes",
              "device_memory_self_bytes")
LEGACY_XLA = ("operation", "type", "host_or_device", "occurrences", "total_ns", "total_self_ns", "avg_self_ns",
              "device_pct", "memory_bw_bytes_per_s", "flop_rate_per_s", "bound_by", "hlo_module")
_XLA_NEW = ("name", "op_type", "runs_on", "calls", "total_ns", "self_ns", "avg_self_ns", "self_share_pct",
            "memory_bandwidth_bytes_per_s", "flops_per_s", "bound_by", "hlo_module")
LEGACY_ROOFLINE = ("operation", "category", "occurrences", "total_self_ns", "flop_rate_per_s", "memory_bw_bytes_per_s",
                   "operational_intensity_flops_per_byte", "bound_by")
ROOFLINE_COLUMNS = ("name", "op_type", "calls", "self_ns", "flops_per_s", "memory_bandwidth_bytes_per_s",
                    "operational_intensity_flops_per_byte", "bound_by")
_LEGACY: dict[tuple[str, ...], tuple[str, ...]] = {
    LEGACY_ROOFLINE: ROOFLINE_COLUMNS,
    LEGACY_TORCH: _TORCH_NEW,
    (LEGACY_TORCH[0], "input_shapes", *LEGACY_TORCH[1:]): (_TORCH_NEW[0], "input_shapes", *_TORCH_NEW[1:]),
    LEGACY_XLA: _XLA_NEW,
}


def columns(*names: str) -> tuple[str, ...]:
    """``names`` checked against the vocabulary, in the vocabulary's order (what a builder calls).

    >>> columns("self_ns", "name", "calls")
    ('name', 'calls', 'self_ns')
    """
    unknown = [n for n in names if n not in COLUMNS]
    if unknown:
        raise ValueError(f"not op-table vocabulary: {', '.join(unknown)} (see omniprof.core.opstats.COLUMNS)")
    order = list(COLUMNS)
    return tuple(sorted(set(names), key=order.index))


def is_op_table(name: str, cols: Sequence[str]) -> bool:
    """Whether a table is an op table in the vocabulary (its name, and ``name`` + ``self_ns`` columns)."""
    return name in OP_TABLES and "name" in cols and TIME_COLUMN in cols


def upgrade_columns(name: str, cols: Sequence[str]) -> tuple[str, ...]:
    """The vocabulary's names for an op table saved with an older column set; other tables unchanged.

    Only the exact column sets omniprof wrote are renamed, so a third-party table that happens to be
    called ``op_stats`` keeps its columns.
    """
    cols = tuple(cols)
    if name in OP_TABLES:
        return _LEGACY.get(cols, cols)
    return cols
