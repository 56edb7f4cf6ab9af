"""Spec pictures (lemon_core/spec_picture.py) and ``lemon spec show`` (lemon_core/cli_spec.py)."""

from __future__ import annotations

import io
import shutil
import struct
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lemon_core.baselines import chain, complete_graph, cot, debate, self_consistency, tree
from lemon_core.cli_spec import spec_app
from lemon_core.spec import AgentSpec
from lemon_core.spec_layout import layout, text_width
from lemon_core.spec_picture import (
    PALETTE,
    SpecPictureError,
    level_colours,
    level_order,
    spec_png,
    spec_svg,
    spec_text,
    topology,
    write_spec_picture,
)
from lemon_core.spec_text import parse_spec

SVG = "{http://www.w3.org/2000/svg}"

FOUR_AGENTS = """agents:
  - id: plan
    role: Arithmetic planner
    base_role: planner
    duty: Break the word problem into numbered steps.
    capacity: small
    depends_on: []
  - id: solve_a
    role: Careful calculator
    base_role: solver
    duty: Carry out the steps and give the final number.
    capacity: medium
    depends_on: [plan]
  - id: solve_b
    role: Backwards solver
    base_role: solver
    duty: Solve it from the question alone, then compare.
    capacity: small
    depends_on: [plan]
  - id: check
    role: Answer checker
    base_role: verifier
    duty: Check both solutions and state the final number.
    capacity: large
    depends_on: [solve_a, solve_b]
output: check
"""


def spec4():
    return parse_spec(FOUR_AGENTS).spec


def agent_groups(svg: str) -> dict[str, ET.Element]:
    root = ET.fromstring(svg)
    return {g.get("data-agent"): g for g in root.iter(f"{SVG}g") if "agent" in (g.get("class") or "").split()}


def box_of(group: ET.Element) -> tuple[float, float, float, float]:
    """x, y, width, height of an agent's (inner, filled) box."""
    rect = group.find(f"{SVG}rect")
    return tuple(float(rect.get(k)) for k in ("x", "y", "width", "height"))


def test_svg_has_every_agent_edge_colour_and_the_output_mark() -> None:
    svg = spec_svg(spec4(), levels=["small", "medium", "large"])
    nodes = agent_groups(svg)
    assert set(nodes) == {"plan", "solve_a", "solve_b", "check"}
    root = ET.fromstring(svg)
    edges = {(g.get("data-source"), g.get("data-target")) for g in root.iter(f"{SVG}g") if g.get("class") == "edge"}
    assert edges == {("plan", "solve_a"), ("plan", "solve_b"), ("solve_a", "check"), ("solve_b", "check")}
    fills = {name: g.find(f"{SVG}rect").get("fill") for name, g in nodes.items()}
    assert fills == {"plan": PALETTE[0], "solve_b": PALETTE[0], "solve_a": PALETTE[2], "check": PALETTE[-1]}
    # the output agent is drawn with a double border (two outlines) and says so
    assert len(nodes["check"].findall(f"{SVG}rect")) == 2
    assert len(nodes["plan"].findall(f"{SVG}rect")) == 1
    assert nodes["check"].get("fill") == "white" and nodes["plan"].get("fill") == "black", "text readable on its fill"
    texts = {name: " ".join(t.text or "" for t in g.iter(f"{SVG}text")) for name, g in nodes.items()}
    assert "Careful calculator" in texts["solve_a"] and "solver" in texts["solve_a"] and "medium" in texts["solve_a"]
    assert "output" in texts["check"] and "output" not in texts["plan"]
    assert nodes["plan"].find(f"{SVG}title").text == "Break the word problem into numbered steps.", "hover: duty"
    # each agent is drawn below the ones it reads (SVG y grows downwards)
    y = {name: box_of(g)[1] for name, g in nodes.items()}
    assert y["plan"] < y["solve_a"] == y["solve_b"] < y["check"]
    legend = " ".join(t.text for t in root.find(f".//{SVG}g[@id='legend']").iter(f"{SVG}text"))
    assert legend == "capacity small medium large"


