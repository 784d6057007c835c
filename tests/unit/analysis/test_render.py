"""The one table renderer fitted to a width: constant columns go before names are cut, names are
cut where rows share their letters and never until two rows look the same, a name and its place
are cut apart, numbers are never cut. Checked on the rendered lines at 80, 100 and 120 columns
against the cells the tables were built from."""

from __future__ import annotations

import re

import pytest

from omniprof.analysis.render import Column, Labeled, render_table
from omniprof.core.results import BackendResult, ProfileResult, Table
from omniprof.formats.xplane import OP_STATS_COLUMNS
from omniprof.reporters.table import TableOptions, TableReporter

WIDTHS = [80, 100, 120]

# 30 GPU kernel names that differ only deep inside (tile shape, stages, alignment), as cuBLAS and
# CUTLASS name theirs.
KERNELS = [f"void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_{m}x{n}_{k}x{s}_nn_align{a}>(cutlass::gemm::kernel::GemmUniversal::Params)"
           for m, n in ((64, 64), (128, 64), (128, 128), (256, 128), (256, 64))
           for k, s in ((16, 3), (32, 5), (64, 4)) for a in (4, 8)]


def _kernel_rows() -> list[list[str]]:
    return [[f"{(i * 37) % 97 + 0.25:.2f} ms", str(1000 + i * 13), "Device", f"{i * 3.3:.1f}%", name]
            for i, name in enumerate(KERNELS)]


KERNEL_COLUMNS = [Column("total", kind="num"), Column("calls", kind="num"), Column("runs_on", kind="label"),
                  Column("share", kind="num"), Column("kernel", min_width=24)]


def _is_cut_from(shown: str, full: str) -> bool:
    """Whether ``shown`` is ``full``, or ``full`` with runs of characters replaced by ``…`` (the
    pieces left in order, from its start to its end)."""
    if "…" not in shown:
        return shown == full
    pieces = shown.split("…")
    return re.fullmatch(".+".join(re.escape(p) for p in pieces), full, re.S) is not None


def _body(text: str) -> tuple[list[str], list[str], list[str]]:
    """The header line, the row lines and the notes under the table."""
    lines = text.splitlines()
    rows = [ln for ln in lines[2:] if not ln.startswith("  (")]
    notes = [ln for ln in lines[2:] if ln.startswith("  (") or ln.startswith("   ")]
    return lines[0].split(), rows, notes


@pytest.mark.parametrize("width", WIDTHS)
def test_kernel_names_stay_distinguishable_and_constant_column_goes_first(width):
    """30 kernel names at 80/100/120 columns: every line fits, every name is a cut of its own
    kernel, no two rows look the same, the figures are whole, and ``runs_on`` (Device in every
    row) is left out and named under the table before any name is cut."""
    rows = _kernel_rows()
    text = render_table(KERNEL_COLUMNS, rows, width=width)
    header, lines, _ = _body(text)
    assert all(len(ln) <= width for ln in text.splitlines()), text
    assert "runs_on" not in header and "(same in every row: runs_on = Device)" in text, text
    assert len(lines) == len(rows)
    shown = []
    for ln, row in zip(lines, rows):
        total, calls, share = row[0], row[1], row[3]
        m = re.match(r"^\s*(\d+\.\d\d ms)\s+(\d+)\s+(\d+\.\d%)\s+(\S.*)$", ln)
        assert m, f"a row with a cut figure: {ln!r}"
        assert (m.group(1), m.group(2), m.group(3)) == (total, calls, share)
        assert _is_cut_from(m.group(4), row[4]), (m.group(4), row[4])
        shown.append(m.group(4))
    assert len(set(shown)) == len(KERNELS), "two different kernels look the same:\n" + text


def test_kernel_names_get_more_room_on_a_wider_terminal():
    """The name column never narrows as the terminal widens (today: 43 characters at 100 but 30 at 120)."""
    seen = []
    for width in WIDTHS:
        _, lines, _ = _body(render_table(KERNEL_COLUMNS, _kernel_rows(), width=width))
        seen.append(max(len(re.match(r"^\s*\S+ ms\s+\d+\s+\S+%\s+(\S.*)$", ln).group(1)) for ln in lines))
    assert seen == sorted(seen), seen


def test_constant_column_kept_when_the_table_fits():
    """Piped (no width), nothing is cut and no column is left out, constant or not."""
    text = render_table(KERNEL_COLUMNS, _kernel_rows(), width=None)
    assert text.splitlines()[0].split() == ["total", "calls", "runs_on", "share", "kernel"]
    assert all(name in text for name in KERNELS) and "same in every row" not in text


