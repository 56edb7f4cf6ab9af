"""Spec pictures (lemon_core/spec_picture.py) and ``lemon spec show`` (lemon_core/cli_spec.py)."""

from __future__ import annotations

import os
import shutil
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lemon_core.baselines import chain, complete_graph, cot, debate, self_consistency, tree
from lemon_core.cli_spec import spec_app
from lemon_core.spec import parse_spec
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

SVG = "{http://www.w3.org/2000/svg}"
XLINK = "{http://www.w3.org/1999/xlink}"

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


def need_dot() -> None:
    """Graphviz's dot (Debian package) and its Python bindings (pyproject): CI has both, so there a
    missing one is a failure; elsewhere the test skips and says what to install."""
    try:
        import graphviz  # noqa: F401
    except ImportError:
        missing = "the graphviz Python package (pip install 'graphviz>=0.20')"
    else:
        missing = "" if shutil.which("dot") else "Graphviz's dot (apt-get install graphviz)"
    if missing and os.environ.get("CI") == "true":
        pytest.fail(f"{missing} is missing in CI; .ci/install_chromium.sh and pyproject.toml provide them")
    if missing:
        pytest.skip(f"{missing} is not installed")


def spec4():
    return parse_spec(FOUR_AGENTS).spec


def agent_groups(svg: str) -> dict[str, ET.Element]:
    root = ET.fromstring(svg)
    return {
        g.find(f"{SVG}title").text: g
        for g in root.iter(f"{SVG}g")
        if "agent" in (g.get("class") or "").split()
    }


def test_svg_has_every_agent_edge_colour_and_the_output_mark() -> None:
    need_dot()
    svg = spec_svg(spec4(), levels=["small", "medium", "large"])
    nodes = agent_groups(svg)
    assert set(nodes) == {"plan", "solve_a", "solve_b", "check"}
    root = ET.fromstring(svg)
    edges = {g.find(f"{SVG}title").text for g in root.iter(f"{SVG}g") if g.get("class") == "edge"}
    assert edges == {"plan->solve_a", "plan->solve_b", "solve_a->check", "solve_b->check"}
    fills = {name: g.find(f".//{SVG}path").get("fill") for name, g in nodes.items()}
    assert fills == {"plan": PALETTE[0], "solve_b": PALETTE[0], "solve_a": PALETTE[2], "check": PALETTE[-1]}
    # the output agent is drawn with a double border (two outlines) and says so
    assert len(nodes["check"].findall(f".//{SVG}path")) == 2
    assert len(nodes["plan"].findall(f".//{SVG}path")) == 1
    texts = {name: " ".join(t.text or "" for t in g.iter(f"{SVG}text")) for name, g in nodes.items()}
    assert "Careful calculator" in texts["solve_a"] and "solver" in texts["solve_a"] and "medium" in texts["solve_a"]
    assert "output" in texts["check"] and "output" not in texts["plan"]
    links = {name: g.find(f".//{SVG}a").get(f"{XLINK}title") for name, g in nodes.items()}
    assert links["plan"] == "Break the word problem into numbered steps.", "hovering shows the duty"
    # the layout engine puts each agent below the ones it reads (SVG y grows downwards)
    y = {name: min(float(t.get("y")) for t in g.iter(f"{SVG}text")) for name, g in nodes.items()}
    assert y["plan"] < y["solve_a"] == y["solve_b"] < y["check"]


def test_labels_are_escaped() -> None:
    need_dot()
    spec = cot("small").model_copy(deep=True)
    spec.agents[0].role = 'Solver <b>"&</b>'
    svg = spec_svg(spec)
    text = " ".join(t.text or "" for t in ET.fromstring(svg).iter(f"{SVG}text"))
    assert 'Solver <b>"&</b>' in text


def test_png_and_write_by_suffix(tmp_path: Path) -> None:
    need_dot()
    png = spec_png(spec4())
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width > 200 and height > 150
    out = write_spec_picture(spec4(), tmp_path / "pics" / "spec.svg")
    assert out.read_text().startswith("<svg")
    with pytest.raises(SpecPictureError, match=r"\.svg or \.png"):
        write_spec_picture(spec4(), tmp_path / "spec.jpg")


def test_missing_dot_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SpecPictureError, match="apt-get install graphviz"):
        spec_svg(spec4())


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
    need_dot()
    runner = CliRunner()
    spec_file = tmp_path / "team.yaml"
    spec_file.write_text(FOUR_AGENTS)
    for name in ("team.svg", "team.png"):
        res = runner.invoke(spec_app, ["show", str(spec_file), "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        assert (tmp_path / name).stat().st_size > 1000
    assert set(agent_groups((tmp_path / "team.svg").read_text())) == {"plan", "solve_a", "solve_b", "check"}
