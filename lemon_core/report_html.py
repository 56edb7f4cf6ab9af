"""The HTML pieces of the evaluation report (``lemon_core.report`` assembles the page from them): the page
style, tables that fit the page, and the gallery cards of example tasks.

Tables fit the page width because the report is read in a Kubeflow UI panel or a 1280 px browser window:
a table wider than that pushed its right-hand columns, values included, out of view. So text cells wrap
(a long one, such as the teacher sweep's candidates, breaks even inside a long word), number cells stay on
one line, and a table whose numbers alone are wider than the page scrolls inside its own box; the page
never scrolls sideways.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

from lemon_core.spec_layout import short

WORD_CHARS = 16  # a value without spaces up to this long is kept on one line
STYLE = (
    "body{font-family:sans-serif;margin:1.5em;color:#222;overflow-wrap:break-word}"
    ".table-box{max-width:100%;overflow-x:auto;margin:1em 0}"
    "table{border-collapse:collapse;font-size:0.85em}td,th{border:1px solid #ccc;padding:3px 4px}"
    "th{background:#f4f4f4;vertical-align:bottom}td.num{text-align:right;white-space:nowrap}"
    "td.word{text-align:left;white-space:nowrap}td.text{text-align:left;overflow-wrap:anywhere}"
    "tr.orch td{background:#fff4e5;font-weight:bold}"
    "img{max-width:100%}p.headline{font-size:1.1em;font-weight:bold}.note{color:#8a5a00}"
    ".example{border:1px solid #ddd;border-radius:6px;padding:0.5em 1em;margin:1em 0}"
    ".example img.spec{display:block;max-height:480px;margin:0.5em 0}"
    "span.correct{color:#1e7b34}span.wrong,span.failed{color:#b03a2e}span.invalid{color:#8a5a00}"
    "details{margin:0.3em 0}summary{cursor:pointer}pre{white-space:pre-wrap;background:#f8f8f8;padding:0.5em}"
    ".err{color:#b03a2e}.duty{font-style:italic;color:#555}"
)


def fmt(value: Any) -> str:
    """A table or headline value: 3 decimals, small figures in 3 significant digits, (low, high) as an interval."""
    if isinstance(value, tuple) and len(value) == 2:
        return f"[{fmt(float(value[0]))}, {fmt(float(value[1]))}]"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 and value else f"{value:.3f}"
    return "" if value is None else str(value)


def _cell(value: Any) -> str:
    """Numbers and intervals stay on one line, right-aligned; so does one short word (a method's name);
    other text wraps to its column."""
    text = fmt(value)
    if isinstance(value, int | float | tuple):
        kind = "num"
    else:
        kind = "word" if len(text) <= WORD_CHARS and " " not in text else "text"
    return f"<td class='{kind}'>{html.escape(text)}</td>"


def table_html(columns: Sequence[str], rows: Sequence[Mapping[str, Any]], *, headers: Mapping[str, str] | None = None,
               row_classes: Sequence[str] | None = None, table_id: str = "") -> str:
    """``rows`` as a table of ``columns`` (titled by ``headers`` where given) in a box as wide as the page."""
    esc = html.escape
    # a title may break after a slash too ('tokens/example'), so headers do not widen their columns
    head = "".join(f"<th>{esc((headers or {}).get(c, c)).replace('/', '/<wbr>')}</th>" for c in columns)
    body = "".join(
        (f"<tr class='{row_classes[i]}'>" if row_classes and row_classes[i] else "<tr>")
        + "".join(_cell(row.get(c)) for c in columns) + "</tr>"
        for i, row in enumerate(rows)
    )
    ident = f" id='{esc(table_id)}'" if table_id else ""
    return f"<div class='table-box'><table{ident}><tr>{head}</tr>{body}</table></div>"


def table_id(name: str) -> str:
    """A table's id from its title ('SFT warm-up' -> 'table-sft-warm-up'), for links and tests."""
    return "table-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def table_section(name: str, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A titled table of dict rows; the columns are the rows' keys in first-seen order."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return [f"<h2>{html.escape(name)}</h2>", table_html(columns, rows, table_id=table_id(name))]


# --- the gallery cards ------------------------------------------------------------------------------------
def spec_picture_html(spec: Mapping[str, Any], levels: Sequence[str] | None, label: str) -> str:
    """The spec as an inline base64 SVG image."""
    from lemon_core.spec_picture import spec_svg

    data = base64.b64encode(spec_svg(spec, levels).encode()).decode("ascii")
    return f"<img class='spec' alt='{html.escape(label)}' src='data:image/svg+xml;base64,{data}'>"


def agent_html(agent: Mapping[str, Any], spec_agent: Mapping[str, Any] | None) -> str:
    """One agent's run, collapsed: the summary line, then its duty, any error and its full output."""
    esc = html.escape
    role = spec_agent["role"] if spec_agent else ""
    tokens = int(agent.get("prompt_tokens") or 0) + int(agent.get("completion_tokens") or 0)
    flags = "".join(f" \u00b7 {f}" for f, on in (("cached", agent.get("cached")), ("error", agent.get("error"))) if on)
    summary = (f"{esc(str(agent.get('agent_id', '?')))} \u00b7 {esc(role)} ({esc(str(agent.get('capacity', '')))})"
               f" \u2014 {tokens} tokens, ${fmt(float(agent.get('cost') or 0.0))}{flags}")
    body = f"<p class='duty'>duty: {esc(spec_agent['duty'])}</p>" if spec_agent else ""
    if agent.get("error"):
        body += f"<p class='err'>{esc(str(agent['error']))}</p>"
    body += f"<pre>{esc(str(agent.get('output') or ''))}</pre>"
    return f"<details class='agent'><summary>{summary}</summary>{body}</details>"


def example_html(record: Mapping[str, Any], bench: str, method: str, levels: Sequence[str] | None) -> str:
    """One gallery card: the task, the score, prediction vs gold, the spec picture, each agent's output."""
    esc = html.escape
    score = float(record.get("score") or 0.0)
    if not record.get("spec"):
        verdict = "invalid spec"
    elif record.get("error"):
        verdict = "failed run"  # the spec was valid but an agent call failed (see the error below)
    else:
        verdict = "correct" if score >= 1.0 else "wrong"
    parts = [
        "<div class='example'>",
        f"<h3>{esc(bench)} / {esc(method)} \u00b7 example {esc(str(record.get('id', '?')))} \u00b7 "
        f"<span class='{verdict.split()[0]}'>score {fmt(score)} ({verdict})</span></h3>",
        f"<details><summary>task: {esc(short(str(record.get('task', '')), 160))}</summary>"
        f"<pre>{esc(str(record.get('task', '')))}</pre></details>",
        f"<p>prediction <code>{esc(str(record.get('prediction')))}</code> \u00b7 gold "
        f"<code>{esc(str(record.get('gold')))}</code> \u00b7 cost ${fmt(float(record.get('cost') or 0.0))}"
        f" \u00b7 {int(record.get('tokens') or 0)} tokens</p>",
    ]
    if record.get("error"):
        parts.append(f"<p class='err'>error: {esc(str(record['error']))}</p>")
    spec = record.get("spec")
    if spec:
        parts.append(spec_picture_html(spec, levels, f"spec of {bench} example {record.get('id', '?')}"))
        by_id = {a["id"]: a for a in spec["agents"]}
        parts += [agent_html(a, by_id.get(a.get("agent_id"))) for a in record.get("agents") or []]
    parts.append("</div>")
    return "\n".join(parts)
