"""Ablation: GRPO only vs GRPO + localized counterfactual credit, same budget, simulated pool.

A tiny local policy is SFT-warmed on one-agent specs whose capacity is uniform over
small/medium/large (a tiny random model cannot learn longer specs in a CPU-minute), so the choice
left to learn is the capacity field. On MultiArith the known optimum is `small` everywhere.
Both arms use the same seed, SFT model,
number of GRPO steps, tasks and samples; the counterfactual arm additionally re-executes K
capacity/dependency/duty edits per spec (cheap: node cache) and puts Delta on the edited span.
Prints the final reward of both arms (mean rollout reward of the last steps and held-out eval
reward) and ratio=<cf / grpo-only> of the final rollout reward.

    python bench/credit.py [--steps 10] [--seeds 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_models import build_tiny_chat_model  # noqa: E402

from lemon_core.baselines import cot  # noqa: E402
from lemon_core.benchmarks import Example  # noqa: E402
from lemon_core.policy import spec_completion  # noqa: E402
from lemon_core.train import TrainConfig, train  # noqa: E402

LEVELS = ("small", "medium", "large")


def run_arm(
    model: Path,
    work: Path,
    tasks: list[Example],
    teacher: Path,
    steps: int,
    seed: int,
    cf: bool,
    cf_coef: float = 1.0,
) -> dict:
    cfg = TrainConfig(
        model=str(model),
        pool="simulated",
        out=str(work / f"{'cf' if cf else 'grpo'}-{seed}"),
        seed=seed,
        include_roles=False,
        include_format=False,
        iterations=steps,
        tasks_per_iteration=2,
        checkpoint_every=1000,
        progress=False,
        save_rollouts=False,
        rollout=dict(group_size=6, edits_per_spec=2 if cf else 0, max_new_tokens=128),
        sft=dict(
            steps=150, batch_size=6, lr=3e-3, pairs_per_task=0, teacher_jsonl=str(teacher), eval_tasks=0
        ),
        reward=dict(lambda_cost=1.0),
        grpo=dict(kl_coef=0.0, cf_coef=cf_coef if cf else 0.0),
        optim=dict(lr=3e-4, micro_batch_size=12),
    )
    result = train(
        cfg,
        examples=(tasks[:6], tasks[6:]),
        scorer=lambda answer, ex: float(answer.strip().endswith(f" {ex.answer}.")),
    )
    tail = result.metrics[-3:]
    return {
        "final_reward": statistics.fmean(m["reward/mean"] for m in tail),
        "eval_reward": result.metrics[-1].get("eval/reward"),
        "small_share": statistics.fmean(m.get("capacity/small", 0.0) for m in tail),
        "valid_rate": statistics.fmean(m["valid_rate"] for m in tail),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--cf-coef", type=float, default=1.0, help="beta of the counterfactual term")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tasks = [
        Example(
            id=f"t{i}",
            benchmark="multiarith",
            question=f"Tom has {i + 2} apples and gets {2 * i + 1} more. How many?",
            answer=str(3 * i + 3),
            answer_format="Answer with a number.",
        )
        for i in range(8)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = build_tiny_chat_model(work / "tiny", seed=0)
        teacher = work / "teacher.jsonl"
        rows = [
            json.dumps({"question": t.question, "spec": spec_completion(cot(lv))})
            for t in tasks[:6]
            for lv in LEVELS
        ]
        teacher.write_text("\n".join(rows) + "\n")
        arms: dict[str, list[dict]] = {"grpo": [], "grpo+cf": []}
        for seed in range(args.seeds):
            arms["grpo"].append(run_arm(model, work, tasks, teacher, args.steps, seed, cf=False))
            arms["grpo+cf"].append(
                run_arm(model, work, tasks, teacher, args.steps, seed, cf=True, cf_coef=args.cf_coef)
            )
    summary = {}
    for name, runs in arms.items():
        summary[name] = {k: statistics.fmean(r[k] for r in runs if r[k] is not None) for k in runs[0]}
        print(f"{name:8s} " + " ".join(f"{k}={v:.3f}" for k, v in summary[name].items()))
    print(f"ratio={summary['grpo+cf']['final_reward'] / summary['grpo']['final_reward']:.3f}")


if __name__ == "__main__":
    main()
