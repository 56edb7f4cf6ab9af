"""Ablation: GRPO only vs GRPO + localized counterfactual credit, same budget, simulated pool.

A tiny local policy is SFT-warmed on one-agent specs whose capacity is uniform over
small/medium/large (a tiny random model cannot learn longer specs in a CPU-minute), so the choice
left to learn is the capacity field. On MultiArith the known optimum is `small` everywhere.
Both arms use the same seed, SFT model,
number of GRPO steps, tasks and samples; the counterfactual arm additionally re-executes K
capacity/dependency/duty edits per spec (cheap: node cache) and puts Delta on the edited span,
scaled by --cf-scale (GRPOConfig.cf_delta_scale) and clipped to --cf-clip.
Prints, per seed, the final reward of both arms (mean rollout reward of the last 3 steps, held-out
eval reward, mean reward of the valid specs, share of `small`/`large` capacity, valid rate), their
mean over seeds, and as the last line ratio=<seed-mean cf final / seed-mean grpo-only final>.

What the counterfactual term can do here: with a one-agent spec the only edits are the capacity
downgrade (large -> medium, medium -> small; `small` has none) and the duty rollback. On MultiArith
every level is right ~always, so a downgrade keeps success and saves price: Δ = r(large) − r(medium)
≈ −0.31 and r(medium) − r(small) ≈ −0.05 at lambda_cost=1 (Δ < 0: the cheaper edit was better, so
the `large`/`medium` tokens are pushed down). Raw |Δ|·Δ ≈ −0.1 is small next to a group advantage
~ ±1; divided by the group's reward std (~0.15-0.3), Δ̃ ≈ −1 to −2, comparable to it.
But the final reward here is dominated by spec validity (an invalid spec scores −1, a valid one
~1.0 ± 0.05 by capacity), which only the group advantage addresses, so expect the ratio to move
little; valid_reward and small_share show what the span term itself changes. Measured (seeds 0-15,
10 steps, group_std, clip 2): final 0.457 -> 0.438 (ratio 0.96, diff −0.018 ± 0.028 se),
valid_reward +0.005 ± 0.003, small_share 0.62 -> 0.66; with --cf-scale none 10 of 14 seeds were
identical to GRPO-only.

    OMP_NUM_THREADS=1 python bench/credit.py [--steps 10] [--seeds 2] [--cf-scale group_std] [--cf-clip 2]
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
    cf_scale: str = "group_std",
    cf_clip: float | None = 2.0,
    lambda_cost: float = 1.0,
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
        reward=dict(lambda_cost=lambda_cost),
        grpo=dict(kl_coef=0.0, cf_coef=cf_coef if cf else 0.0, cf_delta_scale=cf_scale, cf_clip=cf_clip),
        optim=dict(lr=3e-4, micro_batch_size=12),
    )
    result = train(
        cfg,
        examples=(tasks[:6], tasks[6:]),
        scorer=lambda answer, ex: float(answer.strip().endswith(f" {ex.answer}.")),
    )
    tail = result.metrics[-3:]
    invalid = cfg.reward.invalid_penalty
    return {
        "final_reward": statistics.fmean(m["reward/mean"] for m in tail),
        # mean reward of the valid specs only: the capacity choice, without the validity noise
        "valid_reward": _mean_or_none(
            [(m["reward/mean"] - (1 - m["valid_rate"]) * invalid) / m["valid_rate"] for m in tail if m["valid_rate"]]
        ),
        "eval_reward": result.metrics[-1].get("eval/reward"),
        "small_share": statistics.fmean(m.get("capacity/small", 0.0) for m in tail),
        "valid_rate": statistics.fmean(m["valid_rate"] for m in tail),
        "large_share": statistics.fmean(m.get("capacity/large", 0.0) for m in tail),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--cf-coef", type=float, default=1.0, help="beta of the counterfactual term")
    ap.add_argument("--cf-scale", choices=["none", "group_std"], default="group_std",
                    help="unit of Delta (GRPOConfig.cf_delta_scale)")
    ap.add_argument("--cf-clip", type=float, default=2.0, help="clip of the scaled Delta; <= 0 means no clip")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--lambda-cost", type=float, default=1.0, help="price weight of the reward (RewardConfig)")
    args = ap.parse_args()
    cf_clip = args.cf_clip if args.cf_clip > 0 else None
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
        ratios = []
        print(f"cf_coef={args.cf_coef} cf_scale={args.cf_scale} cf_clip={cf_clip} steps={args.steps} "
              f"lambda_cost={args.lambda_cost}", flush=True)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            base = run_arm(model, work, tasks, teacher, args.steps, seed, cf=False, lambda_cost=args.lambda_cost)
            cf = run_arm(model, work, tasks, teacher, args.steps, seed, cf=True, cf_coef=args.cf_coef,
                         cf_scale=args.cf_scale, cf_clip=cf_clip, lambda_cost=args.lambda_cost)
            for name, run in (("grpo", base), ("grpo+cf", cf)):
                arms[name].append(run)
                print(f"seed={seed} {name:8s} " + _fmt(run), flush=True)
            ratios.append(cf["final_reward"] / base["final_reward"])
            print(f"seed={seed} ratio={ratios[-1]:.3f}", flush=True)
    means = {}
    for name, runs in arms.items():
        means[name] = {k: _mean_or_none([r[k] for r in runs if r[k] is not None]) for k in runs[0]}
        print(f"mean     {name:8s} " + _fmt(means[name]))
    # the ratio of the seed means, not the mean of per-seed ratios: a seed whose baseline final is near 0
    # (many invalid specs) would blow its own ratio up
    print(f"mean_of_seed_ratios={statistics.fmean(ratios):.3f}")
    if means["grpo"]["final_reward"] <= 0:
        print("note: the grpo-only mean final reward is <= 0 (mostly invalid specs): the ratio is not meaningful")
    print(f"ratio={means['grpo+cf']['final_reward'] / means['grpo']['final_reward']:.3f}")


def _mean_or_none(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _fmt(run: dict) -> str:
    return " ".join(f"{k}={v:.3f}" for k, v in run.items() if v is not None)


if __name__ == "__main__":
    main()
