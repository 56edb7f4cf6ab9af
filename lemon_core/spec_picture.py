"""Pictures of an orchestration spec: an SVG/PNG drawing of its DAG and a text tree for terminals.

The drawing shows what the orchestrator decided: one box per agent (id, role, base role, capacity),
filled by capacity level on a light-to-dark scale (cheapest lightest), an arrow from each dependency
to the agent that reads it, and the output agent drawn with a double border. Hovering a box in the SVG
shows the agent's duty (its ``<title>``).

The layout is ``lemon_core.spec_layout`` (a layered DAG layout in plain Python) and both pictures are
drawn from it here: the SVG written as text, the PNG through matplotlib. So pictures need nothing beyond
``pip install``; they used to need Graphviz's ``dot``, a system program a fresh machine lacks.

``spec_text`` needs nothing but Python, so ``lemon spec show`` works in a terminal too.
"""

from __future__ import annotations

import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lemon_core.spec import OrchestrationSpec
from lemon_core.spec_layout import ARROW, BASELINE, FONT_SIZE, LEGEND_SIZE, LINE_HEIGHT, PAD_Y, Layout, layout, short

# Usual level names, cheapest first: used to order the colour scale when no pool order is given.
KNOWN_LEVEL_ORDER = ("tiny", "small", "medium", "large", "xlarge", "huge")
# Light-to-dark blues (readable black text on the first four, white on the rest); a single hue keeps
# "darker = more capable" readable for colour-blind readers too.
PALETTE = ("#eff3ff", "#c6dbef", "#9ecae1", "#6baed6", "#3182bd", "#08519c")
DARK_FROM = 4  # palette index from which labels are drawn in white
EDGE_COLOUR, BORDER_COLOUR = "#555555", "#333333"
FONT_FAMILY = "DejaVu Sans, Verdana, sans-serif"  # the font whose metrics size the boxes (spec_layout)
RADIUS = 6.0  # rounded corners
OUTLINE = 3.0  # distance of the output agent's second border


class SpecPictureError(RuntimeError):
    """The picture cannot be made; the message says what to change."""


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


def text_colour(fill: str) -> str:
    """White on the dark end of the palette, black elsewhere."""
    return "white" if fill in PALETTE[DARK_FROM:] else "black"


def _picture(spec: OrchestrationSpec | Mapping[str, Any],
             levels: Sequence[str] | None) -> tuple[OrchestrationSpec, Layout, dict[str, str]]:
    spec = as_spec(spec)
    order = level_order(spec, levels)
    return spec, layout(spec, order), level_colours(order)


def edge_path(points: Sequence[tuple[float, float]]) -> list[tuple[tuple[float, float], ...]]:
    """The arrow's line as cubic Bezier steps (start, control, control, end), each leaving and arriving
    vertically; the last one stops where the arrowhead begins."""
    *rest, (tip_x, tip_y) = points
    stops = [*rest, (tip_x, tip_y - ARROW)]
    steps = []
    for (x0, y0), (x1, y1) in zip(stops, stops[1:], strict=False):
        mid = (y0 + y1) / 2
        steps.append(((x0, y0), (x0, mid), (x1, mid), (x1, y1)))
    return steps


def arrowhead(tip: tuple[float, float]) -> list[tuple[float, float]]:
    x, y = tip
    return [(x, y), (x - ARROW / 2, y - ARROW), (x + ARROW / 2, y - ARROW)]


