"""torch's op table and the kernel table from a Kineto trace's columns (no object per event).

The same figures as :func:`omniprof.analysis.torch_ops.op_stats_table` and
:func:`omniprof.formats.kernels.kernel_stats_table` give from the full reader's spans, computed from
:class:`omniprof.formats.kineto_columns.KinetoColumns`: the spans torch's rule takes
(:data:`omniprof.analysis.nesting.TORCH`) are ordered per track with one numpy sort, nested in one
pass over plain integer arrays (the rule of :mod:`omniprof.analysis.nesting`: innermost open span
that holds the span whole; same-name only children folded), and the sums per row are numpy
reductions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omniprof.formats.kernels import KERNEL_STATS_COLUMNS, _dim, _uses_tensor_core, _whole
from omniprof.analysis.nesting import TORCH
from omniprof.analysis.nesting import _fold as _fold_spans
from omniprof.analysis.torch_ops import OP_STATS_COLUMNS, STEP_ROW
from omniprof.core.results import Table
from omniprof.formats.kineto_columns import KinetoColumns

__all__ = ["op_stats_from_columns", "kernel_stats_from_columns"]

_OPS = ("cpu_op", "annotation", "step")


def _nest(cols: KinetoColumns, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Nesting of the rows ``sel`` (torch's rule): (order, parent, owner, children_ns) over all rows."""
    n = len(cols)
    start = cols.start_ns[sel]
    end = start + cols.dur_ns[sel]
    # By track, then start, the longer first, then as given (nest()'s order; the track order is free).
    order = sel[np.lexsort((sel, -end, start, cols.track_id[sel]))]
    parent = np.full(n, -2, dtype=np.int64)
    owner = np.full(n, -2, dtype=np.int64)
    children_ns = np.zeros(n, dtype=np.int64)
    o_list = order.tolist()
    s_list = cols.start_ns[order].tolist()
    e_list = (cols.start_ns[order] + cols.dur_ns[order]).tolist()
    t_list = cols.track_id[order].tolist()
    par = [-1] * len(o_list)
    stack_end: list[int] = []
    stack_i: list[int] = []
    track = None
    for k, (i, st, en, tr) in enumerate(zip(o_list, s_list, e_list, t_list)):
        if tr != track:
            stack_end.clear()
            stack_i.clear()
            track = tr
        while stack_end and (st >= stack_end[-1] or en > stack_end[-1]):
            stack_end.pop()
            stack_i.pop()
        if stack_i:
            par[k] = stack_i[-1]
        stack_end.append(en)
        stack_i.append(i)
    parent[order] = par
    owner[order] = order
    _fold(cols, order, parent, owner)
    # Children after folding: counted spans, under the span their parent is counted in.
    counted = order[owner[order] == order]
    has_parent = counted[parent[counted] >= 0]
    up = owner[parent[has_parent]]
    np.add.at(children_ns, up, cols.dur_ns[has_parent])
    return order, parent, owner, children_ns


def _fold(cols: KinetoColumns, order: np.ndarray, parent: np.ndarray, owner: np.ndarray) -> None:
    """torch's ``_remove_dup_nodes`` (as :func:`omniprof.analysis.nesting._fold`), on arrays."""
    name = cols.name_id
    has = order[parent[order] >= 0]
    kids_n = np.bincount(parent[has], minlength=len(cols)) if len(has) else np.zeros(len(cols), dtype=np.int64)
    cand = has[(kids_n[parent[has]] == 1) & (name[parent[has]] == name[has])]
    if not len(cand):
        return
    children: dict[int, list[int]] = {}
    for c, p in zip(has.tolist(), parent[has].tolist()):
        children.setdefault(p, []).append(c)
    idx = order.tolist()
    nm = name.tolist()
    own = owner.tolist()
    _fold_spans(nm.__getitem__, idx, parent.tolist(), own, children)
    owner[order] = [own[i] for i in idx]