def test_pictures_need_neither_graphviz_nor_dot(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pip install` alone gives pictures: no Graphviz program or bindings are looked for."""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "graphviz", None)  # importing it now fails
    assert spec_svg(spec4()).startswith("<svg")
    assert spec_png(spec4()).startswith(b"\x89PNG")


def overlaps(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


@pytest.mark.parametrize("spec", [spec4(), cot(), chain(), self_consistency(), tree(), complete_graph(), debate()],
                         ids=["four", "cot", "chain", "sc", "tree", "complete", "debate"])
def test_layout_keeps_boxes_apart_inside_the_canvas_and_wide_enough_for_their_text(spec) -> None:
    picture = layout(spec, level_order(spec))
    boxes = [(b.x, b.y, b.width, b.height) for b in picture.boxes.values()]
    assert not any(overlaps(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    assert all(x >= 0 and y >= 0 and x + w <= picture.width and y + h <= picture.height for x, y, w, h in boxes)
    for box in picture.boxes.values():
        assert all(text_width(line, bold=i == 0) < box.width - 10 for i, line in enumerate(box.lines)), box.lines
    for edge in picture.edges:
        source, target = picture.boxes[edge.source], picture.boxes[edge.target]
        assert edge.points[0][1] == source.y + source.height and source.x < edge.points[0][0] < source.x + source.width
        assert edge.points[-1][1] == target.y and target.x < edge.points[-1][0] < target.x + target.width


def test_an_edge_that_skips_a_layer_goes_around_the_boxes_there() -> None:
    picture = layout(complete_graph(), ["large"])  # a1 -> a3 passes the layer of a2
    (long_edge,) = [e for e in picture.edges if (e.source, e.target) == ("a1", "a3")]
    middle = picture.boxes["a2"]
    passing = [x for x, y in long_edge.points if middle.y <= y <= middle.y + middle.height]
    assert len(passing) == 2 and all(not middle.x <= x <= middle.x + middle.width for x in passing)


def test_layout_orders_a_layer_to_avoid_crossings() -> None:
    """Declared crosswise (m1 reads r2, m2 reads r1), each reader is still placed under what it reads."""
    spec = cot().model_copy(update={"agents": [
        AgentSpec(id=i, role=i, base_role="solver", duty="d", capacity="large", depends_on=deps)
        for i, deps in (("r1", []), ("r2", []), ("m1", ["r2"]), ("m2", ["r1"]), ("out", ["m1", "m2"]))
    ], "output": "out"})
    x = {name: box.centre_x for name, box in layout(spec, ["large"]).boxes.items()}
    assert (x["m1"] < x["m2"]) == (x["r2"] < x["r1"])


def test_labels_are_escaped() -> None:
    spec = cot("small").model_copy(deep=True)
    spec.agents[0].role = 'Solver <b>"&</b>'
    svg = spec_svg(spec)
    text = " ".join(t.text or "" for t in ET.fromstring(svg).iter(f"{SVG}text"))
    assert 'Solver <b>"&</b>' in text


def test_png_and_write_by_suffix(tmp_path: Path) -> None:
    from PIL import Image

    png = spec_png(spec4(), levels=["small", "medium", "large"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width > 200 and height > 150
    colours = {rgb: n for n, rgb in Image.open(io.BytesIO(png)).convert("RGB").getcolors(maxcolors=1 << 20)}
    dark = tuple(int(PALETTE[-1][i : i + 2], 16) for i in (1, 3, 5))
    assert colours.get(dark, 0) > 2000, "the large agent's box is painted in the dark end of the palette"
    out = write_spec_picture(spec4(), tmp_path / "pics" / "spec.svg")
    assert out.read_text().startswith("<svg")
    with pytest.raises(SpecPictureError, match=r"\.svg or \.png"):
        write_spec_picture(spec4(), tmp_path / "spec.jpg")


def test_level_order_and_colours() -> None:
    spec = spec4()
    assert level_order(spec) == ["small", "medium", "large"], "usual names sort cheapest first"
    assert level_order(spec, ["large", "medium", "small"]) == ["large", "medium", "small"], "pool order wins"
    assert level_order(spec, ["small", "large"]) == ["small", "large", "medium"], "unknown-to-pool levels appended"
    odd = cot("q4").model_copy(deep=True)
    assert level_order(odd) == ["q4"]
    colours = level_colours(["small", "medium", "large"])
    assert colours == {"small": PALETTE[0], "medium": PALETTE[2], "large": PALETTE[-1]}
    assert len(set(level_colours([f"l{i}" for i in range(6)]).values())) == 6


def test_text_tree_of_a_four_agent_spec() -> None:
    assert spec_text(spec4()) == (
        "spec: 4 agents, depth 3, topology diamond, output check\n"
        "\u2605 check  Answer checker  [verifier \u00b7 large]\n"
        "\u2502  duty: Check both solutions and state the final number.\n"
        "\u251c\u2500\u2500 solve_a  Careful calculator  [solver \u00b7 medium]\n"
        "\u2502   \u2502  duty: Carry out the steps and give the final number.\n"
        "\u2502   \u2514\u2500\u2500 plan  Arithmetic planner  [planner \u00b7 small]\n"
        "\u2502          duty: Break the word problem into numbered steps.\n"
        "\u2514\u2500\u2500 solve_b  Backwards solver  [solver \u00b7 small]\n"
        "    \u2502  duty: Solve it from the question alone, then compare.\n"
        "    \u2514\u2500\u2500 plan (see above)\n"
    )


def test_text_tree_lists_agents_the_output_never_reads() -> None:
    # parse_spec now refuses such a spec (spec.py: every agent must feed the output), but a counterfactual
    # "drop a dependency" edit can build one, and the text tree must still show it honestly
    valid = parse_spec(FOUR_AGENTS).spec
    spec = valid.model_copy(update={"output": "solve_a"})
    text = spec_text(spec)
    assert text.splitlines()[1].startswith("\u2605 solve_a")
    tail = text.split("not read on the way to the output:\n")[1]
    assert "solve_b" in tail and "check" in tail and "plan (see above)" in tail


def test_topology_names() -> None:
    assert topology(cot()) == "single"
    assert topology(chain()) == "chain"
    assert topology(self_consistency()) == "fan-in"
    assert topology(tree()) == "diamond"
    assert topology(spec4()) == "diamond"
    assert topology(complete_graph()) == "dag"
    assert topology(debate()) == "dag"
    assert topology(spec4().model_dump()) == "diamond", "dicts from traces.jsonl work too"


def test_cli_spec_show(tmp_path: Path) -> None:
    runner = CliRunner()
    spec_file = tmp_path / "team.yaml"
    spec_file.write_text(FOUR_AGENTS)
    res = runner.invoke(spec_app, ["show", str(spec_file)])
    assert res.exit_code == 0, res.output
    assert res.output == spec_text(spec4())

    bad = tmp_path / "bad.yaml"
    bad.write_text(FOUR_AGENTS.replace("depends_on: [plan]\n  - id: solve_b", "depends_on: [plann]\n  - id: solve_b"))
    res = runner.invoke(spec_app, ["show", str(bad)])
    assert res.exit_code == 2 and "depends_on" in res.output and "plann" in res.output

    binary = tmp_path / "team.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    res = runner.invoke(spec_app, ["show", str(binary)])
    assert res.exit_code == 2 and "not UTF-8 text" in res.output

    res = runner.invoke(spec_app, ["show", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2 and "does not exist" in res.output

    res = runner.invoke(spec_app, ["show", str(spec_file), "--out", str(tmp_path / "team.gif")])
    assert res.exit_code == 2 and ".svg or .png" in res.output


def test_cli_spec_show_writes_pictures(tmp_path: Path) -> None:
    runner = CliRunner()
    spec_file = tmp_path / "team.yaml"
    spec_file.write_text(FOUR_AGENTS)
    for name in ("team.svg", "team.png"):
        res = runner.invoke(spec_app, ["show", str(spec_file), "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        assert (tmp_path / name).stat().st_size > 1000
    assert set(agent_groups((tmp_path / "team.svg").read_text())) == {"plan", "solve_a", "solve_b", "check"}
