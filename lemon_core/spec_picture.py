"""Pictures of an orchestration spec: an SVG/PNG drawing of its DAG and a text tree for terminals.

The drawing shows what the orchestrator decided: one box per agent (id, role, base role, capacity),
filled by capacity level on a light-to-dark scale (cheapest lightest), an arrow from each dependency
to the agent that reads it, and the output agent drawn with a double border. Hovering a box shows the
agent's duty (the SVG ``<title>``).

Layout is Graphviz's ``dot`` (driven through the ``graphviz`` Python bindings), not coordinates placed
here. Why dot: specs are layered DAGs, and dot is the reference layered-graph layout (rank assignment,
crossing minimisation, spline edge routing); it writes SVG and PNG itself, so no extra rasteriser is
needed; it is one Debian package (``graphviz``) in the images and CI. The pure-Python alternatives
either stopped being released (grandalf, last release 2023) or only assign layers without reducing
crossings or routing edges (networkx's ``multipartite_layout``).

``spec_text`` needs nothing but Python, so ``lemon spec show`` works in a terminal without Graphviz.
"""

from __future__ import annotations

import html
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lemon_core.spec import OrchestrationSpec

# Usual level names, cheapest first: used to order the colour scale when no pool order is given.
KNOWN_LEVEL_ORDER = ("tiny", "small", "medium", "large", "xlarge", "huge")
# Light-to-dark blues (readable black text on the first four, white on the rest); a single hue keeps
# "darker = more capable" readable for colour-blind readers too.
PALETTE = ("#eff3ff", "#c6dbef", "#9ecae1", "#6baed6", "#3182bd", "#08519c")
DARK_FROM = 4  # palette index from which labels are drawn in white
MAX_LABEL_CHARS = 36


class SpecPictureError(RuntimeError):
    """The picture cannot be made; the message says what to install or change."""


def as_spec(spec: OrchestrationSpec | Mapping[str, Any]) -> OrchestrationSpec:
    """A spec object from a spec or its dict form (``traces.jsonl`` stores specs as dicts)."""
    return spec if isinstance(spec, OrchestrationSpec) else OrchestrationSpec.model_validate(dict(spec))


def level_order(spec: OrchestrationSpec, levels: Sequence[str] | None = None) -> list[str]:
    """Capacity levels cheapest first: the pool's order when given, else the usual names' order, then
    any other level in order of first use. Levels the spec uses but ``levels`` lacks are appended."""
    used = list(dict.fromkeys(a.capacity for a in spec.agents))
    if levels is not None:
        return list(levels) + [u for u in used if u not in levels]
    known = [name for name in KNOWN_LEVEL_ORDER if name in used]
    return known + [u for u in used if u not in known]


def level_colours(order: Sequence[str]) -> dict[str, str]:
    """Fill colour per level, spread over the palette so the cheapest is lightest, the largest darkest."""
    if len(order) == 1:
        return {order[0]: PALETTE[2]}
    last = len(PALETTE) - 1
    return {name: PALETTE[round(i * last / (len(order) - 1))] for i, name in enumerate(order)}


