"""The compile report as one static HTML page (kiln.report, KILN_TRACE_DIR, `kiln report`).

`render(trace)` turns kiln.tracing's record into a self-contained page: inline CSS, no server, no network,
a few lines of inline script only to open a folded section a link points into. Sections, each linked from
the top: a summary; graph breaks (reason, file:line, the source line, the hint, links to the capture and
its graph); recompiles (the guard that failed) and capture errors; captures (frame, time, the graph as
runnable Python with the user's source lines as comments, guards and symbolic sizes folded); compiles
(each pass with its time as a bar, each kernel with the user lines fused into it, the generated code
folded); kiln.profile reports; the counters. Everything from user code is escaped; long graphs, guard lists
and sources are cut with a note.
"""
from __future__ import annotations

import html
import linecache
import os
import re
import sys
import time
from typing import Any

from .counters import counters

GRAPH_LIMIT = 30_000  # characters of each graph's printed code
GUARD_LIMIT = 200  # guards listed per capture
MAX_CAPTURES = 300  # captures shown (the rest counted)

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:0 16px 40px;color:#1b1b1b}
h1{font-size:22px;margin:18px 0 4px}h2{font-size:18px;border-bottom:2px solid #ddd;margin-top:28px}
h3{font-size:15px;margin:16px 0 4px}nav a{margin-right:12px}.meta{color:#666;font-size:12px}
table{border-collapse:collapse;margin:6px 0;font-size:13px}td,th{border:1px solid #ddd;padding:2px 6px;
text-align:left;vertical-align:top}th{background:#f4f4f4}pre{background:#f7f7f7;padding:6px;overflow-x:auto;
font-size:12px;margin:4px 0}details{margin:4px 0}summary{cursor:pointer;color:#2456a5}
.card{border:1px solid #ddd;border-radius:4px;padding:6px 10px;margin:8px 0}.brk{border-left:4px solid #c33}
.hint{color:#236b2a}.bad{color:#b22}.bar{background:#6a9be0;height:10px;display:inline-block}
.num{text-align:right;font-variant-numeric:tabular-nums}:target{outline:3px solid #f2b705}code{font-size:12px}
"""
# a link into folded sections opens them (a <details> does not open itself on a fragment everywhere)
_SCRIPT = """
function kilnOpen(){var t=document.getElementById(location.hash.slice(1));
for(var e=t;e;e=e.parentElement){if(e.tagName==='DETAILS')e.open=true}}
window.addEventListener('hashchange',kilnOpen);
window.addEventListener('load',function(){if(location.hash)kilnOpen()});
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def with_source(origin: str) -> str:
    """`file:line: the source line` for an origin `file:line` (the line read from the file)."""
    match = re.match(r"^(.*):(\d+)$", origin)
    if match is None:
        return origin
    text = linecache.getline(match.group(1), int(match.group(2))).strip()
    return f"{short_path(match.group(1))}:{match.group(2)}: {text}" if text else origin


def short_path(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return relative if not relative.startswith("..") else path


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters (at a line end) and a note of what was cut."""
    if len(text) <= limit:
        return text
    head = text[:limit].rsplit("\n", 1)[0]
    return f"{head}\n# ... cut here: {len(text) - len(head)} more characters (KILN_DEBUG_DIR keeps it all)"


def _folded(summary: str, body: str, anchor: str | None = None) -> str:
    ident = f' id="{anchor}"' if anchor else ""
    return f"<details{ident}><summary>{summary}</summary>{body}</details>"


def _pre(text: str) -> str:
    return f"<pre>{esc(text)}</pre>"


def _table(header: list[str], rows: list[list[str]], numeric: tuple[int, ...] = ()) -> str:
    """A table whose cells are already HTML."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render(trace: Any) -> str:
    """The whole page for a `kiln.tracing.Trace`."""
    captures = trace.captures
    shown = captures[:MAX_CAPTURES]
    breaks = [(i, e) for i, e in enumerate(shown) if e.brk is not None]
    owners = {id(r): trace.capture_of(r) for r in trace.compiles}
    compiles_of: dict[int, list[int]] = {}
    for k, record in enumerate(trace.compiles):
        if owners[id(record)] is not None:
            compiles_of.setdefault(owners[id(record)], []).append(k)
    sections = [
        ("summary", "Summary", _summary(trace, breaks)),
        ("breaks", f"Graph breaks ({len(breaks)})", _breaks(breaks)),
        ("recompiles", "Recompiles and errors", _recompiles(trace)),
        ("captures", f"Captures ({len(captures)})", _captures(trace, shown, compiles_of)),
        ("compiles", f"Compiles ({len(trace.compiles)})", _compiles(trace, owners)),
        ("profiles", f"Profiles ({len(trace.profiles)})", _profiles(trace.profiles)),
        ("counters", "Counters", _counters()),
    ]
    nav = "".join(f'<a href="#{ident}">{esc(title)}</a>' for ident, title, _ in sections)
    body = "".join(f'<h2 id="{ident}">{esc(title)}</h2>{content}' for ident, title, content in sections)
    command = " ".join(sys.argv) or "(interactive)"
    meta = (f"process {os.getpid()} · {esc(command)} · written {time.strftime('%Y-%m-%d %H:%M:%S')} · "
            f"{esc(_versions())}")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>kiln compile report '
            f'{os.getpid()}</title><style>{_STYLE}</style><script>{_SCRIPT}</script></head><body>'
            f'<h1>kiln compile report</h1><div class="meta">{meta}</div><nav>{nav}</nav>{body}'
            '</body></html>\n')


def _versions() -> str:
    from .cli import version_text
    return version_text()


def _summary(trace: Any, breaks: list) -> str:
    graphs = sum(1 for e in trace.captures if e.graph is not None and e.ops)
    kernels = sum(1 for r in trace.compiles for k in r.kernels if k.kind == "kernel")
    recompiles = sum(counters["recompiles"].values())
    rows = [["captures", str(len(trace.captures))], ["graphs", str(graphs)],
            ["graph breaks", f'<a href="#breaks">{len(breaks)}</a>'],
            ["recompiles", f'<a href="#recompiles">{recompiles}</a>'],
            ["capture errors", str(len(trace.capture_errors))],
            ["compiles (pipeline runs)", f'<a href="#compiles">{len(trace.compiles)}</a>'],
            ["kernels", str(kernels)],
            ["capture time", f"{sum(e.capture_ms for e in trace.captures):.1f} ms"],
            ["pass time", f"{sum(r.total_ms for r in trace.compiles):.1f} ms"]]
    note = ""
    if not any(r.lines_known for r in trace.compiles if not r.profiling) and trace.compiles:
        note = ('<p class="meta">Kernels list their user lines when the process runs with KILN_TRACE_DIR set '
                '(or `kiln report script.py`).</p>')
    return _table(["what", "count"], rows, numeric=(1,)) + note


def _frame(entry: Any) -> str:
    path, line = entry.where
    return f"{entry.name} ({short_path(path)}:{line})" if path else entry.name


def _breaks(breaks: list) -> str:
    if not breaks:
        return "<p>None: every captured frame ran as whole graphs.</p>"
    out = []
    for n, (i, entry) in enumerate(breaks):
        brk = entry.brk
        fate = "resumed after it (the rest is a resume function)" if brk.resumed else \
            f"the frame runs natively: {esc(brk.native_frame or '')}"
        graph = f' · <a href="#graph-{i}">its graph</a>' if entry.graph is not None and entry.ops else ""
        parts = [f"<b>break {n + 1}</b> in <a href=\"#capture-{i}\">capture {i}: {esc(_frame(entry))}</a>"
                 f"{graph}", f"<div><code>{esc(short_path(brk.filename or ''))}:{esc(brk.lineno)}</code>: "
                 f"<b>{esc(brk.reason)}</b></div>"]
        if brk.source_line:
            parts.append(_pre(brk.source_line))
        if brk.hint:
            parts.append(f'<div class="hint">hint: {esc(brk.hint)}</div>')
        parts.append(f'<div class="meta">{fate}</div>')
        out.append(f'<div class="card brk" id="break-{n + 1}">{"".join(parts)}</div>')
    return "".join(out)


def _recompiles(trace: Any) -> str:
    rows = [[esc(key), str(count)] for key, count in counters["recompiles"].items()]
    out = [_table(["frame: the guard that failed", "times"], rows, numeric=(1,)) if rows
           else "<p>No recompiles.</p>"]
    for key, count in counters["recompile_limit"].items():
        out.append(f'<p class="bad">{esc(key)} reached the recompile limit ({count}x): it runs eagerly</p>')
    for error in trace.capture_errors:
        where = f" at {esc(error.location)}: <code>{esc(error.source_line)}</code>" if error.lineno else ""
        out.append(f'<p class="bad">capture error: {esc(error.frame)} runs eagerly: {esc(error.error)}'
                   f"{where}</p>")
    return "".join(out)


def _captures(trace: Any, shown: list, compiles_of: dict[int, list[int]]) -> str:
    out = []
    index = {id(e): i for i, e in enumerate(shown)}
    for i, entry in enumerate(shown):
        facts = [f"{entry.capture_ms:.1f} ms", f"{sum(entry.ops.values())} ops",
                 f"{sum(len(g.items()) if hasattr(g, 'items') else 1 for g in entry.guards)} guards"]
        links = []
        if entry.brk is not None:
            n = 1 + sum(1 for e in shown[:i] if e.brk is not None)
            links.append(f'<a href="#break-{n}">break {n}: {esc(entry.brk.reason[:80])}</a>')
        for child in entry.children:
            for sub in getattr(getattr(child, "cache", None), "entries", ()):
                if id(sub) in index:
                    links.append(f'continues in <a href="#capture-{index[id(sub)]}">capture '
                                 f'{index[id(sub)]}: {esc(sub.name)}</a>')
        for k in compiles_of.get(i, ()):
            links.append(f'compiled: <a href="#compile-{k}">{esc(trace.compiles[k].pipeline)}</a>')
        parts = [f"<h3>capture {i}: {esc(_frame(entry))}</h3>",
                 f'<div class="meta">{" · ".join(facts)}</div>']
        parts += [f"<div>{link}</div>" for link in links]
        if entry.graph is not None and entry.ops:
            code = entry.graph.python_code(f"graph of {entry.name}", True)[0]
            top = ", ".join(f"{k} x{v}" for k, v in sorted(entry.ops.items(), key=lambda kv: -kv[1])[:6])
            parts.append(_folded(f"graph {esc(entry.graph.name)}: {esc(top)}",
                                 _pre(cut(code, GRAPH_LIMIT)), f"graph-{i}"))
        elif entry.brk is not None:
            parts.append('<div class="meta">no graph (the frame runs natively or the break came first)</div>')
        # (a bulk guard lists its facts one per line: kiln.capture.guards.BulkText)
        every = [line for g in entry.guards for line in (g.items() if hasattr(g, "items") else [g])]
        guards = every[:GUARD_LIMIT]
        more = f"\n... and {len(every) - len(guards)} more" if len(every) > len(guards) else ""
        parts.append(_folded(f"guards ({len(every)})", _pre("\n".join(guards) + more)))
        if entry.symbols:
            parts.append(_folded(f"symbolic sizes ({len(entry.symbols)})", _pre("\n".join(entry.symbols))))
        out.append(f'<div class="card" id="capture-{i}">{"".join(parts)}</div>')
    if len(trace.captures) > len(shown):
        out.append(f"<p>... and {len(trace.captures) - len(shown)} more captures, not shown</p>")
    return "".join(out) or "<p>Nothing was captured.</p>"


def _compiles(trace: Any, owners: dict[int, int | None]) -> str:
    out = []
    for k, record in enumerate(trace.compiles):
        owner = owners[id(record)]
        head = f"<h3>compile {k}: {esc(record.pipeline)}</h3>"
        facts = [f"{record.total_ms:.1f} ms in {len(record.passes)} passes",
                 f"{sum(1 for r in record.kernels if r.kind == 'kernel')} kernels",
                 f"{sum(1 for r in record.kernels if r.kind != 'kernel')} externs/fallbacks"]
        if record.profiling:
            facts.append("kiln.profile's timing compile")
        if owner is not None:
            facts.append(f'from <a href="#capture-{owner}">capture {owner}</a>')
        longest = max((ms for _, ms in record.passes), default=0.0) or 1.0
        timeline = _table(["pass", "ms", ""], [[esc(name), f"{ms:.1f}", f'<span class="bar" style="width:'
                                                f'{max(1, round(240 * ms / longest))}px"></span>']
                                               for name, ms in record.passes], numeric=(1,))
        parts = [head, f'<div class="meta">{" · ".join(facts)}</div>', timeline]
        if record.kernels:
            rows = [[esc(r.name), esc(r.kind), f"<code>{esc(r.what)}</code>",
                     "<br>".join(f"<code>{esc(with_source(line))}</code>" for line in r.lines)
                     or ('<span class="meta">(not recorded)</span>' if not record.lines_known else "")]
                    for r in record.kernels]
            parts.append(_table(["kernel", "kind", "computes", "user lines fused into it"], rows))
        for title, text in record.code.items():
            parts.append(_folded(esc(title), _pre(text)))
        out.append(f'<div class="card" id="compile-{k}">{"".join(parts)}</div>')
    if trace.compiles_dropped:
        out.append(f"<p>... and {trace.compiles_dropped} more compiles, not kept</p>")
    return "".join(out) or "<p>No graph was compiled by a backend with passes (eager or prims only).</p>"


def _profiles(profiles: list) -> str:
    if not profiles:
        return "<p>No kiln.profile ran in this process (call kiln.profile(fn, *args) to add one).</p>"
    out = []
    for n, report in enumerate(profiles):
        rows = [[esc(r.graph), esc(r.kind), esc(r.name), f"<code>{esc(r.op[:80])}</code>", f"{r.time_us:.1f}",
                 "-" if r.gbps is None else f"{r.gbps:.1f}", "-" if r.gflops is None else f"{r.gflops:.1f}",
                 esc(r.label), "<br>".join(f"<code>{esc(o)}</code>" for o in r.origins)]
                for r in report.rows]
        table = _table(["graph", "kind", "name", "op", "us", "GB/s", "GFLOP/s", "label", "user lines"], rows,
                       numeric=(4, 5, 6))
        out.append(f'<div class="card" id="profile-{n}"><h3>kiln.profile {esc(report.function)}</h3>'
                   f'<div class="meta">wall {report.wall_us:.1f} us per call</div>{table}'
                   f"{_folded('as text', _pre(str(report)))}</div>")
    return "".join(out)


def _counters() -> str:
    lines = []
    for category in sorted(counters):
        for key, count in sorted(counters[category].items(), key=lambda kv: str(kv[0])):
            lines.append(f"{category}[{key!r}] = {count}")
    return _folded(f"kiln.counters ({len(lines)} entries)", _pre(cut("\n".join(lines), GRAPH_LIMIT)))