def _launcher(cols: KinetoColumns, parent: np.ndarray, owner: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per row (a runtime call), the counted op that made it: nearest ancestor of an op category."""
    is_op = cols.category_mask(*_OPS)
    out = parent[rows].copy()
    todo = out >= 0
    while True:
        live = np.nonzero(todo)[0]
        if not len(live):
            break
        p = out[live]
        stop = is_op[p]
        todo[live[stop]] = False
        nxt = parent[p[~stop]]
        out[live[~stop]] = nxt
        todo[live[~stop]] = nxt >= 0
    return np.where(out >= 0, owner[np.maximum(out, 0)], -1)


def _enclosing(cols: KinetoColumns, order: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Per ``[memory]`` event, the counted span holding it (innermost, start <= t < end), or -1."""
    out = np.full(len(cols.mem_t_ns), -1, dtype=np.int64)
    if not len(out):
        return out
    by_track: dict[int, list[int]] = {}
    for i in order.tolist():
        by_track.setdefault(int(cols.track_id[i]), []).append(i)
    starts, ends = cols.start_ns, cols.start_ns + cols.dur_ns
    for track in np.unique(cols.mem_track_id).tolist():
        ks = np.nonzero(cols.mem_track_id == track)[0]
        ks = ks[np.argsort(cols.mem_t_ns[ks], kind="stable")].tolist()
        idx = by_track.get(track, [])
        stack: list[int] = []
        j = 0
        for k in ks:
            t = int(cols.mem_t_ns[k])
            while j < len(idx) and starts[idx[j]] <= t:
                i = idx[j]
                while stack and (starts[i] >= ends[stack[-1]] or ends[i] > ends[stack[-1]]):
                    stack.pop()
                stack.append(i)
                j += 1
            while stack and ends[stack[-1]] <= t:
                stack.pop()
            out[k] = owner[stack[-1]] if stack else -1
    return out


def op_stats_from_columns(cols: KinetoColumns, *, has_memory: bool | None = None) -> Table | None:
    """The ``op_stats`` table (torch's ``key_averages()``) from a trace's columns: the figures
    :func:`omniprof.analysis.torch_ops.op_stats_table` gives from the same trace's spans."""
    cats = cols.category_mask(*TORCH.categories)  # type: ignore[arg-type]
    hidden = np.asarray([cols.names.index(h) for h in TORCH.hidden_names if h in cols.names], dtype=np.int32)
    sel = np.nonzero(cats & ~np.isin(cols.name_id, hidden))[0]
    is_op = cols.category_mask(*_OPS)
    if not is_op[sel].any():
        return None
    if has_memory is None:
        has_memory = bool(len(cols.mem_t_ns))
    order, parent, owner, children_ns = _nest(cols, sel)
    n = len(cols)
    dur = cols.dur_ns
    own_dev = np.zeros(n, dtype=np.int64)
    dev = cols.category_mask("kernel", "memcpy", "memset") & (cols.correlation >= 0)
    has_device = bool(dev.any())
    if has_device:
        corr_ids, inv = np.unique(cols.correlation[dev], return_inverse=True)
        by_corr = np.zeros(len(corr_ids), dtype=np.int64)
        np.add.at(by_corr, inv, dur[dev])
        rt = sel[cols.category_mask("runtime")[sel] & (cols.correlation[sel] >= 0)]
        pos = np.searchsorted(corr_ids, cols.correlation[rt])
        pos = np.minimum(pos, len(corr_ids) - 1)
        d = np.where(corr_ids[pos] == cols.correlation[rt], by_corr[pos], 0)
        rt, d = rt[d > 0], d[d > 0]
        op = _launcher(cols, parent, owner, rt)
        np.add.at(own_dev, op[op >= 0], d[op >= 0])
    # FLOPs: a folded re-dispatch's count where its op has none (the first in nesting order).
    flops = np.full(n, -1, dtype=np.int64)
    fl = order[cols.flops[order] >= 0]
    for i, f in zip(fl.tolist(), cols.flops[fl].tolist()):
        o = owner[i]
        if flops[o] < 0:
            flops[o] = f
    own_cm = np.zeros(n, dtype=np.int64)
    own_dm = np.zeros(n, dtype=np.int64)
    if len(cols.mem_t_ns):
        enc = _enclosing(cols, order, owner)
        ok = enc >= 0
        np.add.at(own_dm, enc[ok & cols.mem_on_device], cols.mem_bytes[ok & cols.mem_on_device])
        np.add.at(own_cm, enc[ok & ~cols.mem_on_device], cols.mem_bytes[ok & ~cols.mem_on_device])
    counted = order[owner[order] == order]
    tot_dev, tot_cm, tot_dm = own_dev.copy(), own_cm.copy(), own_dm.copy()
    # Children before their parents: deepest first (depth by the counted parent chain).
    up = np.where(parent[counted] >= 0, owner[np.maximum(parent[counted], 0)], -1)
    up_all = np.full(n, -1, dtype=np.int64)
    up_all[counted] = up
    depth = np.zeros(n, dtype=np.int64)
    cur = counted[up >= 0]
    p = up_all[cur]
    d = 1
    while len(cur):
        depth[cur] = d
        keep = up_all[p] >= 0
        cur, p = cur[keep], up_all[p[keep]]
        d += 1
    for lvl in range(int(depth.max()) if n else 0, 0, -1):
        at = counted[depth[counted] == lvl]
        q = up_all[at]
        np.add.at(tot_dev, q, tot_dev[at])
        np.add.at(tot_cm, q, tot_cm[at])
        np.add.at(tot_dm, q, tot_dm[at])
    # Rows by name (every ProfilerStep#N is one row), in order of first appearance.
    step = cols.categories.index("step") if "step" in cols.categories else -1
    key = np.where(cols.category_id[counted] == step, -1, cols.name_id[counted])
    uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
    m = len(uniq)

    def total(values: np.ndarray) -> list[int]:
        acc = np.zeros(m, dtype=np.int64)
        np.add.at(acc, inv, values)
        return acc.tolist()

    calls = np.bincount(inv, minlength=m).tolist()
    tot = total(dur[counted])
    self_ns = total(dur[counted] - children_ns[counted])
    f_c = flops[counted]
    f_sum = total(np.maximum(f_c, 0))
    f_any = (np.bincount(inv, weights=(f_c >= 0), minlength=m) > 0).tolist()
    sums = [total(a[counted]) for a in (tot_dev, own_dev, tot_cm, own_cm, tot_dm, own_dm)]
    out = []
    for r, k in enumerate(uniq.tolist()):
        name = STEP_ROW if k == -1 else cols.names[k]
        out.append((name, calls[r], tot[r], self_ns[r], tot[r] // calls[r],
                    sums[0][r] if has_device else None, sums[1][r] if has_device else None,
                    f_sum[r] if f_any[r] else None,
                    *((sums[2][r], sums[3][r], sums[4][r], sums[5][r]) if has_memory else (None,) * 4)))
    out.sort(key=lambda r: (-r[2], r[0]))
    return Table("op_stats", OP_STATS_COLUMNS, out, title="Op statistics (torch key_averages)")


def kernel_stats_from_columns(cols: KinetoColumns) -> Table | None:
    """The ``kernel_stats`` table from a trace's columns (:func:`omniprof.formats.kernels.kernel_stats`'s figures)."""
    k = np.nonzero(cols.category_mask("kernel"))[0]
    if not len(k):
        return None
    cfg: list[tuple[str, str, int]] = []
    for block, grid, smem in cols.kernel_configs:
        cfg.append((_dim(block), _dim(grid), _whole(smem) or 0))
    # Group by (name, block, grid, shared memory): configurations that print alike are one group.
    canon: dict[tuple[str, str, int], int] = {}
    cfg_id = np.asarray([canon.setdefault(c, len(canon)) for c in cfg], dtype=np.int64)
    g = cols.name_id[k].astype(np.int64) * max(len(canon), 1) + cfg_id[cols.kernel_config[k]]
    uniq, first, inv = np.unique(g, return_index=True, return_inverse=True)
    m = len(uniq)
    dur = cols.dur_ns[k]
    cnt = np.bincount(inv, minlength=m)
    tot = np.zeros(m, dtype=np.int64)
    np.add.at(tot, inv, dur)
    mn = np.full(m, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(mn, inv, dur)
    mx = np.zeros(m, dtype=np.int64)
    np.maximum.at(mx, inv, dur)
    occ = cols.occupancy_pct[k]
    has = ~np.isnan(occ)
    occ_n = np.zeros(m, dtype=np.int64)
    np.add.at(occ_n, inv[has], dur[has])
    occ_sum = np.zeros(m)
    for r, o, d in zip(inv[has].tolist(), occ[has].tolist(), dur[has].tolist()):
        occ_sum[r] += o * d  # in file order, as the span loop adds them
    canon_list = list(canon)
    rows: list[dict[str, Any]] = []
    for r in np.argsort(first, kind="stable").tolist():  # first appearance, as the span loop meets them
        key = int(uniq[r])
        name = cols.names[key // max(len(canon), 1)]
        block, grid, smem = canon_list[key % max(len(canon), 1)]
        rows.append({"kernel_name": name, "occurrences": int(cnt[r]), "total_ns": int(tot[r]),
                     "avg_ns": int(tot[r]) // int(cnt[r]), "min_ns": int(mn[r]), "max_ns": int(mx[r]),
                     "static_shared_memory_bytes": smem, "block_dim": block, "grid_dim": grid,
                     "tensor_core": _uses_tensor_core(name, {}),
                     "occupancy_pct": round(float(occ_sum[r]) / int(occ_n[r]), 2) if occ_n[r] else None})
    rows.sort(key=lambda r: (-r["total_ns"], r["kernel_name"]))
    return Table("kernel_stats", KERNEL_STATS_COLUMNS, [tuple(r[c] for c in KERNEL_STATS_COLUMNS) for r in rows],
                 title="Kernel statistics")