def _short(text: str, limit: int = MAX_LABEL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _node_label(agent_id: str, role: str, base_role: str, capacity: str, is_output: bool) -> str:
    """Graphviz HTML-like label: id and role in bold, then base role and capacity, then 'output'."""
    esc = html.escape
    lines = [
        f"<b>{esc(agent_id)} \u00b7 {esc(_short(role))}</b>",
        f"{esc(base_role)} \u00b7 {esc(capacity)}",
    ]
    if is_output:
        lines.append("<i>\u2605 output</i>")
    return "<" + "<br/>".join(lines) + ">"


def spec_dot(spec: OrchestrationSpec | Mapping[str, Any], levels: Sequence[str] | None = None) -> Any:
    """The spec as a ``graphviz.Digraph`` (agents top to bottom in dependency order, a legend below)."""
    try:
        import graphviz
    except ImportError as exc:
        raise SpecPictureError(
            "spec pictures need the 'graphviz' Python package; pip install 'graphviz>=0.20'"
        ) from exc
    spec = as_spec(spec)
    order = level_order(spec, levels)
    colours = level_colours(order)
    dark = {name for i, name in enumerate(order) if PALETTE.index(colours[name]) >= DARK_FROM}
    g = graphviz.Digraph("spec", graph_attr={"rankdir": "TB", "nodesep": "0.3", "ranksep": "0.45",
                                             "fontname": "DejaVu Sans", "bgcolor": "white"})
    g.attr("node", shape="box", style="rounded,filled", fontname="DejaVu Sans", fontsize="11", margin="0.15,0.06")
    g.attr("edge", color="#555555", arrowsize="0.7")
    for agent in spec.agents:
        is_output = agent.id == spec.output
        g.node(
            agent.id,
            label=_node_label(agent.id, agent.role, agent.base_role, agent.capacity, is_output),
            fillcolor=colours[agent.capacity],
            fontcolor="white" if agent.capacity in dark else "black",
            peripheries="2" if is_output else "1",
            penwidth="1.8" if is_output else "1",
            tooltip=_short(agent.duty, 300),
            id=f"agent-{agent.id}",
            **{"class": f"agent capacity-{agent.capacity}" + (" output" if is_output else "")},
        )
        for parent in agent.depends_on:
            g.edge(parent, agent.id)
    _add_legend(g, order, colours, dark)
    return g


def _add_legend(g: Any, order: Sequence[str], colours: Mapping[str, str], dark: set[str]) -> None:
    """One small table of the capacity levels, cheapest first, kept below the agents."""
    cells = "".join(
        f'<td bgcolor="{colours[name]}"><font color="{"white" if name in dark else "black"}">'
        f"{html.escape(name)}</font></td>"
        for name in order
    )
    table = '<table border="0" cellborder="1" cellspacing="0" cellpadding="3">'
    label = f"<{table}<tr><td>capacity</td>{cells}</tr></table>>"
    with g.subgraph(name="legend") as sub:
        sub.attr(rank="sink")
        sub.node("__legend__", label=label, shape="plaintext", style="", fontsize="9", id="legend")


def _dot_binary() -> None:
    if shutil.which("dot") is None:
        raise SpecPictureError(
            "spec pictures need Graphviz's 'dot' program, which is not on PATH; install it with "
            "'apt-get install graphviz' (Debian/Ubuntu) or 'brew install graphviz' (macOS), "
            "or run 'lemon spec show FILE' without --out for a text tree"
        )


def spec_svg(spec: OrchestrationSpec | Mapping[str, Any], levels: Sequence[str] | None = None) -> str:
    """The spec drawn as an SVG document (starting at ``<svg``, so it can be inlined in HTML)."""
    _dot_binary()
    svg = spec_dot(spec, levels).pipe(format="svg", encoding="utf-8")
    return svg[svg.index("<svg") :]


def spec_png(spec: OrchestrationSpec | Mapping[str, Any], levels: Sequence[str] | None = None,
             dpi: int = 110) -> bytes:
    """The spec drawn as PNG bytes."""
    _dot_binary()
    g = spec_dot(spec, levels)
    g.attr(dpi=str(dpi))
    return g.pipe(format="png")


def write_spec_picture(spec: OrchestrationSpec | Mapping[str, Any], out: Path,
                       levels: Sequence[str] | None = None) -> Path:
    """Write the picture to ``out``; the suffix (.svg or .png) picks the format."""
    suffix = out.suffix.lower()
    if suffix == ".svg":
        data = spec_svg(spec, levels).encode()
    elif suffix == ".png":
        data = spec_png(spec, levels)
    else:
        raise SpecPictureError(
            f"--out {out}: unknown picture type {suffix or '(none)'!r}; end the name in .svg or .png"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return out


# --- the text tree --------------------------------------------------------------------------------
def topology(spec: OrchestrationSpec | Mapping[str, Any]) -> str:
    """A name for the spec's shape, for counting what an orchestrator chose:
    single (one agent), chain (each agent reads only the one before), fan-in (independent agents
    all read by the output), diamond (one root, a parallel middle, the output reads the middle),
    independent (several agents, no edges), dag (anything else)."""
    spec = as_spec(spec)
    agents = spec.agents
    if len(agents) == 1:
        return "single"
    if all(not a.depends_on for a in agents):
        return "independent"
    if agents[0].depends_on == [] and all(a.depends_on == [agents[i].id] for i, a in enumerate(agents[1:])):
        return "chain"
    out = spec.agent(spec.output)
    others = [a for a in agents if a.id != spec.output]
    if all(not a.depends_on for a in others) and set(out.depends_on) == {a.id for a in others}:
        return "fan-in"
    levels = spec.levels()
    if (len(levels) == 3 and len(levels[0]) == 1 and levels[2] == [out] and len(levels[1]) > 1
            and all(a.depends_on == [levels[0][0].id] for a in levels[1])
            and set(out.depends_on) == {a.id for a in levels[1]}):
        return "diamond"
    return "dag"


def spec_text(spec: OrchestrationSpec | Mapping[str, Any], duty_chars: int = 72) -> str:
    """A readable tree for a terminal: the output agent at the top, each agent's inputs below it.

    An agent read by several others is written out once and referred to as "(see above)" after that;
    agents whose output nothing on the way to the answer reads are listed at the end.
    """
    spec = as_spec(spec)
    levels = spec.levels()
    # "depth", not "levels": a spec's levels are its capacity levels everywhere else in lemon
    head = (f"spec: {len(spec.agents)} agent{'s' * (len(spec.agents) != 1)}, depth {len(levels)}, "
            f"topology {topology(spec)}, output {spec.output}")
    lines = [head]
    shown: set[str] = set()

    def line(agent_id: str, lead: str, branch: str) -> None:
        agent = spec.agent(agent_id)
        star = "\u2605 " if agent_id == spec.output else ""
        if agent_id in shown:
            lines.append(f"{lead}{branch}{agent_id} (see above)")
            return
        shown.add(agent_id)
        lines.append(f"{lead}{branch}{star}{agent_id}  {_short(agent.role, 60)}  [{agent.base_role} \u00b7 "
                     f"{agent.capacity}]")
        child_lead = lead + {"": "", "\u2514\u2500\u2500 ": "    "}.get(branch, "\u2502   ")
        parents = agent.depends_on
        pipe = "\u2502 " if parents else "  "
        lines.append(f"{child_lead}{pipe} duty: {_short(agent.duty, duty_chars)}")
        for i, parent in enumerate(parents):
            last = i == len(parents) - 1
            line(parent, child_lead, "\u2514\u2500\u2500 " if last else "\u251c\u2500\u2500 ")

    line(spec.output, "", "")
    unused = [a.id for a in spec.agents if a.id not in shown]
    if unused:
        lines.append("not read on the way to the output:")
        for agent_id in unused:
            if agent_id not in shown:
                line(agent_id, "", "")
    return "\n".join(lines) + "\n"
