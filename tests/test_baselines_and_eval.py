"""Baselines are valid specs of the intended shape; `lemon eval` runs end to end and fails clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import build_tiny_chat_model  # tests/ is on sys.path (rootdir-less import)
from typer.testing import CliRunner

from lemon_core.baselines import (
    BASELINES,
    baseline_spec,
    chain,
    complete_graph,
    cot,
    debate,
    self_consistency,
    team_structure,
    tree,
)
from lemon_core.cli import app
from lemon_core.spec import AgentSpec, OrchestrationSpec, render_spec, validate_spec
from lemon_core.spec_text import parse_spec

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.mark.parametrize("method", sorted(BASELINES))
def test_every_baseline_is_a_valid_spec_that_round_trips(method: str) -> None:
    spec = baseline_spec(method, "large", cheapest="small")
    validate_spec(spec, ["small", "large"])
    assert parse_spec(render_spec(spec), pool=["small", "large"]).spec == spec


def test_baseline_topologies() -> None:
    sc = self_consistency("large", n=5, vote_capacity="small")
    assert [len(level) for level in sc.levels()] == [5, 1]
    assert sc.agent("vote").capacity == "small" and len(sc.agent("vote").depends_on) == 5
    assert [len(level) for level in chain("large", 4).levels()] == [1, 1, 1, 1]
    assert [len(level) for level in tree("large", 3).levels()] == [1, 3, 1]
    d = debate("large", debaters=3, rounds=2)
    assert [len(level) for level in d.levels()] == [3, 3, 1]
    assert d.agent("r2d1").depends_on == ["r1d1", "r1d2", "r1d3"]


def team(*agents: tuple[str, str, str, list[str]], output: str) -> OrchestrationSpec:
    """A spec from (id, base_role, capacity, depends_on) tuples; roles and duties are filler text."""
    return OrchestrationSpec(agents=[AgentSpec(id=i, role=f"Role of {i}", base_role=b, duty=f"Duty of {i}.", capacity=c,
                                               depends_on=d) for i, b, c, d in agents], output=output)


def test_team_structure_ignores_free_text_ids_and_declaration_order() -> None:
    """The 2026-12 report said 'same spec as a baseline: none' for CoT@large with its solver renamed."""
    renamed = team(("solve", "solver", "large", []), output="solve")
    assert team_structure(renamed) == team_structure(cot("large"))
    assert team_structure(renamed) != team_structure(cot("small")), "the capacity is part of the team"
    # tree(): planner -> 2 solvers -> aggregator, here with other ids and the branches declared the other way
    mirrored = team(("p", "planner", "large", []), ("y", "solver", "large", ["p"]), ("x", "solver", "large", ["p"]),
                    ("m", "aggregator", "large", ["x", "y"]), output="m")
    assert team_structure(mirrored) == team_structure(tree("large"))
    # unlike tree's, these two middle agents differ: declaring them in the other order is still the same team
    first = team(("p", "planner", "small", []), ("a", "solver", "medium", ["p"]), ("b", "solver", "small", ["p"]),
                 ("r", "solver", "large", []), ("c", "verifier", "large", ["a", "b", "r"]), output="c")
    second = team(("r", "solver", "large", []), ("plan", "planner", "small", []), ("s", "solver", "small", ["plan"]),
                  ("m", "solver", "medium", ["plan"]), ("v", "verifier", "large", ["r", "s", "m"]), output="v")
    assert team_structure(first) == team_structure(second)


@pytest.mark.parametrize("change", ["capacity", "base_role", "edge", "output"])
def test_team_structure_tells_apart_teams_that_differ_in_structure(change: str) -> None:
    agents = {"p": ("p", "planner", "large", []), "x": ("x", "solver", "large", ["p"]),
              "y": ("y", "solver", "large", ["p"]), "m": ("m", "aggregator", "large", ["x", "y"])}
    output = "m"
    if change == "capacity":
        agents["y"] = ("y", "solver", "small", ["p"])
    elif change == "base_role":
        agents["y"] = ("y", "verifier", "large", ["p"])
    elif change == "edge":
        agents["m"] = ("m", "aggregator", "large", ["x", "y", "p"])
    elif change == "output":  # the same graph, but a solver's answer is final
        output = "x"
    assert team_structure(team(*agents.values(), output=output)) != team_structure(tree("large"))


def test_team_structure_tells_apart_two_wirings_of_the_same_agents_and_edge_count() -> None:
    """Both: two planners, two solvers, an aggregator reading three agents, five edges. In the first the
    aggregator reads the planner nothing else reads; in the second one that also feeds a solver."""
    def wiring(y_reads: str, m_reads: list[str]) -> OrchestrationSpec:
        return team(("p", "planner", "large", []), ("q", "planner", "large", []), ("x", "solver", "large", ["p"]),
                    ("y", "solver", "large", [y_reads]), ("m", "aggregator", "large", m_reads), output="m")

    assert team_structure(wiring("p", ["x", "y", "q"])) != team_structure(wiring("q", ["x", "y", "p"]))


def test_every_baseline_has_a_team_structure_of_its_own() -> None:
    teams = [cot(), chain(), self_consistency(), tree(), complete_graph(), debate(), chain(length=2)]
    assert len({team_structure(t) for t in teams}) == len(teams)


def test_unknown_baseline_names_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown method 'tot'.*cot"):
        baseline_spec("tot", "large")


@pytest.fixture(scope="module")
def tiny_pool_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tinypool")
    model = build_tiny_chat_model(root / "model", seed=0)
    pool = root / "pool.yaml"
    pool.write_text(
        "levels:\n"
        f"  - {{name: small, backend: transformers, model: '{model}', price_in_per_1m: 1.0,"
        " price_out_per_1m: 2.0, max_tokens: 8}\n"
        f"  - {{name: large, backend: transformers, model: '{model}', price_in_per_1m: 5.0,"
        " price_out_per_1m: 10.0, max_tokens: 8}\n"
    )
    return pool


def test_eval_command_writes_traces_and_summary(tiny_pool_file: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [
        "eval", "--benchmark", "multiarith", "--method", "sc", "--pool", str(tiny_pool_file),
        "--limit", "3", "--data-dir", str(DATA), "--out", str(tmp_path), "--batch-size", "2",
    ])
    assert result.exit_code == 0, result.output
    out = tmp_path / "multiarith-sc"
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    assert summary["n"] == 3 and len(records) == 3
    assert summary["failures"] == 0
    # self-consistency: 3 solvers at 'large' + the vote at the cheapest level, every call recorded
    assert [a["capacity"] for a in records[0]["agents"]] == ["large"] * 3 + ["small"]
    assert records[0]["cost"] > 0 and records[0]["tokens"] > 0
    assert summary["mean_cost_usd"] == pytest.approx(sum(r["cost"] for r in records) / 3)
    assert {r["id"] for r in records} == {"multiarith/test/0", "multiarith/test/1", "multiarith/test/2"}


@pytest.mark.parametrize(("args", "message"), [
    (["--method", "nope"], "unknown method 'nope'"),
    (["--method", "spec-file"], "--method spec-file needs --spec"),
    (["--method", "spec-file", "--spec", "/nonexistent.yaml"], "not found"),
    (["--capacity", "huge"], "--capacity 'huge' is not a level"),
    (["--pool", "/nonexistent-pool.yaml"], "pool file '/nonexistent-pool.yaml' not found"),
])
def test_eval_command_bad_arguments_are_clear(args: list[str], message: str, tiny_pool_file: Path) -> None:
    base = ["eval", "--benchmark", "gsm8k", "--limit", "1", "--data-dir", str(DATA)]
    if "--pool" not in args:
        base += ["--pool", str(tiny_pool_file)]
    result = CliRunner().invoke(app, base + args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_eval_command_rejects_invalid_spec_file(tiny_pool_file: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("agents:\n  - {id: a1, role: R, base_role: solver, duty: d, capacity: gigantic}\noutput: a1\n")
    result = CliRunner().invoke(app, ["eval", "--benchmark", "gsm8k", "--method", "spec-file", "--spec", str(bad),
                                      "--pool", str(tiny_pool_file), "--data-dir", str(DATA)])
    assert result.exit_code == 2
    assert "a1" in result.output and "capacity" in result.output and "gigantic" in result.output
