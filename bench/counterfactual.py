"""Agent calls for counterfactual re-execution: node cache vs full re-execution, on the trainer's edit mix.

Specs are the templated SFT specs (CoT, self-consistency, chain, tree, debate with varied capacities
and duties) on MultiArith tasks, executed on the simulated pool. For every spec, K edits are drawn by
the EditFamilySampler (``--families``: reset = ``rollout.edit_families``' default, uniform at the start) and
re-executed twice: once with the ExecutionCache of the original run (only the edited agent and its descendants
really run), once from scratch. Last line: ratio=<cached calls / full calls> (target <= 0.5).

    python bench/counterfactual.py [--specs 200] [--edits 2] [--families reset|paper|all]

Measured 2026-12-07 (200 specs, 2.51 agents each, K = 2, seed 0; ~3 s): reset 0.481, paper 0.481 (the same
calls: a reset and a downgrade edit the same agents, only to another level, and the node cache re-runs that agent
and its descendants either way), all 0.492.
"""

from __future__ import annotations

import argparse
import random
import time

from lemon_core.backends.simulated import register_examples
from lemon_core.benchmarks import get
from lemon_core.config import SFTConfig
from lemon_core.counterfactual import FAMILY_SETS, EditFamilySampler, counterfactual_edits
from lemon_core.executor import ExecutionCache, execute_specs
from lemon_core.policy import spec_completion
from lemon_core.pool import load_pool
from lemon_core.sft import templated_spec
from lemon_core.spec_text import parse_spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", type=int, default=200)
    ap.add_argument("--edits", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", choices=list(FAMILY_SETS), default="reset",
                    help="reset: the trainer's default (dependency drops, duty rollbacks, capacity resets to the "
                    "cheapest level); paper: one-level downgrades in place of the resets; all: paper + upgrades")
    args = ap.parse_args()
    families = FAMILY_SETS[args.families]
    pool = load_pool("simulated")
    tasks = get("multiarith").load(None, args.specs)
    register_examples(tasks)
    rng = random.Random(args.seed)
    parsed = [parse_spec(spec_completion(templated_spec(pool, rng, SFTConfig())), pool) for _ in tasks]
    cache = ExecutionCache()
    execute_specs([p.spec for p in parsed], tasks, pool, cache=cache, seed=args.seed)
    sampler = EditFamilySampler(families=families)
    jobs = [
        (t, e)
        for t, p in zip(tasks, parsed, strict=True)
        for e in sampler.sample(counterfactual_edits(p, pool, families), args.edits, rng)
    ]
    t0 = time.perf_counter()
    cached = execute_specs([e.spec for _, e in jobs], [t for t, _ in jobs], pool, cache=cache, seed=args.seed)
    t_cached = time.perf_counter() - t0
    t0 = time.perf_counter()
    full = execute_specs([e.spec for _, e in jobs], [t for t, _ in jobs], pool, cache=None, seed=args.seed)
    t_full = time.perf_counter() - t0
    by_family: dict[str, list[int]] = {}
    for (_, e), c, f in zip(jobs, cached, full, strict=True):
        by_family.setdefault(e.family.value, [0, 0])
        by_family[e.family.value][0] += c.agent_calls
        by_family[e.family.value][1] += f.agent_calls
    n_cached, n_full = sum(c.agent_calls for c in cached), sum(f.agent_calls for f in full)
    print(
        f"specs={len(parsed)} edits={len(jobs)} "
        f"agents/spec={sum(len(p.spec.agents) for p in parsed) / len(parsed):.2f}"
    )
    for fam, (c, f) in sorted(by_family.items()):
        print(f"  {fam:20s} cached_calls={c:5d} full_calls={f:5d} ratio={c / f:.3f}")
    print(f"cached_calls={n_cached} full_calls={n_full} cached_s={t_cached:.3f} full_s={t_full:.3f}")
    print(f"ratio={n_cached / n_full:.3f}")


if __name__ == "__main__":
    main()
