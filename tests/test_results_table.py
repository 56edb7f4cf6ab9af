"""The printed table of a pipeline run: the SFT-only orchestrator beside the trained one, the paired test on the same
problems, the comparison over all benchmarks and each method's mean training reward."""

from __future__ import annotations

import json
from pathlib import Path

from lemon_core.cli_pipeline import results_table


def _cell(root: Path, benchmark: str, method: str, scores: list[float], reward: float, sampled: list[float] | None,
          own: float | None = None) -> None:
    folder = root / "eval" / f"{benchmark}-{method}"
    folder.mkdir(parents=True)
    n = len(scores)
    records = [{"id": f"{benchmark}/{i}", "score": s, **({"sampled_reward": sampled[i]} if sampled else {})}
               for i, s in enumerate(scores)]
    (folder / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"benchmark": benchmark, "method": method, "n": n, "accuracy": sum(scores) / n, "accuracy_ci_low": 0.0,
               "accuracy_ci_high": 1.0, "valid_rate": 1.0, "mean_cost_usd": 1e-5, "orchestrator_cost_usd": own,
               "mean_tokens": 100, "mean_reward": reward}
    if sampled:
        summary |= {"sampled_reward": sum(sampled) / n, "sampled_reward_ci": [0.0, 1.0], "sampled_k": 4}
    (folder / "summary.json").write_text(json.dumps(summary))


def test_trained_and_sft_rows_side_by_side_with_the_paired_test(tmp_path: Path) -> None:
    # multiarith: lemon wins 10 problems lemon-sft lost and loses none; mmlu: a tie
    _cell(tmp_path, "multiarith", "lemon", [1.0] * 10 + [0.0] * 10, 0.4, [0.5] * 20, own=1e-6)
    _cell(tmp_path, "multiarith", "lemon-sft", [0.0] * 20, 0.0, [0.1] * 20, own=1e-6)
    _cell(tmp_path, "mmlu", "lemon", [1.0, 0.0] * 5, 0.2, [0.2] * 10, own=1e-6)
    _cell(tmp_path, "mmlu", "lemon-sft", [1.0, 0.0] * 5, 0.2, [0.2] * 10, own=1e-6)
    _cell(tmp_path, "multiarith", "cot@large", [1.0] * 12 + [0.0] * 8, 0.5, None)
    lines = results_table(str(tmp_path))
    rows = {tuple(line.split()[:2]): line for line in lines if line.split()[1] in ("lemon", "lemon-sft", "cot@large")}
    assert set(rows) == {("mmlu", "lemon"), ("mmlu", "lemon-sft"), ("multiarith", "lemon"),
                         ("multiarith", "lemon-sft"), ("multiarith", "cot@large")}
    assert rows[("multiarith", "lemon")].endswith(f"p={2 / 2**10:.3g}")  # 10 won, 0 lost: 2 · (1/2)^10
    assert rows[("mmlu", "lemon")].endswith("p=1")  # no discordant problem
    assert "p=" not in rows[("multiarith", "lemon-sft")] and "p=" not in rows[("multiarith", "cot@large")]
    assert "sampled_reward=0.500 [0.00, 1.00] (k=4)" in rows[("multiarith", "lemon")]
    accuracy = next(line for line in lines if "all benchmarks, accuracy" in line)
    assert "10 won / 0 lost of 30" in accuracy and f"p={2 / 2**10:.3g}" in accuracy
    sampled = next(line for line in lines if "all benchmarks, sampled_reward" in line)
    assert "20 won / 0 lost of 30" in sampled and "+0.267" in sampled  # 20 · 0.4 / 30
    reward = next(line for line in lines if line.startswith("mean reward"))
    assert reward.index("cot@large 0.500") < reward.index("lemon 0.333")  # ranked; lemon pooled (0.4·20+0.2·10)/30
    assert "lemon-sft 0.067" in reward


def test_a_run_without_an_sft_row_prints_no_test(tmp_path: Path) -> None:
    _cell(tmp_path, "multiarith", "lemon", [1.0, 0.0], 0.4, None)
    _cell(tmp_path, "multiarith", "cot", [1.0, 1.0], 0.9, None)
    lines = results_table(str(tmp_path))
    assert not any(" p=" in line or " vs " in line for line in lines)
    assert lines[-1].startswith("mean reward") and "cot 0.900" in lines[-1]
