"""Reporter ``html``: one self-contained HTML file -- flame graph, call tree, tables, losses.

Everything is inside the file (inline CSS, inline script, the data as JSON): it opens from disk
with no network. The flame graph is an icicle drawn by a small script: click a box to zoom into
it, click the top bar to zoom out, hover for the time and share; the search box highlights
matching functions. The call tree is nested ``<details>`` (no script needed), the flat list and
every derived table (op and kernel statistics, spans by total time) are plain tables, and the
run's errors and losses come first.

The stacks go through the same call tree and filters as the ``table`` reporter
(:mod:`omniprof.analysis.calltree`): per function, omniprof's own frames cut, idle hidden, recursion
folded in the tree (not in the flame graph, which shows stacks as sampled), threads as the flame
graph's first level.
"""

from __future__ import annotations

import html
import json
from typing import IO, Any

import attrs

from omniprof.analysis import calltree
from omniprof.core import validators as v
from omniprof.core.results import BackendResult, ProfileResult, Table
from omniprof.core.units import format_ns
from omniprof.plugin import Reporter
from omniprof.reporters.table import display_column, format_cell, span_rows

__all__ = ["HtmlReporter", "HtmlOptions", "flame_tree", "tree_json"]


@attrs.frozen(kw_only=True)
class HtmlOptions:
    """Options of the ``html`` reporter.

    Attributes:
        title: the page title (default: the backends and the run's start).
        max_rows: most rows per flat list and table.
        min_percent: call-tree nodes and flame-graph boxes under this share are left out.
        idle: ``"hide"`` (default) or ``"show"`` idle stacks (see the ``table`` reporter).
    """

    title: str | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str)))
    max_rows: int = attrs.field(default=100, validator=v.int_in_range(1))
    min_percent: float = attrs.field(default=0.1, validator=v.number_in_range(0.0, 100.0))
    idle: str = attrs.field(default="hide", validator=v.one_of("hide", "show"))


def flame_tree(part: BackendResult, *, min_share: float = 0.001, idle: str = "hide") -> dict[str, Any]:
    """The flame graph's data: ``{"n": name, "v": total_ns, "s": self_ns, "c": [children]}``,
    the root's children one per thread (when there are several)."""
    stacks, _ = calltree.report_stacks(part, idle=idle)
    groups = calltree.by_thread(part, stacks)

    def conv(top: calltree.Node, name: str, floor: float) -> dict[str, Any]:
        # Iterative: a stack is as deep as the program's recursion (thousands of frames).
        out: dict[str, Any] = {"n": name, "v": top.total, "s": top.self, "c": []}
        todo = [(top, out)]
        while todo:
            node, entry = todo.pop()
            for c in sorted(node.children.values(), key=lambda c: -c.total):
                if c.total >= floor:
                    kid = {"n": calltree.frame_label(c.frame, line=False), "v": c.total, "s": c.self,  # type: ignore[arg-type]
                           "c": []}
                    entry["c"].append(kid)
                    todo.append((c, kid))
        return out

    total = sum(s.weight for s in stacks)
    floor = min_share * total
    if len(groups) == 1:
        return conv(calltree.build_tree(stacks), "all", floor)
    root = {"n": "all", "v": total, "s": 0, "c": []}
    for g in groups:
        root["c"].append(conv(calltree.build_tree(g.stacks), f"thread {g.name}", floor))
    return root


