"""The learning benchmark: does LEMON training make a better orchestrator, on the real CPU pool?

Same MultiArith split for every method: the 600 MultiArith problems are shuffled once (seed 0); the first
``--test`` are the held-out test set, the next ``--train`` the training tasks. Methods, each scored by
``lemon_core.evaluate`` on the same test examples (invalid orchestrator output scores 0 and is counted):

    cot@small, cot@large, sc3@large   baselines (fixed specs)
    lemon-sft                         the SFT warm-up alone (``sft.teacher`` from the config)
    lemon                             SFT, then GRPO + localized counterfactual credit (``--iterations``)
    grpo-only                         SFT, then GRPO without counterfactual edits (same budget)

Every method goes through the same flow as ``lemon train`` and the pipeline (``train.sft_warmup``,
``train.build_state``, ``train.run_iteration``, ``evaluate.evaluate_orchestrator``). The evaluations share one
node cache: the same agent request gets the same greedy answer (a cached call is still charged its price).

Prints per method: accuracy with its 95% Wilson interval and n, valid rate, $/example, tokens/example, the mean
training reward (an orchestrator's own call counted) and the capacity mix of the specs it wrote; writes
``OUT/learning.json``, ``OUT/learning.md`` and ``OUT/pareto.png``. The targets line says "met" or "not met" for
each target, and an orchestrator that copies the best baseline fails it:

- valid rate >= 0.95;
- lemon above lemon-sft on the same problems: more problems won than lost and the exact sign test's p < 0.05;
- lemon's mean training reward (accuracy and cost, its own call counted) at least every baseline's.

The last line is ``ratio=<lemon accuracy / cot@large accuracy> cost_ratio=<lemon $/ex / cot@large $/ex>
cost_ratio_with_orchestrator=<(lemon $/ex + its own call) / cot@large $/ex>``.

    python bench/learning.py --config train-cpu-format-sft --iterations 10 --skip sc3@large grpo-only
    python bench/learning.py                     # all six methods, the sweep teacher of train-cpu
    python bench/learning.py --quick             # smoke run (train 8, test 16, 1 step)

Figures: docs/results.md. On a machine busy with other work set OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lemon_core.backends.simulated import register_examples  # noqa: E402
from lemon_core.baselines import cot, self_consistency  # noqa: E402
from lemon_core.benchmarks import get  # noqa: E402
from lemon_core.checkpoint import save_model_dir  # noqa: E402
from lemon_core.comparison import paired_test, per_problem  # noqa: E402
from lemon_core.config import TrainConfig  # noqa: E402
from lemon_core.evaluate import evaluate, evaluate_orchestrator, price_level  # noqa: E402
from lemon_core.executor import ExecutionCache  # noqa: E402
from lemon_core.report import choice_stats, plot_pareto  # noqa: E402
from lemon_core.report_choices import same_spec_as_baseline  # noqa: E402
from lemon_core.train import (  # noqa: E402
    build_state,
    close_state,
    constrain,
    load_policy,
    load_train_pool,
    run_iteration,
    sft_warmup,
    tasks_for_step,
)
from lemon_core.update import constant_groups_figure  # noqa: E402

BASELINES = ("cot@small", "cot@large", "sc3@large")  # fixed-spec methods, built per pool in main()


def split_tasks(n_train: int, n_test: int, n_held: int = 0, seed: int = 0) -> tuple[list[Any], list[Any], list[Any]]:
    """(train, test, held) of the MultiArith problems shuffled once: test first, then train, then ``n_held``
    problems in neither (SFT's valid-spec rate is measured on their questions), so ``n_held`` changes
    neither split."""
    tasks = get("multiarith").load("test")
    random.Random(seed).shuffle(tasks)
    if n_train + n_test + n_held > len(tasks):
        raise SystemExit(f"--train {n_train} + --test {n_test} (+ {n_held} held out for the valid-spec rate) "
                         f"exceeds the {len(tasks)} MultiArith problems")
    return tasks[n_test : n_test + n_train], tasks[:n_test], tasks[n_test + n_train : n_test + n_train + n_held]


def row(summary: Any, records: list[dict[str, Any]], levels: list[str], seconds: float) -> dict[str, Any]:
    mix = choice_stats(records, levels)["capacity_share"]
    return {**summary.model_dump(), "capacity_mix": mix, "method_wall_s": round(seconds, 1)}


def markdown_row(r: dict[str, Any]) -> str:
    """One method's row of learning.md (an orchestrator's own call is a column apart: the baselines have none)."""
    orchestrator = f"{r['orchestrator_cost_usd']:.2e}" if r.get("orchestrator_cost_usd") is not None else "-"
    mix = ", ".join(f"{k} {v:.2f}" for k, v in r["capacity_mix"].items())
    return (f"| {r['method']} | {r['accuracy']:.3f} [{r['accuracy_ci_low']:.2f}, {r['accuracy_ci_high']:.2f}] | "
            f"{r['n']} | {r['valid_rate']:.2f} | {r['mean_cost_usd']:.2e} | {orchestrator} | "
            f"{r['mean_tokens']:.0f} | {r['truncated_answers']} | {r.get('looped_answers', 0)} | {mix} |")


def learning_targets(rows: dict[str, dict[str, Any]], traces: dict[str, list[dict[str, Any]]]) -> tuple[str, bool]:
    """The targets line and whether every target is met (module docstring). ``rows`` by method (learning.json's
    rows), ``traces`` the records of lemon and lemon-sft (for the paired test on the same problems)."""
    lemon, sft = rows["lemon"], rows["lemon-sft"]
    test = paired_test(per_problem(traces["lemon"], "score"), per_problem(traces["lemon-sft"], "score"))
    baselines = {m: r for m, r in rows.items() if m not in ("lemon", "lemon-sft", "grpo-only")}
    best = max(baselines, key=lambda m: baselines[m].get("mean_reward") or float("-inf"), default=None)
    checks = {
        f"valid rate {lemon['valid_rate']:.2f} >= 0.95": lemon["valid_rate"] >= 0.95,
        f"lemon above lemon-sft ({lemon['accuracy']:.3f} vs {sft['accuracy']:.3f}, {test.wins} won / "
        f"{test.losses} lost, p={test.p:.3g} < 0.05)": test.wins > test.losses and test.p < 0.05,
    }
    if best is not None:
        mine, theirs = lemon.get("mean_reward"), baselines[best].get("mean_reward")
        checks[f"lemon's mean reward {mine if mine is not None else float('nan'):.3f} >= the best baseline's "
               f"({best} {theirs if theirs is not None else float('nan'):.3f})"] = (
            mine is not None and theirs is not None and mine >= theirs)
    line = "targets: " + "; ".join(f"{what}: {'met' if ok else 'not met'}" for what, ok in checks.items())
    return line, all(checks.values())


def train_arm(cfg: TrainConfig, sft_dir: Path, train: list[Any], iterations: int) -> Any:
    """GRPO from the SFT model for ``iterations`` steps; returns the state (its policy is evaluated)."""
    state = build_state(cfg, None, base_model=str(sft_dir))
    for _ in range(iterations):
        tasks = tasks_for_step(train, state.step + 1, cfg.tasks_per_iteration, cfg.seed)
        it = run_iteration(state, tasks)
        print(f"  step {state.step}: reward/mean={it.row['reward/mean']:.3f} valid_rate={it.row['valid_rate']:.2f} "
              f"loss={it.row.get('loss', 0.0):.4f} kl={it.row.get('kl', 0.0):.4f} {constant_groups_figure(it.row)} "
              f"({it.row['time/step_s']:.0f} s)", flush=True)
    return state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--config", default="train-cpu", help="train config (pool, model, SFT, GRPO settings)")
    ap.add_argument("--quick", action="store_true", help="train 8, test 16, 1 step: a smoke run")
    ap.add_argument("--train", type=int, default=32, help="training tasks")
    ap.add_argument("--test", type=int, default=60, help="held-out test examples (the same for every method)")
    ap.add_argument("--iterations", type=int, default=3, help="GRPO steps of lemon and grpo-only")
    ap.add_argument("--teacher", default=None, choices=["sweep", "templated"],
                    help="SFT teacher (default: the config's; train-cpu: sweep, train-cpu-format-sft: templated)")
    ap.add_argument("--sweep-tasks", type=int, default=16,
                    help="training tasks the teacher sweep executes (every candidate spec of each on the pool)")
    ap.add_argument("--sweep-topologies", default="cot,chain",
                    help="candidate topologies of the sweep, each at every level (and chain with a cheap first agent)")
    ap.add_argument("--teach-top", type=int, default=1,
                    help="SFT targets per task: the sweep's choice, then its next best N-1 by mean reward (1, as in "
                    "every shipped config, collapses SFT onto one spec, so every GRPO group is copies of it and has "
                    "no advantage to learn from)")
    ap.add_argument("--out", default="runs/bench-learning", help="output folder")
    ap.add_argument("--only", nargs="*", default=None, choices=BASELINES,
                    help="run only these baselines and add their rows to OUT/learning.json (a row of the same "
                    "method is replaced): completes a run made with --skip sc3@large")
    ap.add_argument("--skip", nargs="*", default=[], choices=["sc3@large", "lemon", "grpo-only"],
                    help="methods not to run: sc3@large costs three times CoT@large's generation, lemon and grpo-only "
                    "their GRPO steps (their rows are then absent; the last lines need lemon, lemon-sft and cot@large, "
                    "and are left out without lemon)")
    ap.add_argument("--agent-max-tokens", type=int, default=None,
                    help="cap every level's answer length (default: the pool's own; a cap that cuts answers "
                    "before their final line scores them 0, see truncated= in the table)")
    args = ap.parse_args()
    if args.quick:
        args.train, args.test, args.iterations, args.sweep_tasks = 8, 16, 1, 8
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sweep = {"topologies": args.sweep_topologies.split(","), "max_tasks": args.sweep_tasks,
             "teach_top": args.teach_top}
    teacher = {"teacher": args.teacher} if args.teacher else {}
    cfg = TrainConfig.from_yaml(args.config, out=str(out), progress=False, sft={**teacher, "sweep": sweep})
    cfg = cfg.model_copy(update={"agent_max_tokens": args.agent_max_tokens})
    train, test, held = split_tasks(args.train, args.test, cfg.sft.eval_tasks)
    pool = load_train_pool(cfg)
    if any(level.backend == "simulated" for level in pool.levels):  # a test or research pool: it needs the answers
        register_examples([*train, *test, *held])
    levels = pool.level_names
    bench = get("multiarith")
    cache = ExecutionCache()
    saved = out / "learning.json"
    # --only adds to an earlier run: its args, SFT figures and other rows are kept in every write below
    meta: dict[str, Any] = {"args": vars(args)}
    rows: list[dict[str, Any]] = []
    if args.only is not None and saved.is_file():
        old = json.loads(saved.read_text())
        rows = [r for r in old.pop("rows") if r["method"] not in args.only]
        meta = old
    baselines = {"cot@small": cot(levels[0]), "cot@large": cot(levels[-1]),
                 "sc3@large": self_consistency(levels[-1], 3)}
    t_all = time.perf_counter()
    traces: dict[tuple[str, str], list[dict[str, Any]]] = {}  # the baselines' records, to compare specs with
    orchestrator_records: dict[str, list[dict[str, Any]]] = {}  # lemon's and lemon-sft's, for the paired test

    def record(method: str, summary: Any, records: list[dict[str, Any]], t0: float, orchestrator: bool = False) -> None:
        r = row(summary, records, levels, time.perf_counter() - t0)
        if orchestrator:  # the evaluation priced its own calls (evaluate.price_level)
            r["orchestrator_level"] = getattr(price_level(pool, cfg.model), "name", None)
            r["same_spec_as_baseline"] = same_spec_as_baseline(records, traces, bench.name)
            orchestrator_records[method] = records
        else:
            traces[bench.name, method] = records
        rows.append(r)
        # written after every method: a run stopped part-way keeps what it measured
        saved.write_text(json.dumps({**meta, "rows": rows}, indent=2, default=str))
        print(f"{method:>10}  accuracy={r['accuracy']:.3f} [{r['accuracy_ci_low']:.2f}, {r['accuracy_ci_high']:.2f}] "
              f"n={r['n']}  valid={r['valid_rate']:.2f}  $/ex={r['mean_cost_usd']:.2e}  "
              f"tokens/ex={r['mean_tokens']:.0f}  truncated={r['truncated_answers']}  "
              f"looped={r.get('looped_answers', 0)}  reward={r.get('mean_reward') or float('nan'):.3f}  "
              f"mix={ {k: round(v, 2) for k, v in r['capacity_mix'].items()} }  "
              f"({r['method_wall_s']:.0f} s)"
              + (f"  orchestrator: {r['orchestrator_tokens']:.0f} tokens/ex, $/ex={r['orchestrator_cost_usd']:.2e} "
                 f"at {r['orchestrator_level']}'s price" if r.get("orchestrator_cost_usd") is not None else "")
              + (f"  same spec as {r['same_spec_as_baseline']}" if "same_spec_as_baseline" in r else ""), flush=True)

    def baseline(name: str, spec: Any) -> None:
        t0 = time.perf_counter()
        summary, records = evaluate(bench, test, spec, pool, method=name, progress=False, cache=cache,
                                    reward_cfg=cfg.reward, out_dir=out / "traces" / name)
        record(name, summary, records, t0)

    if args.only is not None:
        for name in args.only:
            baseline(name, baselines[name])
        print(f"{saved}: {[r['method'] for r in rows]}")
        return

    baseline("cot@small", baselines["cot@small"])
    baseline("cot@large", baselines["cot@large"])

    t0 = time.perf_counter()
    policy = load_policy(cfg, cfg.model)
    sft = sft_warmup(policy, cfg, pool, train, [t.question for t in held], progress=False)
    print(f"SFT: {sft.model_dump_json()}", flush=True)
    sft_dir = out / "sft-model"
    save_model_dir(policy, sft_dir)
    summary, records = evaluate_orchestrator(constrain(policy, cfg, levels), pool, test, benchmark=bench,
                                             method="lemon-sft", orchestrator_model=cfg.model,
                                             max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed,
                                             progress=False, cache=cache, reward_cfg=cfg.reward,
                                             out_dir=out / "traces" / "lemon-sft")
    record("lemon-sft", summary, records, t0, orchestrator=True)
    del policy

    arms = {"lemon": cfg, "grpo-only": cfg.with_overrides(rollout={"edits_per_spec": 0})}
    for name, arm_cfg in arms.items():
        if name in args.skip:
            continue
        t0 = time.perf_counter()
        print(f"{name}: {args.iterations} GRPO steps from the SFT model", flush=True)
        state = train_arm(arm_cfg, sft_dir, train, args.iterations)
        summary, records = evaluate_orchestrator(state.policy, state.pool, test, benchmark=bench, method=name,
                                                 orchestrator_model=cfg.model,
                                                 max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed,
                                                 progress=False, cache=cache, reward_cfg=cfg.reward,
                                                 out_dir=out / "traces" / name)
        record(name, summary, records, t0, orchestrator=True)
        close_state(state)
    if "sc3@large" not in args.skip:
        baseline("sc3@large", baselines["sc3@large"])  # last: three times CoT@large's generation

    by = {r["method"]: r for r in rows}
    saved.write_text(json.dumps({**meta, "sft": sft.model_dump(), "rows": rows}, indent=2, default=str))
    (out / "pareto.png").write_bytes(plot_pareto(rows))
    lines = ["| method | accuracy [95% CI] | n | valid | $/ex agents | orchestrator | tokens/ex | truncated | looped | "
             "capacity mix |", "|---|---|---|---|---|---|---|---|---|---|"] + [markdown_row(r) for r in rows]
    (out / "learning.md").write_text("\n".join(lines) + "\n")
    if "lemon" not in by:
        print("no targets or ratio line: lemon was skipped (--skip lemon)")
        return
    lemon, ref = by["lemon"], by["cot@large"]
    ratio = lemon["accuracy"] / ref["accuracy"] if ref["accuracy"] else float("nan")
    cost_ratio = lemon["mean_cost_usd"] / ref["mean_cost_usd"] if ref["mean_cost_usd"] else float("nan")
    # the cost_ratio compares agent calls; lemon also pays its orchestrator's call, which CoT does not
    own = lemon.get("orchestrator_cost_usd")
    with_orchestrator = ((lemon["mean_cost_usd"] + (own if own is not None else float("nan")))
                         / ref["mean_cost_usd"] if ref["mean_cost_usd"] else float("nan"))
    line, _ = learning_targets(by, orchestrator_records)
    print(f"{line}; wall {time.perf_counter() - t_all:.0f} s")
    print(f"ratio={ratio:.3f} cost_ratio={cost_ratio:.3f} cost_ratio_with_orchestrator={with_orchestrator:.3f}")


if __name__ == "__main__":
    main()
