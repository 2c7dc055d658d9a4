"""The status page as HTML: a ``View`` rendered, every value escaped (paths, tenant and
job names are anyone's text), the request rate an inline SVG chart; no script at all.

The page reloads itself every ``REFRESH_S`` (``<meta http-equiv="refresh">``).
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Iterable, Sequence

from .._config import RESERVE, ago, human_size
from .._types import Health, NodeState, QuotaState
from ._status import HISTORY, AgentState, ClassRule, Job, Sample, View

REFRESH_S = 5
"""Seconds between the page's reloads."""
CHART_W, CHART_H = 600, 120
"""The chart's size, in pixels."""
STEPS_SHOWN = 12
"""A job's newest steps shown (the older ones are counted)."""
_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin:0} h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse}
td,th{padding:.2em .8em;text-align:left;border-bottom:1px solid #ddd;white-space:nowrap}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#b00;font-weight:bold} .ok{color:#070} .warn{color:#a60} .dim{color:#777}
.bar{display:inline-block;height:.7em;background:#48c;vertical-align:middle}
.over{background:#c44} svg{border:1px solid #ccc;background:#fafafa}
"""


def e(value: object) -> str:
    """``value`` as text safe anywhere in the page: in an element or a quoted attribute."""
    return html.escape(str(value), quote=True)


def page(title: str, body: str, *, refresh: bool = False) -> str:
    """A whole document around ``body`` (already HTML)."""
    meta = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="referrer" content="no-referrer">{meta}<title>{e(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{body}</body></html>"
    )


def render(view: View) -> str:
    """The page for ``view``."""
    who = "the operator" if not view.token else f"tenant {view.viewer} (token {view.token})"
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(view.at))
    parts = [
        "<h1>graben status</h1>",
        f'<p class="dim">as {e(who)} sees it, {e(when)}; reloads every {REFRESH_S} s; '
        '<a href="status.json">JSON</a> &middot; <a href="logout">forget the token</a></p>',
    ]
    if view.health is not None:
        parts += [_services(view.health), _nodes(view.health), _backlogs(view)]
        parts += [_throughput(view.throughput, view.sample_s), _classes(view.classes)]
    parts.append(_quotas(view.quotas, view.tenants, operator=view.health is not None))
    parts.append(_jobs(view.jobs))
    if view.health is not None:
        parts.append(_agents(view.agents))
    return page("graben status", "".join(parts), refresh=True)


def refused(reason: str, *, status: int = 401) -> str:
    """The page for a request with no token, or one the service refuses (401); for no
    such page (404) or figures the service cannot give now (503), with the same help."""
    heading = {401: "a token is needed", 404: "no such page"}.get(status, "not now")
    body = (
        f"<h1>graben status: {e(heading)}</h1>"
        f'<p class="bad">{e(reason)}</p>'
        "<p>Pass a token once with <code>?token=TOKEN</code> (the page keeps it in a cookie "
        "for this site, sent to it alone, never readable by scripts), or in each request's "
        "header <code>Authorization: Bearer TOKEN</code>.</p>"
        "<p>The operator's token: <code>graben token cluster</code> (the cluster's secret "
        "shows everything); a tenant's: <code>graben token create --tenant NAME</code> "
        "(shows its own usage and checkpoint jobs).</p>"
        '<form method="get" action=""><input type="password" name="token" size="70" '
        'autocomplete="off" placeholder="token"> <button>show</button></form>'
    )
    return page(f"graben status: {status}", body)


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], empty: str) -> str:
    """A table: ``head`` plain text, each row's cells already HTML."""
    lines = [
        "<tr>" + "".join(cell if cell.startswith("<td") else f"<td>{cell}</td>" for cell in row)
        for row in rows
    ]
    if not lines:
        return f'<p class="dim">{e(empty)}</p>'
    top = "".join(f"<th>{e(h)}</th>" for h in head)
    return f"<table><tr>{top}</tr>{''.join(lines)}</table>"


def _n(value: str) -> str:
    return f'<td class="n">{value}</td>'


def _mark(text: str, kind: str) -> str:
    return f'<span class="{kind}">{e(text)}</span>'


def _services(health: Health) -> str:
    rows = [
        (
            e(s.id),
            e(s.address),
            _mark("up", "ok") if s.alive else _mark("GONE", "bad"),
            e(f"leader (fence {health.fence})" if s.id == health.leader else "standby"),
            _n(e(s.schema_version)),
        )
        for s in health.services
    ]
    leader = "" if health.leader else '<p class="bad">no service holds the lease now</p>'
    return (
        f"<h2>Metadata services</h2><p>store {e(health.store_id)}, engine {e(health.engine)}</p>"
        + _table(("id", "address", "state", "role", "schema"), rows, "no services")
        + leader
    )


def _state(node: NodeState) -> str:
    if not node.alive:
        return _mark("dead", "bad")
    if node.state == "draining":
        return _mark(f"draining ({node.held} left)", "warn")
    if node.state:
        return _mark(node.state, "warn")
    if node.free < RESERVE:
        return _mark("alive, FULL", "bad")
    return _mark("alive", "ok")


def _nodes(health: Health) -> str:
    now = time.time()
    rows = [
        (
            e(n.id),
            e(n.address),
            e(n.rack),
            _state(n),
            _n(e(human_size(n.stored))),
            _n(e(human_size(n.free))),
            _n(e(human_size(n.total))),
            _n(e(n.held)),
            e(ago(now - n.last_seen)),
        )
        for n in health.nodes
    ]
    alive = sum(n.alive for n in health.nodes)
    head = ("id", "address", "rack", "state", "graben", "free", "disk", "copies", "heard")
    return f"<h2>Data nodes: {alive} of {len(health.nodes)} alive</h2>" + _table(
        head, rows, "no data node has joined"
    )


def _backlogs(view: View) -> str:
    health = view.health
    assert health is not None
    draining = sum(n.held for n in health.nodes if n.state == "draining")
    c = health.collection
    grace = "never by itself" if c.grace_s is None else f"{c.grace_s:g} s after last use"
    rows = [
        ("chunks short of copies", health.degraded, "repair copies them (counted to 100,000)"),
        ("damaged copies", health.bad, "repair deletes them"),
        ("copies on draining nodes", draining, "repair moves them off"),
        ("chunks to convert", view.converting, "to their class (counted to 10,000)"),
        ("chunks no file uses", c.waiting, f"{human_size(c.waiting_bytes)}; collected {grace}"),
    ]
    cells = [
        (e(what), _n(_mark(str(count), "bad" if count and i < 2 else "ok")), e(note))
        for i, (what, count, note) in enumerate(rows)
    ]
    freed = f"{c.freed} chunks ({human_size(c.freed_bytes)}) freed so far"
    return (
        "<h2>Backlogs</h2>"
        + _table(("what", "count", ""), cells, "")
        + f'<p class="dim">{e(freed)}</p>'
    )


def _classes(rules: list[ClassRule]) -> str:
    rows = [(e(r.path), e(r.name)) for r in rules]
    return "<h2>Storage classes</h2>" + _table(
        ("path", "class"), rows, "no class set: every file is replicated"
    )


def _usage(used: int, limit: int, shown: Callable[[int], str] = str) -> str:
    """A usage cell: ``USED / LIMIT`` as ``shown`` writes them, and a bar of the share
    taken."""
    if not limit:
        return _n(e(f"{shown(used)} (no limit)"))
    text = f"{shown(used)} / {shown(limit)}"
    share = used / limit
    width = min(share, 1.0) * 80
    bar = f'<span class="bar{" over" if share >= 1 else ""}" style="width:{width:.0f}px"></span>'
    return _n(f"{e(text)} {bar} {share:.0%}")


def _quota_row(q: QuotaState) -> tuple[str, ...]:
    return (
        e(q.tenant or "-"),
        e(q.path),
        _usage(q.bytes, q.max_bytes, human_size),
        _usage(q.physical, q.max_physical, human_size),
        _usage(q.files, q.max_files),
    )


def _quotas(quotas: list[QuotaState], tenants: dict[str, str], *, operator: bool) -> str:
    rows = [_quota_row(q) for q in quotas]
    roots = [(e(t), e(root)) for t, root in sorted(tenants.items())]
    head = ("tenant", "path", "bytes", "on disk", "files")
    text = "<h2>Tenants and quotas</h2>" + _table(head, rows, "no quotas")
    if operator:
        text += "<h2>Tenants</h2>" + _table(("tenant", "root"), roots, "no tenants")
    return text


def _jobs(jobs: list[Job]) -> str:
    rows = []
    for job in jobs:
        older = len(job.steps) - STEPS_SHOWN
        steps = ", ".join(f"{s.step} [{s.tiers}]" for s in job.steps[-STEPS_SHOWN:])
        steps = (f"({older} older) " if older > 0 else "") + (steps or "none")
        rows.append((e(job.url), e(steps), _mark(job.error, "bad")))
    return "<h2>Checkpoint jobs</h2>" + _table(
        ("job", "steps [tiers]", ""), rows, "no checkpoint job seen at the named memory agents"
    )


def _agents(agents: list[AgentState]) -> str:
    rows = [
        (
            e(a.address),
            _mark(a.error, "bad") if a.error else _mark("up", "ok"),
            _n(e(human_size(a.held))),
            _n(e(a.segments)),
        )
        for a in agents
    ]
    return "<h2>Memory agents</h2>" + _table(
        ("address", "state", "held", "segments"), rows, "none named (--status-agents)"
    )


def _throughput(samples: list[Sample], every: float) -> str:
    if not samples:
        return '<h2>Requests</h2><p class="dim">no sample yet</p>'
    last = samples[-1]
    rates = (
        f"now {last.requests:.1f} requests/s ({last.errors:.1f} errors/s), "
        f"{human_size(int(last.received))}/s in, {human_size(int(last.sent))}/s out"
    )
    span = HISTORY * every
    return (
        f"<h2>Requests to this service, last {span / 60:.0f} min</h2><p>{e(rates)}</p>"
        + chart(samples, span)
        + '<p class="dim">blue: requests a second; red: of them, errors</p>'
    )


def chart(samples: list[Sample], span: float) -> str:
    """An SVG line chart of the samples' request and error rates over the last ``span``
    seconds (newest at the right), scaled to the largest."""
    top = max([1.0, *(s.requests for s in samples)])
    start = samples[-1].at - span

    def line(rates: list[tuple[float, float]], colour: str) -> str:
        points = " ".join(
            f"{(at - start) / span * CHART_W:.1f},{CHART_H - rate / top * (CHART_H - 14):.1f}"
            for at, rate in rates
        )
        return f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>'

    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{CHART_W}" height="{CHART_H}" '
        f'role="img" aria-label="requests per second">'
        f"{line([(s.at, s.requests) for s in samples], '#2463a8')}"
        f"{line([(s.at, s.errors) for s in samples], '#c33')}"
        f'<text x="4" y="12" font-size="11">{top:.1f}/s</text>'
        f'<text x="4" y="{CHART_H - 4}" font-size="11">-{span / 60:.0f} min</text>'
        f'<text x="{CHART_W - 4}" y="{CHART_H - 4}" font-size="11" text-anchor="end">now</text>'
        "</svg>"
    )
