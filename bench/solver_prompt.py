"""Is a team's first solver as strong as a lone solver? Its answer-format line, measured on the real CPU pool.

A chain spec (solver -> verifier) runs the same solver role and duty as CoT. The only difference in the
solver's prompt is the answer-format line: CoT's solver is the output agent and is told the benchmark's
format (``You give the team's final answer. End your reply with 'The answer is N' ...``); a chain's solver
was not the output agent and got no format line at all. In the 2026-12-04 ``make run`` the chain's solver
was right on 14 of 30 test problems where CoT's was right on 20, and the verifier never changed an answer,
so the team lost to one solver.

This script measures the solver alone (one call, graded on its own output) on the same held-out MultiArith
problems as ``bench/learning.py`` (the first ``--n`` of its test split), at the `large` level, under:

- ``lone``: the benchmark's format as the final agent's line (CoT's exact prompt);
- ``none``: no format line (a chain's solver before this script's figures);
- ``upstream``: ``prompts.UPSTREAM_FORMAT`` with the team format, the line an answering agent that is not the
  output agent gets since these figures (``executor.build_request``);
- ``team-final``: the team format as the final agent's line.

Per row: accuracy with its 95% Wilson interval and n, how many replies hit the token cap, and how many have
no extractable answer. Last line: ``paired <variant>_vs_lone=<wins>/<losses>`` (problems one got right and
the other wrong).

    python bench/solver_prompt.py               # all four variants, n = 60 (~16 min, 2 cores)
    python bench/solver_prompt.py --n 12 --variants lone none

Measured figures: docs/training.md, "Benchmarks".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning import split_tasks  # noqa: E402

from lemon_core.backends.base import GenerationRequest  # noqa: E402
from lemon_core.baselines import SOLVE  # noqa: E402
from lemon_core.benchmarks import get  # noqa: E402
from lemon_core.config import TrainConfig  # noqa: E402
from lemon_core.executor import agent_seed, uses_seed  # noqa: E402
from lemon_core.prompts import agent_messages  # noqa: E402
from lemon_core.stats import wilson_interval  # noqa: E402
from lemon_core.train import load_train_pool  # noqa: E402

VARIANTS = ("lone", "none", "upstream", "team-final")


def solver_prompt(variant: str, question: str, lone: str, team: str) -> tuple[str, str]:
    """(system, user) of CoT's solver with the answer-format line of ``variant``."""
    answer_format = {"lone": lone, "upstream": team, "team-final": team}.get(variant)
    return agent_messages(role="Solver", base_role="solver", duty=SOLVE, task=question, parents=[],
                          answer_format=answer_format, is_output=variant != "upstream")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="train-cpu", help="pool and agent caps (train config, as bench/learning.py)")
    ap.add_argument("--n", type=int, default=60, help="held-out problems per row (bench/learning.py's test split)")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    args = ap.parse_args()
    cfg = TrainConfig.from_yaml(args.config, progress=False)
    pool = load_train_pool(cfg)
    large = pool.level_names[-1]
    level = pool.level(large)
    bench = get("multiarith")
    _, tasks, _ = split_tasks(0, args.n)
    seed = agent_seed(0, "a1") if uses_seed(pool, large) else None  # the solver's seed in both cot and chain
    right: dict[str, list[bool]] = {}
    for variant in args.variants:
        t0 = time.perf_counter()
        requests = [GenerationRequest.chat(*solver_prompt(variant, t.question, bench.answer_format,
                                                          bench.team_answer_format),
                                           max_tokens=level.max_tokens, temperature=level.temperature,
                                           top_p=level.top_p, seed=seed) for t in tasks]
        replies = pool.backend(large).generate(requests)
        right[variant] = [bool(bench.grade(r.text, t)) for r, t in zip(replies, tasks, strict=True)]
        k, n = sum(right[variant]), len(tasks)
        capped = sum(r.completion_tokens >= level.max_tokens for r in replies)
        no_answer = sum(bench.extract(r.text, t) is None for r, t in zip(replies, tasks, strict=True))
        low, high = wilson_interval(k, n)
        print(f"{variant:>10} solver@{large}  accuracy={k / n:.3f} [{low:.2f}, {high:.2f}] n={n}  "
              f"at_token_cap={capped}  no_answer={no_answer}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    if "lone" in right:
        pairs = []
        for variant, got in right.items():
            if variant != "lone":
                wins = sum(g and not b for g, b in zip(got, right["lone"], strict=True))
                losses = sum(b and not g for g, b in zip(got, right["lone"], strict=True))
                pairs.append(f"{variant}_vs_lone={wins}/{losses}")
        print("paired " + " ".join(pairs))


if __name__ == "__main__":
    main()
