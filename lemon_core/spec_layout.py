"""Where each box and arrow of a spec picture goes: a layered DAG layout in plain Python.

Spec pictures used Graphviz's ``dot``, a system program that ``pip install`` cannot bring, so on a fresh
machine the report had no pictures. Specs are small layered DAGs (at most a dozen agents), and the
classic layered (Sugiyama) steps are short enough to write here:

1. layers: an agent sits one layer below the deepest agent it reads (``OrchestrationSpec.levels``);
2. an edge that skips layers gets a waypoint in every layer it crosses, so it is routed beside the boxes
   of those layers instead of through them;
3. order within a layer: barycentre sweeps down and up, keeping the order with the fewest crossings;
4. x: each box as close as the gaps allow to the mean x of the boxes it is joined to (a least-squares
   placement under the layer's order and gaps, solved exactly by pool-adjacent-violators);
5. y: one row per layer; each arrow leaves its source's bottom and enters its reader's top.

Units are points (1/72 inch): the SVG uses them as pixels, the PNG as points at its own dpi. Text widths
come from the DejaVu Sans metrics matplotlib ships, the font both renderings name, so labels fit their boxes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from lemon_core.spec import OrchestrationSpec

FONT_SIZE = 11.0
LINE_HEIGHT = 15.0
BASELINE = 11.5  # from the top of a text line to its baseline
PAD_X, PAD_Y = 10.0, 7.0  # inside a box, around its text
GAP_X, GAP_Y = 24.0, 40.0  # between boxes of one layer; between layers
WAYPOINT_WIDTH = 8.0  # room an edge takes when it passes a layer
MARGIN = 12.0
PORT_SPREAD = 18.0  # distance between arrows that meet the same side of a box
ARROW = 8.0  # arrowhead length
LEGEND_SIZE, LEGEND_HEIGHT, LEGEND_GAP = 9.0, 18.0, 20.0
ID_CHARS, ROLE_CHARS = 20, 36
SWEEPS = 4

Point = tuple[float, float]


@dataclass(frozen=True)
class Box:
    """One agent's box: the top-left corner, size and the label lines (the first one is drawn bold)."""

    agent_id: str
    x: float
    y: float
    width: float
    height: float
    lines: tuple[str, ...]

    @property
    def centre_x(self) -> float:
        return self.x + self.width / 2


@dataclass(frozen=True)
class Edge:
    """An arrow from ``source`` to the agent reading it, through ``points``: the source's bottom, two points
    per crossed layer, and the arrowhead's tip on the reader's top. Each step between two points is drawn
    as a curve that leaves and arrives vertically."""

    source: str
    target: str
    points: tuple[Point, ...]


@dataclass(frozen=True)
class LegendCell:
    """One cell of the capacity legend; ``level`` is None for the 'capacity' title cell."""

    level: str | None
    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True)
class Layout:
    boxes: dict[str, Box]
    edges: list[Edge]
    legend: list[LegendCell]
    width: float
    height: float


@functools.cache
def _font(bold: bool) -> Any:
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    weight = "bold" if bold else "normal"
    return FT2Font(font_manager.findfont(font_manager.FontProperties(family="DejaVu Sans", weight=weight)))


def text_width(text: str, size: float = FONT_SIZE, bold: bool = False) -> float:
    """Advance width of ``text`` in points, in DejaVu Sans at ``size`` points."""
    font = _font(bold)
    font.set_size(size, 72)
    font.set_text(text, 0.0)
    return font.get_width_height()[0] / 64


