"""Baselines are valid specs of the intended shape; `lemon eval` runs end to end and fails clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import build_tiny_chat_model  # tests/ is on sys.path (rootdir-less import)
from typer.testing import CliRunner

from lemon_core.baselines import BASELINES, baseline_spec, chain, debate, self_consistency, tree
from lemon_core.cli import app
from lemon_core.spec import parse_spec, render_spec, validate_spec

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
