"""Does the team's final agent give an answer? The answer-format instruction, per topology, on the real CPU pool.

The executor appends the benchmark's one-line answer format to the final agent's prompt. MultiArith's is
``End your reply with 'The answer is N' where N is a single number (no units).`` A lone solver (CoT)
reasons and ends with its number, but a final agent that reads other agents' outputs (chain's verifier,
self-consistency's voter) can copy the placeholder instead: ``The answer is N.``, which scores 0. Every
multi-agent spec whose output agent has parents then fails whatever its agents computed, so neither the
teacher sweep nor the trained orchestrator can find a team that beats one solver.

This script measures that on the same held-out MultiArith problems as ``bench/learning.py`` (the first ``--n``
of its test split): each topology at the `large` level, under the benchmark's own format and under its
``team_answer_format``, which has no placeholder to copy. Since these figures lemon gives the team format to
an output agent with parents and the benchmark's format to a lone solver. Per row: accuracy with its 95%
Wilson interval and n, and how many final answers echo the placeholder (``The answer is N``). Last line:
``placeholder_echo <format>=<k>/<n> ...`` over the multi-agent topologies.

    python bench/answer_format.py                 # cot, chain, sc3 x both formats, n = 12 (~15 min, 2 cores)
    python bench/answer_format.py --n 60 --topologies chain

Measured figures: docs/training.md, "Benchmarks".
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning import split_tasks  # noqa: E402

from lemon_core.baselines import chain, cot, self_consistency  # noqa: E402
from lemon_core.benchmarks import get  # noqa: E402
from lemon_core.config import TrainConfig  # noqa: E402
from lemon_core.executor import ExecutionCache, execute_specs  # noqa: E402
from lemon_core.stats import wilson_interval  # noqa: E402
from lemon_core.train import load_train_pool  # noqa: E402

ECHO = re.compile(r"answer is\s*N\b")  # the placeholder copied instead of a number


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="train-cpu", help="pool and agent caps (train config, as bench/learning.py)")
    ap.add_argument("--n", type=int, default=12, help="held-out problems per row (bench/learning.py's test split)")
    ap.add_argument("--topologies", nargs="*", default=["cot", "chain", "sc3"], choices=["cot", "chain", "sc3"])
    ap.add_argument("--formats", nargs="*", default=["benchmark", "no-placeholder"],
                    choices=["benchmark", "no-placeholder"])
    args = ap.parse_args()
    cfg = TrainConfig.from_yaml(args.config, progress=False)
    pool = load_train_pool(cfg)
    large = pool.level_names[-1]
    specs = {"cot": cot(large), "chain": chain(large, length=2), "sc3": self_consistency(large, 3)}
    bench = get("multiarith")
    _, tasks, _ = split_tasks(0, args.n)  # test comes first in split_tasks' order: learning.py's first n
    # Both fields set, so every output agent of a row gets that row's format; lemon itself gives the team
    # format only to an output agent with parents (executor.final_answer_format): the "benchmark" cot row and
    # the "no-placeholder" chain and sc3 rows.
    team = bench.team_answer_format
    formats = {"benchmark": {"answer_format": bench.answer_format, "team_answer_format": bench.answer_format},
               "no-placeholder": {"answer_format": team, "team_answer_format": team}}
    cache = ExecutionCache()  # the solvers' calls of one format are shared by the topologies that repeat them
    echoes: dict[str, list[int]] = {}
    for name in args.formats:
        worded = [t.model_copy(update=formats[name]) for t in tasks]
        for topology in args.topologies:
            t0 = time.perf_counter()
            traces = execute_specs([specs[topology]] * len(worded), worded, pool, cache=cache)
            right = sum(bench.grade(tr.answer, t) for tr, t in zip(traces, worded, strict=True))
            echo = sum(bool(ECHO.search(tr.answer)) for tr in traces)
            low, high = wilson_interval(right, len(worded))
            print(f"{name:>15} {topology:>6}@{large}  accuracy={right / len(worded):.3f} [{low:.2f}, {high:.2f}] "
                  f"n={len(worded)}  placeholder_echo={echo}  ({time.perf_counter() - t0:.0f} s)", flush=True)
            if topology != "cot":
                k, n = echoes.get(name, [0, 0])
                echoes[name] = [k + echo, n + len(worded)]
    print("placeholder_echo " + " ".join(f"{name}={k}/{n}" for name, (k, n) in echoes.items()))


if __name__ == "__main__":
    main()