def short(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def box_lines(spec: OrchestrationSpec, agent_id: str) -> tuple[str, ...]:
    """The label of one agent: id and role, then base role and capacity, then the output mark."""
    agent = spec.agent(agent_id)
    lines = (f"{short(agent.id, ID_CHARS)} \u00b7 {short(agent.role, ROLE_CHARS)}",
             f"{agent.base_role} \u00b7 {agent.capacity}")
    return (*lines, "\u2605 output") if agent_id == spec.output else lines


def _box_size(lines: Sequence[str]) -> tuple[float, float]:
    width = max(text_width(line, bold=i == 0) for i, line in enumerate(lines))
    return width + 2 * PAD_X, len(lines) * LINE_HEIGHT + 2 * PAD_Y


# --- steps 1-3: layers, waypoints, order -----------------------------------------------------------------
@dataclass
class _Graph:
    """Layers of node keys (agent ids, or (source, target, layer) waypoints) and the links between
    neighbouring layers; every edge becomes a chain of links through its waypoints."""

    layers: list[list[Any]]
    up: dict[Any, list[Any]]  # node -> its neighbours one layer higher
    down: dict[Any, list[Any]]  # node -> its neighbours one layer lower
    chains: list[list[Any]]  # per edge: source, waypoints..., target


def _graph(spec: OrchestrationSpec) -> _Graph:
    depth = {a.id: i for i, level in enumerate(spec.levels()) for a in level}
    layers: list[list[Any]] = [[a.id for a in level] for level in spec.levels()]
    up: dict[Any, list[Any]] = {node: [] for layer in layers for node in layer}
    down: dict[Any, list[Any]] = {node: [] for layer in layers for node in layer}
    chains = []
    for agent in spec.agents:
        for parent in agent.depends_on:
            chain = [parent, *((parent, agent.id, d) for d in range(depth[parent] + 1, depth[agent.id])), agent.id]
            for waypoint in chain[1:-1]:
                layers[waypoint[2]].append(waypoint)
                up[waypoint], down[waypoint] = [], []
            for upper, lower in pairwise(chain):
                down[upper].append(lower)
                up[lower].append(upper)
            chains.append(chain)
    return _Graph(layers, up, down, chains)


def _crossings(upper: list[Any], lower: list[Any], down: dict[Any, list[Any]]) -> int:
    pos = {node: i for i, node in enumerate(lower)}
    links = [(i, pos[child]) for i, node in enumerate(upper) for child in down[node]]
    return sum(1 for a, (i, j) in enumerate(links) for k, m in links[a + 1 :] if (i - k) * (j - m) < 0)


def _total_crossings(graph: _Graph) -> int:
    return sum(_crossings(a, b, graph.down) for a, b in pairwise(graph.layers))


def _sort_by_barycentre(layer: list[Any], reference: list[Any], neighbours: dict[Any, list[Any]]) -> list[Any]:
    """``layer`` sorted by the mean position of each node's neighbours in ``reference``; a node without
    neighbours there keeps its own position, so unrelated agents stay in declaration order."""
    pos = {node: i for i, node in enumerate(reference)}

    def key(item: tuple[int, Any]) -> tuple[float, int]:
        i, node = item
        linked = [pos[n] for n in neighbours[node]]
        return (sum(linked) / len(linked) if linked else i * len(reference) / max(len(layer), 1)), i

    return [node for _, node in sorted(enumerate(layer), key=key)]


def _order(graph: _Graph) -> None:
    """Reorder ``graph.layers`` in place to reduce edge crossings (kept only when a sweep improves)."""
    best, best_crossings = [list(layer) for layer in graph.layers], _total_crossings(graph)
    for _ in range(SWEEPS):
        if best_crossings == 0:
            break
        for i in range(1, len(graph.layers)):
            graph.layers[i] = _sort_by_barycentre(graph.layers[i], graph.layers[i - 1], graph.up)
        for i in range(len(graph.layers) - 2, -1, -1):
            graph.layers[i] = _sort_by_barycentre(graph.layers[i], graph.layers[i + 1], graph.down)
        crossings = _total_crossings(graph)
        if crossings < best_crossings:
            best, best_crossings = [list(layer) for layer in graph.layers], crossings
    graph.layers = best


# --- step 4: x positions ----------------------------------------------------------------------------------
def _closest_in_order(wanted: list[float], gaps: list[float]) -> list[float]:
    """Positions x minimising sum (x_i - wanted_i)^2 subject to x_{i+1} - x_i >= gaps_i.

    With offsets s_i = gaps_0 + ... + gaps_{i-1}, y_i = x_i - s_i must be non-decreasing, which is
    isotonic regression of wanted_i - s_i: pool adjacent violators, then add the offsets back."""
    offsets = [0.0]
    for gap in gaps:
        offsets.append(offsets[-1] + gap)
    blocks: list[list[float]] = []  # [mean, count]
    for target in (w - s for w, s in zip(wanted, offsets, strict=True)):
        blocks.append([target, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    flat = [mean for mean, count in blocks for _ in range(int(count))]
    return [y + s for y, s in zip(flat, offsets, strict=True)]


def _x_centres(graph: _Graph, widths: dict[Any, float]) -> dict[Any, float]:
    """Centre x of every node: each layer packed and centred, then pulled toward its neighbours."""
    x: dict[Any, float] = {}
    for layer in graph.layers:
        total = sum(widths[n] for n in layer) + GAP_X * (len(layer) - 1)
        left = -total / 2
        for node in layer:
            x[node] = left + widths[node] / 2
            left += widths[node] + GAP_X
    passes = [(range(1, len(graph.layers)), graph.up), (range(len(graph.layers) - 2, -1, -1), graph.down)]
    for _ in range(SWEEPS):
        for indices, neighbours in passes:
            for i in indices:
                layer = graph.layers[i]
                wanted = [sum(x[n] for n in neighbours[node]) / len(neighbours[node]) if neighbours[node]
                          else x[node] for node in layer]
                gaps = [(widths[a] + widths[b]) / 2 + GAP_X for a, b in pairwise(layer)]
                x.update(zip(layer, _closest_in_order(wanted, gaps), strict=True))
    return x


# --- step 5 and the whole layout ----------------------------------------------------------------------------
def _ports(count: int, centre: float, width: float) -> list[float]:
    """Where ``count`` arrows meet one side of a box: spread around its centre, inside its middle part."""
    if count == 1:
        return [centre]
    span = min(PORT_SPREAD * (count - 1), width * 0.6)
    return [centre - span / 2 + span * k / (count - 1) for k in range(count)]


def _edges(graph: _Graph, boxes: dict[str, Box], x: dict[Any, float], rows: list[tuple[float, float]]) -> list[Edge]:
    """Each chain as points: the source's bottom port, each waypoint's top and bottom, the target's top port;
    ports are assigned left to right by where the other end of the arrow lies, so arrows do not cross there."""
    outgoing: dict[str, list[int]] = {}
    incoming: dict[str, list[int]] = {}
    for k, chain in enumerate(graph.chains):
        outgoing.setdefault(chain[0], []).append(k)
        incoming.setdefault(chain[-1], []).append(k)
    start: dict[int, Point] = {}
    end: dict[int, Point] = {}
    for agent_id, ks in outgoing.items():
        box = boxes[agent_id]
        ks.sort(key=lambda k: x[graph.chains[k][1]])
        for k, px in zip(ks, _ports(len(ks), box.centre_x, box.width), strict=True):
            start[k] = (px, box.y + box.height)
    for agent_id, ks in incoming.items():
        box = boxes[agent_id]
        ks.sort(key=lambda k: x[graph.chains[k][-2]])
        for k, px in zip(ks, _ports(len(ks), box.centre_x, box.width), strict=True):
            end[k] = (px, box.y)
    edges = []
    for k, chain in enumerate(graph.chains):
        middle = [(x[w], y) for w in chain[1:-1] for y in rows[w[2]]]
        edges.append(Edge(chain[0], chain[-1], (start[k], *middle, end[k])))
    return edges


def _legend(levels: Sequence[str], top: float) -> list[LegendCell]:
    cells, left = [], MARGIN
    for level in (None, *levels):
        width = text_width(level or "capacity", LEGEND_SIZE) + 12
        cells.append(LegendCell(level, left, top, width, LEGEND_HEIGHT))
        left += width
    return cells


def layout(spec: OrchestrationSpec, levels: Sequence[str]) -> Layout:
    """Boxes, arrows and the capacity legend (``levels`` cheapest first) of ``spec``, in points."""
    graph = _graph(spec)
    _order(graph)
    lines = {a.id: box_lines(spec, a.id) for a in spec.agents}
    sizes = {agent_id: _box_size(label) for agent_id, label in lines.items()}
    widths = {node: sizes[node][0] if isinstance(node, str) else WAYPOINT_WIDTH
              for layer in graph.layers for node in layer}
    x = _x_centres(graph, widths)
    shift = MARGIN - min(x[n] - widths[n] / 2 for n in x)
    x = {n: v + shift for n, v in x.items()}
    rows, top = [], MARGIN
    for layer in graph.layers:
        height = max((sizes[n][1] for n in layer if isinstance(n, str)), default=LINE_HEIGHT)
        rows.append((top, top + height))
        top += height + GAP_Y
    boxes = {}
    for i, layer in enumerate(graph.layers):
        row_top, row_bottom = rows[i]
        for agent_id in (n for n in layer if isinstance(n, str)):
            width, height = sizes[agent_id]
            y = row_top + (row_bottom - row_top - height) / 2
            boxes[agent_id] = Box(agent_id, x[agent_id] - width / 2, y, width, height, lines[agent_id])
    legend = _legend(levels, rows[-1][1] + LEGEND_GAP)
    width = max(max(x[n] + widths[n] / 2 for n in x), legend[-1].x + legend[-1].width) + MARGIN
    return Layout(boxes, _edges(graph, boxes, x, rows), legend, width, legend[-1].y + LEGEND_HEIGHT + MARGIN)