@pytest.mark.parametrize("width", WIDTHS)
def test_name_and_place_are_cut_apart(width):
    """A long name and its file are cut each on its own side of the gap: the file keeps its
    name and line (``…hot_loop.py:21``), the name its start and end; never one cut across both."""
    names = [f"warm_function.<locals>.{'very_' * 6}nested_helper_number_{i}" for i in range(6)]
    where = "/home/someone/projects/omniprof-examples/examples/hot_loop.py"
    rows = [[f"{i + 1}.00 ms", f"{10 + i}.0", Labeled(n, f"{where}:{20 + i}")] for i, n in enumerate(names)]
    text = render_table([Column("self", kind="num"), Column("%", kind="num"), Column("function", min_width=30)],
                        rows, width=width)
    _, lines, _ = _body(text)
    assert all(len(ln) <= width for ln in text.splitlines()), text
    labels = []
    for ln, (t, pct, cell) in zip(lines, rows):
        m = re.match(rf"^\s*{re.escape(t)}\s+{re.escape(pct)}\s+(\S.*)$", ln)
        assert m, ln
        name, sep, place = m.group(1).rpartition("  ")
        assert sep, f"name and place run together: {m.group(1)!r}"
        assert _is_cut_from(name, cell.name) and _is_cut_from(place, cell.where), m.group(1)
        assert place.endswith(f"hot_loop.py:{cell.where.rsplit(':', 1)[1]}"), place
        labels.append(name)
    assert len(set(labels)) == len(names), text


@pytest.mark.parametrize("width", WIDTHS)
def test_paths_keep_their_file_name(width):
    """A path column (``cut="start"``) keeps its end, the file name and line whole, never
    ``/tmp/ne…py:5``."""
    paths = [f"/tmp/newproject/{'deeply/' * 8}pkg/alloc_sites_{k}.py:{5 + k}" for k in range(3)]
    rows = [[f"deep_function_name_{'x' * 30}_{k}", p, f"{k + 1}.0 MiB", str(100 * k)] for k, p in enumerate(paths)]
    cols = [Column("function", min_width=24), Column("location", min_width=12, cut="start"),
            Column("allocated", kind="num"), Column("allocations", kind="num")]
    text = render_table(cols, rows, width=width)
    assert all(len(ln) <= width for ln in text.splitlines()), text
    _, lines, _ = _body(text)
    for ln, (_, p, size, count) in zip(lines, rows):
        base = p.rsplit("/", 1)[1]
        assert re.search(rf"\s(…?\S*{re.escape(base)})\s+{re.escape(size)}\s+{count}$", ln), ln


@pytest.mark.parametrize("width", [30, 50])
def test_numbers_are_never_cut(width):
    """When even the narrowest layout cannot fit, the line runs long rather than cut a figure."""
    rows = [["12,345,678.9 ms", "99.99%", "1,234,567", "some_function_name"]] * 2 + \
        [["1.0 ms", "0.01%", "1", "another_function_name"]]
    cols = [Column("time", kind="num"), Column("%", kind="num"), Column("count", kind="num"), Column("name")]
    _, lines, _ = _body(render_table(cols, rows, width=width))
    for ln, row in zip(lines, rows):
        assert re.match(rf"^\s*{re.escape(row[0])}\s+{re.escape(row[1])}\s+{re.escape(row[2])}\s", ln), ln


def _xla_op_result() -> ProfileResult:
    """An XLA op table as the xla backend writes it: the same fused op names in two modules, every
    op's time on the device."""
    rows = []
    for module in ("jit_train_step", "jit_eval_step"):
        for k, (name, kind) in enumerate((("fusion.12", "fusion"), ("dot.3", "dot"),
                                          ("convert_element_type.4", "convert"), ("reduce.7", "reduce"))):
            ns = (k + 1) * 125_000 + (7_000 if module == "jit_eval_step" else 0)
            rows.append((name, kind, "Device", module, 10, ns * 10, ns * 10, ns, 12.5 * (4 - k), 3.2e12, 4.1e11,
                         "Memory"))
    cols = tuple(OP_STATS_COLUMNS)
    by_name = {c: i for i, c in enumerate(("name", "op_type", "runs_on", "hlo_module", "calls", "total_ns",
                                             "self_ns", "avg_self_ns", "self_share_pct", "flops_per_s",
                                             "memory_bandwidth_bytes_per_s", "bound_by"))}
    table = Table("op_stats", cols, [tuple(r[by_name[c]] for c in cols) for r in rows], title="XLA ops")
    return ProfileResult(parts=(BackendResult("xla", tables=(table,)),))


def test_xla_op_table_at_80_keeps_hlo_module_and_drops_constant_runs_on():
    """At 80 columns the op table keeps ``hlo_module`` (it tells the two ``fusion.12`` apart) and
    leaves out ``runs_on`` (Device in every row), named under the table; no two rows look the same."""
    text = TableReporter(TableOptions(color="never", width=80)).render(_xla_op_result())
    block = text[text.index("XLA ops"):].splitlines()
    header = block[1].split()
    assert "hlo_module" in header and "runs_on" not in header, text
    assert "runs_on = Device" in text
    rows = [ln for ln in block[3:] if ln.strip() and not ln.startswith("  (")][:8]
    assert len(set(rows)) == 8 and all(len(ln) <= 80 for ln in text.splitlines()), text