# --- SVG ----------------------------------------------------------------------------------------------------
def _n(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _svg_edges(spec_layout: Layout) -> list[str]:
    esc = html.escape
    parts = []
    for edge in spec_layout.edges:
        steps = edge_path(edge.points)
        d = f"M{_n(steps[0][0][0])},{_n(steps[0][0][1])}" + "".join(
            " C" + " ".join(f"{_n(x)},{_n(y)}" for x, y in step[1:]) for step in steps)
        head = " ".join(f"{_n(x)},{_n(y)}" for x, y in arrowhead(edge.points[-1]))
        parts.append(
            f'<g class="edge" data-source="{esc(edge.source)}" data-target="{esc(edge.target)}">'
            f"<title>{esc(edge.source)} \u2192 {esc(edge.target)}</title>"
            f'<path d="{d}" fill="none" stroke="{EDGE_COLOUR}"/><polygon points="{head}" fill="{EDGE_COLOUR}"/></g>')
    return parts


def _svg_rect(x: float, y: float, width: float, height: float, radius: float, fill: str, stroke_width: float) -> str:
    return (f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(width)}" height="{_n(height)}" rx="{_n(radius)}" '
            f'fill="{fill}" stroke="{BORDER_COLOUR}" stroke-width="{_n(stroke_width)}"/>')


def _svg_agents(spec: OrchestrationSpec, spec_layout: Layout, colours: Mapping[str, str]) -> list[str]:
    esc = html.escape
    parts = []
    for agent in spec.agents:
        box, fill = spec_layout.boxes[agent.id], colours[agent.capacity]
        is_output = agent.id == spec.output
        rects = [_svg_rect(box.x, box.y, box.width, box.height, RADIUS, fill, 1.6 if is_output else 1)]
        if is_output:
            rects.append(_svg_rect(box.x - OUTLINE, box.y - OUTLINE, box.width + 2 * OUTLINE,
                                   box.height + 2 * OUTLINE, RADIUS + OUTLINE, "none", 1.6))
        texts = [f'<text x="{_n(box.centre_x)}" y="{_n(box.y + PAD_Y + i * LINE_HEIGHT + BASELINE)}"'
                 + (' font-weight="bold"' if i == 0 else "") + (' font-style="italic"' if i == 2 else "")
                 + f">{esc(line)}</text>" for i, line in enumerate(box.lines)]
        classes = f"agent capacity-{esc(agent.capacity)}" + (" output" if is_output else "")
        parts.append(f'<g class="{classes}" id="agent-{esc(agent.id)}" data-agent="{esc(agent.id)}" '
                     f'fill="{text_colour(fill)}"><title>{esc(short(agent.duty, 300))}</title>'
                     + "".join(rects) + "".join(texts) + "</g>")
    return parts


def _svg_legend(spec_layout: Layout, colours: Mapping[str, str]) -> str:
    esc = html.escape
    cells = []
    for cell in spec_layout.legend:
        fill = colours[cell.level] if cell.level else "white"
        cells.append(_svg_rect(cell.x, cell.y, cell.width, cell.height, 0, fill, 0.6) +
                     f'<text x="{_n(cell.x + cell.width / 2)}" y="{_n(cell.y + cell.height / 2 + LEGEND_SIZE * 0.36)}"'
                     f' fill="{text_colour(fill)}">{esc(cell.level or "capacity")}</text>')
    return f'<g class="legend" id="legend" font-size="{_n(LEGEND_SIZE)}">' + "".join(cells) + "</g>"


def spec_svg(spec: OrchestrationSpec | Mapping[str, Any], levels: Sequence[str] | None = None) -> str:
    """The spec drawn as an SVG document (starting at ``<svg``, so it can be inlined in HTML)."""
    spec, spec_layout, colours = _picture(spec, levels)
    width, height = _n(spec_layout.width), _n(spec_layout.height)
    return "\n".join([
        # sized in points, the layout's unit: 11-point labels read like the page's own text
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}pt" height="{height}pt" viewBox="0 0 {width} {height}" '
        f'font-family="{FONT_FAMILY}" font-size="{_n(FONT_SIZE)}" text-anchor="middle">',
        '<rect width="100%" height="100%" fill="white"/>',
        *_svg_edges(spec_layout),
        *_svg_agents(spec, spec_layout, colours),
        _svg_legend(spec_layout, colours),
        "</svg>",
    ]) + "\n"


