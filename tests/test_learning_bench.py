"""bench/learning.py: its split of MultiArith and a whole run on the simulated pool with a tiny policy.

The run's figures mean nothing here (a random tiny policy, a simulated pool); what is checked is that every method
is evaluated on the same test examples, that the files and the last line agree with each other, and that
``--only`` adds a baseline's row to an earlier run without losing the others."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from bench_modules import load_bench  # noqa: E402
from tiny_models import build_tiny_chat_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

TINY_CONFIG = """\
model: {model}
pool: simulated
seed: 0
include_roles: false
include_format: false
checkpoint_every: 100
eval_every: 0
data:
  benchmarks: [multiarith]
rollout:
  group_size: 4
  edits_per_spec: 1
  max_new_tokens: 128
  temperature: 1.0
  grammar: true
  grammar_max_agents: 2
  grammar_max_duty_chars: 8
  check_budget: false
sft:
  teacher: templated
  steps: 4
  batch_size: 4
  lr: 1.0e-3
  topologies: [cot]
  eval_tasks: 2
  eval_samples: 1
grpo:
  kl_coef: 0.04
optim:
  lr: 1.0e-4
  micro_batch_size: 8
"""


def test_the_test_split_is_fixed_and_disjoint_from_training_and_held_out_questions() -> None:
    learning = load_bench("learning.py", "learning_bench")
    train, test, held = learning.split_tasks(32, 60, 8)
    train_more, test_same, no_held = learning.split_tasks(40, 60, 0)
    assert [t.id for t in test] == [t.id for t in test_same] and len(test) == 60  # every run scores the same 60
    assert [t.id for t in train] == [t.id for t in train_more[:32]] and not no_held  # more tasks extend the list
    ids = [t.id for t in (*train, *test, *held)]
    assert len(ids) == len(set(ids)) == 100
    with pytest.raises(SystemExit, match="--train 500 \\+ --test 100"):
        learning.split_tasks(500, 100, 8)


def _run(*args: str) -> str:
    # one thread: two competing for a busy machine's two cores were several times slower (the README, "CPU speed")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "learning.py"), *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_quick_run_scores_every_method_on_the_same_examples_and_its_files_agree(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_CONFIG.format(model=build_tiny_chat_model(tmp_path / "tiny", seed=0)))
    out = tmp_path / "bench"
    stdout = _run("--config", str(config), "--quick", "--skip", "sc3@large", "--out", str(out))

    saved = json.loads((out / "learning.json").read_text())
    rows = {r["method"]: r for r in saved["rows"]}
    assert list(rows) == ["cot@small", "cot@large", "lemon-sft", "lemon", "grpo-only"]
    assert {r["n"] for r in rows.values()} == {16}  # --quick: 16 test examples for every method
    for r in rows.values():
        assert 0 <= r["accuracy_ci_low"] <= r["accuracy"] <= r["accuracy_ci_high"] <= 1
        assert r["accuracy"] <= r["valid_rate"]  # an invalid spec scores 0: accuracy never exceeds validity
    assert rows["cot@large"]["valid_rate"] == 1.0 and rows["cot@large"]["capacity_mix"]["large"] == 1.0
    assert saved["sft"]["teacher"] == "templated"

    # the last line is computed from the rows it saved (printed to 3 decimals)
    last = stdout.strip().splitlines()[-1]
    found = re.fullmatch(r"ratio=(\S+) cost_ratio=(\S+) cost_ratio_with_orchestrator=(\S+)", last)
    assert found, last
    lemon, cot_large = rows["lemon"], rows["cot@large"]
    assert float(found[1]) == pytest.approx(lemon["accuracy"] / cot_large["accuracy"], abs=6e-4)
    assert float(found[2]) == pytest.approx(lemon["mean_cost_usd"] / cot_large["mean_cost_usd"], abs=6e-4)
    assert "lemon above lemon-sft (" in stdout and "targets: " in stdout

    table = (out / "learning.md").read_text().splitlines()
    assert len(table) == 2 + len(rows) and table[2].startswith("| cot@small | ")
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {p.name for p in (out / "traces").iterdir()} == set(rows)
    examples = {method: [json.loads(line)["id"] for line in (out / "traces" / method / "traces.jsonl").open()]
                for method in rows}
    assert len(set(map(tuple, examples.values()))) == 1 and len(examples["lemon"]) == 16  # the same 16, in order

    # --only adds SC(3)@large's row to that run and keeps the others and the SFT figures
    _run("--config", str(config), "--quick", "--only", "sc3@large", "--out", str(out))
    again = json.loads((out / "learning.json").read_text())
    assert [r["method"] for r in again["rows"]] == [*rows, "sc3@large"]
    assert again["rows"][:5] == saved["rows"] and again["sft"] == saved["sft"]
    assert again["rows"][-1]["n"] == 16 and again["rows"][-1]["capacity_mix"]["large"] == 1.0


def _rows(lemon_scores: list[float], sft_scores: list[float], lemon_reward: float, best_reward: float) -> tuple:
    def row(method: str, scores: list[float], reward: float) -> dict:
        return {"method": method, "accuracy": sum(scores) / len(scores), "valid_rate": 1.0, "mean_reward": reward}

    rows = {"cot@small": row("cot@small", [0.0], 0.0), "cot@large": row("cot@large", lemon_scores, best_reward),
            "lemon-sft": row("lemon-sft", sft_scores, 0.0), "lemon": row("lemon", lemon_scores, lemon_reward)}
    traces = {m: [{"id": f"p{i}", "score": s} for i, s in enumerate(scores)]
              for m, scores in (("lemon", lemon_scores), ("lemon-sft", sft_scores))}
    return rows, traces


def test_the_targets_line_fails_an_orchestrator_that_did_not_learn() -> None:
    learning = load_bench("learning.py", "learning_bench")
    # the old main job: SFT already wrote CoT@large's spec, GRPO changed nothing, the copy pays its own call
    copy = [1.0] * 19 + [0.0] * 11
    line, met = learning.learning_targets(*_rows(copy, copy, lemon_reward=0.59, best_reward=0.60))
    assert not met and "lemon above lemon-sft" in line and line.count("not met") == 2
    # more problems won than lost, but not beyond chance (3 won, 1 lost): not met either
    sft = [0.0, 0.0, 0.0, 1.0] + [1.0] * 26
    lemon = [1.0, 1.0, 1.0, 0.0] + [1.0] * 26
    line, met = learning.learning_targets(*_rows(lemon, sft, lemon_reward=0.9, best_reward=0.8))
    assert not met and "p=0.625 < 0.05): not met" in line


def test_the_targets_line_passes_an_orchestrator_that_learned() -> None:
    learning = load_bench("learning.py", "learning_bench")
    sft, lemon = [0.0] * 30, [1.0] * 12 + [0.0] * 18  # 12 won, 0 lost: p = 2 / 2^12
    line, met = learning.learning_targets(*_rows(lemon, sft, lemon_reward=0.45, best_reward=0.40))
    assert met and "not met" not in line, line