def tree_json(root: dict[str, Any]) -> str:
    """The flame graph's data as JSON, written without recursion (``json.dumps`` stops at about a
    thousand levels: a 1,000-frame stack was a RecursionError)."""
    out: list[str] = []
    todo: list[Any] = [root]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        # the text json.dumps(root, ensure_ascii=True) gives
        out.append(f'{{"n": {json.dumps(item["n"], ensure_ascii=True)}, "v": {json.dumps(item["v"])}, '
                   f'"s": {json.dumps(item["s"])}, "c": [')
        todo.append("]}")
        kids = item["c"]
        for i in range(len(kids) - 1, -1, -1):
            todo.append(kids[i])
            if i:
                todo.append(", ")
    return "".join(out)


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.4em 0}td,th{padding:2px 10px;border-bottom:1px solid #eee;text-align:left}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.loss{color:#a40}.err{color:#b00;font-weight:bold}
#fg{position:relative;border:1px solid #ccc;overflow:hidden;font:12px monospace}
.fg-node{position:absolute;height:17px;box-sizing:border-box;border:1px solid #fff;overflow:hidden;white-space:nowrap;
 text-overflow:ellipsis;padding:0 3px;cursor:pointer;background:#f4a261}
.fg-node.hit{background:#7ac}
details{margin-left:1.2em}summary{cursor:pointer;font-family:monospace}summary .t{color:#555}
code{font-size:13px}
"""

_JS = r"""
(function(){
  var data = JSON.parse(document.getElementById('fg-data').textContent);
  var box = document.getElementById('fg'), info = document.getElementById('fg-info');
  var search = document.getElementById('fg-search');
  var H = 18;
  function fmt(ns){ if(ns>=1e9) return (ns/1e9).toFixed(3)+' s'; if(ns>=1e6) return (ns/1e6).toFixed(2)+' ms';
    if(ns>=1e3) return (ns/1e3).toFixed(2)+' us'; return ns+' ns'; }
  // No recursion: stacks are as deep as the program's (thousands of frames).
  function depth(n){ var d=0, todo=[[n,1]]; while(todo.length){ var t=todo.pop(); d=Math.max(d,t[1]);
    (t[0].c||[]).forEach(function(k){ todo.push([k,t[1]+1]); }); } return d; }
  function zoom(n, root){ return function(){ draw(n===root && n.parent ? n.parent : n); }; }
  function draw(root){
    box.innerHTML=''; box.style.height=(depth(root)*H+2)+'px';
    var total=root.v||1, q=(search.value||'').toLowerCase(), todo=[[root,0,0]];
    while(todo.length){
      var t=todo.pop(), n=t[0], x=t[1], d=t[2], w=n.v/total; if(w<=0) continue;
      var el=document.createElement('div'); el.className='fg-node'+(q && n.n.toLowerCase().indexOf(q)>=0?' hit':'');
      el.style.left=(x*100)+'%'; el.style.width=(w*100)+'%'; el.style.top=(d*H)+'px';
      el.textContent=n.n; el.title=n.n+'\n'+fmt(n.v)+' ('+(100*n.v/data.v).toFixed(1)+'% of all), self '+fmt(n.s);
      el.onclick=zoom(n, root);
      box.appendChild(el);
      var cx=x; (n.c||[]).forEach(function(k){ k.parent=n; todo.push([k, cx, d+1]); cx+=k.v/total; });
    }
    info.textContent = root===data ? 'click a box to zoom in' : 'zoomed into '+root.n+' ('+fmt(root.v)+'); click the top bar to zoom out';
  }
  search.oninput=function(){ draw(data); };
  draw(data);
})();
"""


def _table_html(header: list[str], rows: list[list[str]], numeric: list[bool]) -> str:
    out = ["<table><tr>" + "".join(f"<th class='{'n' if n else ''}'>{html.escape(h)}</th>"
                                   for h, n in zip(header, numeric)) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(f"<td class='{'n' if n else ''}'>{html.escape(c)}</td>"
                                    for c, n in zip(r, numeric)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


class HtmlReporter(Reporter):
    """One self-contained HTML page: flame graph, call tree, flat list, tables, losses."""

    name = "html"
    output = "file"
    default_filename = "omniprof.report.html"
    summary = "self-contained HTML: interactive flame graph, call tree, tables, losses (no network)"
    Options = HtmlOptions

    def report(self, result: ProfileResult, dest: IO[bytes]) -> None:  # type: ignore[override]
        dest.write(self.page(result).encode("utf-8"))

    def page(self, result: ProfileResult) -> str:
        opts = self.options
        md = result.metadata
        dur_ns = md.end_ns - md.start_ns if md.end_ns else 0
        title = opts.title or f"omniprof {', '.join(md.backends) or '-'}"
        body = [f"<h1>{html.escape(title)}</h1>",
                f"<p>{html.escape(', '.join(md.backends) or '-')} &middot; {format_ns(dur_ns)} &middot; host "
                f"{html.escape(md.host or '-')} pid {md.pid}{' &middot; <b>PARTIAL</b>' if result.partial else ''}</p>"]
        if result.errors or result.losses:
            body.append("<h2>Errors and losses</h2><ul>")
            body += [f"<li class='err'>{html.escape(f'{e.source} failed at {e.phase}: {e.what}')}</li>"
                     for e in result.errors]
            body += [f"<li class='loss'>{html.escape(f'{x.source}: {x.count} {x.unit} not recorded ({x.kind}) {x.detail}')}"
                     "</li>" for x in result.losses]
            body.append("</ul>")
        flame: dict[str, Any] | None = None
        for part in result.parts:
            body.append(f"<h2>Backend {html.escape(part.backend)}</h2>")
            if part.samples:
                if flame is None:
                    flame = flame_tree(part, min_share=opts.min_percent / 100.0, idle=opts.idle)
                    body.append("<h2>Flame graph</h2><p><input id='fg-search' placeholder='highlight functions'> "
                                "<span id='fg-info'></span></p><div id='fg'></div>")
                body += self._tree(part)
            body += self._spans(part)
            for table in part.tables:
                body += self._table(table)
        data = tree_json(flame or {"n": "all", "v": 0, "s": 0, "c": []}).replace("</", "<\\/")
        script = (f"<script type='application/json' id='fg-data'>{data}</script><script>{_JS}</script>"
                  if flame is not None else "")
        return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
                f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
                + "\n".join(body) + f"\n{script}</body></html>\n")

    def _tree(self, part: BackendResult) -> list[str]:
        opts = self.options
        stacks, idle_ns = calltree.report_stacks(part, idle=opts.idle)
        total = sum(s.weight for s in stacks) or 1
        root = calltree.build_tree(calltree.fold_recursion(stacks))
        rows = calltree.tree_rows(root, min_share=opts.min_percent / 100.0)
        out = ["<h2>Call tree</h2>"]
        if idle_ns:
            out.append(f"<p>Idle time left out: {format_ns(idle_ns)} (threads waiting).</p>")
        depth = -1
        for r in rows:
            while depth >= r.depth:
                out.append("</details>")
                depth -= 1
            label = html.escape(calltree.frame_label(r.frame, line=False))
            out.append(f"<details{' open' if r.depth < 3 else ''}><summary><span class='t'>"
                       f"{format_ns(r.total_ns)} {100.0 * r.total_ns / total:.1f}%</span> <code>{label}</code>"
                       f"</summary>")
            depth = r.depth
        out += ["</details>"] * (depth + 1)
        flat = calltree.flat_rows(stacks)[: opts.max_rows]
        out.append("<h2>Flat (by self time, per function)</h2>")
        out.append(_table_html(["self", "self %", "total", "total %", "function"],
                               [[format_ns(r.self_ns), f"{100.0 * r.self_ns / total:.1f}", format_ns(r.total_ns),
                                 f"{100.0 * r.total_ns / total:.1f}", calltree.frame_label(r.frame, line=False)]
                                for r in flat], [True, True, True, True, False]))
        return out

    def _spans(self, part: BackendResult) -> list[str]:
        rows = span_rows(part)[: self.options.max_rows]
        if not rows:
            return []
        return ["<h2>Spans by total time</h2>", _table_html(
            ["total", "count", "mean", "max", "category", "name"],
            [[format_ns(r.total_ns), str(r.count), format_ns(r.total_ns // r.count), format_ns(r.max_ns), r.category,
              r.name] for r in rows], [True, True, True, True, False, False])]

    def _table(self, table: Table) -> list[str]:
        shown = table.rows[: self.options.max_rows]
        numeric = [any(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in shown)
                   for i in range(len(table.columns))]
        return [f"<h2>{html.escape(table.title or table.name)}</h2>",
                _table_html([display_column(c) for c in table.columns],
                            [[format_cell(c, val) for c, val in zip(table.columns, row)] for row in shown], numeric)]