# --- PNG ----------------------------------------------------------------------------------------------------
def _draw_edges(ax: Any, spec_layout: Layout) -> None:
    from matplotlib.patches import PathPatch, Polygon
    from matplotlib.path import Path as CurvePath

    for edge in spec_layout.edges:
        steps = edge_path(edge.points)
        vertices = [steps[0][0], *(p for step in steps for p in step[1:])]
        codes = [CurvePath.MOVETO] + [CurvePath.CURVE4] * (len(vertices) - 1)
        ax.add_patch(PathPatch(CurvePath(vertices, codes), fill=False, edgecolor=EDGE_COLOUR, lw=1))
        ax.add_patch(Polygon(arrowhead(edge.points[-1]), closed=True, color=EDGE_COLOUR, lw=0))


def _draw_agents(ax: Any, spec: OrchestrationSpec, spec_layout: Layout, colours: Mapping[str, str]) -> None:
    from matplotlib.patches import FancyBboxPatch

    for agent in spec.agents:
        box, fill = spec_layout.boxes[agent.id], colours[agent.capacity]
        is_output = agent.id == spec.output
        ax.add_patch(FancyBboxPatch((box.x, box.y), box.width, box.height, f"round,pad=0,rounding_size={RADIUS}",
                                    facecolor=fill, edgecolor=BORDER_COLOUR, lw=1.6 if is_output else 1))
        if is_output:
            ax.add_patch(FancyBboxPatch((box.x - OUTLINE, box.y - OUTLINE), box.width + 2 * OUTLINE,
                                        box.height + 2 * OUTLINE, f"round,pad=0,rounding_size={RADIUS + OUTLINE}",
                                        fill=False, edgecolor=BORDER_COLOUR, lw=1.6))
        for i, line in enumerate(box.lines):
            ax.text(box.centre_x, box.y + PAD_Y + i * LINE_HEIGHT + BASELINE, line, ha="center", va="baseline",
                    fontsize=FONT_SIZE, family="DejaVu Sans", color=text_colour(fill),
                    fontweight="bold" if i == 0 else "normal", fontstyle="italic" if i == 2 else "normal")


def _draw_legend(ax: Any, spec_layout: Layout, colours: Mapping[str, str]) -> None:
    from matplotlib.patches import Rectangle

    for cell in spec_layout.legend:
        fill = colours[cell.level] if cell.level else "white"
        ax.add_patch(Rectangle((cell.x, cell.y), cell.width, cell.height, facecolor=fill,
                               edgecolor=BORDER_COLOUR, lw=0.6))
        ax.text(cell.x + cell.width / 2, cell.y + cell.height / 2, cell.level or "capacity", ha="center",
                va="center", fontsize=LEGEND_SIZE, family="DejaVu Sans", color=text_colour(fill))


def spec_png(spec: OrchestrationSpec | Mapping[str, Any], levels: Sequence[str] | None = None,
             dpi: int = 110) -> bytes:
    """The spec drawn as PNG bytes (a figure of its own, not pyplot's, so the service can draw in threads)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    spec, spec_layout, colours = _picture(spec, levels)
    fig = Figure(figsize=(spec_layout.width / 72, spec_layout.height / 72), facecolor="white")
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, spec_layout.width)
    ax.set_ylim(spec_layout.height, 0)  # y grows downwards, as in the layout and the SVG
    ax.set_axis_off()
    _draw_edges(ax, spec_layout)
    _draw_agents(ax, spec, spec_layout, colours)
    _draw_legend(ax, spec_layout, colours)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return buf.getvalue()


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
        lines.append(f"{lead}{branch}{star}{agent_id}  {short(agent.role, 60)}  [{agent.base_role} \u00b7 "
                     f"{agent.capacity}]")
        child_lead = lead + {"": "", "\u2514\u2500\u2500 ": "    "}.get(branch, "\u2502   ")
        parents = agent.depends_on
        pipe = "\u2502 " if parents else "  "
        lines.append(f"{child_lead}{pipe} duty: {short(agent.duty, duty_chars)}")
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
