"""Counterfactual edits: the three families, their spans, adaptive sampling, cached re-execution."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from lemon_core.backends.simulated import register_examples
from lemon_core.benchmarks import Example
from lemon_core.counterfactual import (
    ALL_FAMILIES,
    DEFAULT_FAMILIES,
    PAPER_FAMILIES,
    EditFamily,
    EditFamilySampler,
    counterfactual_edits,
    upgrade,
)
from lemon_core.executor import ExecutionCache, execute_specs
from lemon_core.policy import spec_completion
from lemon_core.pool import load_pool
from lemon_core.spec import AgentSpec, OrchestrationSpec
from lemon_core.spec_text import parse_spec

POOL = load_pool("simulated")
SPEC = OrchestrationSpec(
    agents=[
        AgentSpec(id="plan", role="Planner", base_role="planner", duty="List the steps.", capacity="small"),
        AgentSpec(
            id="solve",
            role="Solver",
            base_role="solver",
            duty="Compute it carefully.",
            capacity="large",
            depends_on=["plan"],
        ),
        AgentSpec(
            id="check",
            role="Checker",
            base_role="verifier",
            duty="Recheck the sum.",
            capacity="medium",
            depends_on=["plan", "solve"],
        ),
    ],
    output="check",
)


def test_every_single_field_edit_is_listed_with_the_span_of_its_value() -> None:
    parsed = parse_spec("Here is my team:\n" + spec_completion(SPEC), POOL)
    edits = counterfactual_edits(parsed, POOL, PAPER_FAMILIES)
    by = {(e.family, e.agent_id, e.description) for e in edits}
    assert len([e for e in edits if e.family is EditFamily.drop_dependency]) == 3
    assert len([e for e in edits if e.family is EditFamily.duty_rollback]) == 3
    # plan is already the cheapest level: no downgrade for it
    assert {e.agent_id for e in edits if e.family is EditFamily.capacity_downgrade} == {"solve", "check"}
    assert len(by) == len(edits) == 8
    for e in edits:
        text = parsed.text[e.span[0] : e.span[1]]
        edited = e.spec.agent(e.agent_id)
        original = SPEC.agent(e.agent_id)
        if e.family is EditFamily.capacity_downgrade:
            assert text == original.capacity and edited.capacity == POOL.downgrade(original.capacity)
        elif e.family is EditFamily.duty_rollback:
            assert text == original.duty and edited.duty != original.duty
        else:
            assert text in original.depends_on and text not in edited.depends_on
        # exactly one agent changed
        assert sum(a != b for a, b in zip(SPEC.agents, e.spec.agents, strict=True)) == 1


def test_sampler_keeps_a_floor_and_follows_recent_abs_delta() -> None:
    sampler = EditFamilySampler(floor=0.3, decay=0.5)
    assert all(p == pytest.approx(1 / 3) for p in sampler.probabilities().values())
    for _ in range(20):
        sampler.update(EditFamily.capacity_reset, 0.8)
        sampler.update(EditFamily.duty_rollback, 0.0)
        sampler.update(EditFamily.drop_dependency, 0.0)
    probs = sampler.probabilities()
    assert probs[EditFamily.capacity_reset] > 0.75
    assert probs[EditFamily.duty_rollback] >= 0.1 - 1e-9  # floor / 3
    assert sum(probs.values()) == pytest.approx(1.0)
    parsed = parse_spec(spec_completion(SPEC), POOL)
    chosen = sampler.sample(counterfactual_edits(parsed, POOL), k=2, rng=random.Random(0))
    assert len(chosen) == 2 and len({(c.family, c.agent_id, c.description) for c in chosen}) == 2
    with pytest.raises(ValueError, match="floor"):
        EditFamilySampler(floor=1.5)


def test_cached_reexecution_runs_only_the_edited_agent_and_its_descendants() -> None:
    task = Example(
        id="t/1",
        benchmark="multiarith",
        question="Sam has 3 pens and buys 4. How many?",
        answer="7",
        answer_format="Answer with a number.",
    )
    register_examples([task])
    cache = ExecutionCache()
    [original] = execute_specs([SPEC], [task], POOL, cache=cache, seed=3)
    assert original.agent_calls == 3
    parsed = parse_spec(spec_completion(SPEC), POOL)
    edits = {(e.family, e.agent_id): e for e in counterfactual_edits(parsed, POOL)}
    calls = {}
    for key in [
        (EditFamily.capacity_reset, "solve"),
        (EditFamily.duty_rollback, "check"),
        (EditFamily.duty_rollback, "plan"),
    ]:
        [trace] = execute_specs([edits[key].spec], [task], POOL, cache=cache, seed=3)
        calls[key] = trace.agent_calls
        ran = {a.agent_id for a in trace.agents if not a.cached}
        # the edited agent always runs again; ancestors never do; a descendant runs only if its
        # input changed (an identical parent output is an identical request: a cache hit)
        assert key[1] in ran and ran <= {key[1]} | SPEC.descendants(key[1])
        assert not ran & SPEC.ancestors(key[1])
    assert calls[(EditFamily.duty_rollback, "check")] == 1  # the output agent: nothing below it
    assert sum(calls.values()) < 3 * len(SPEC.agents)  # full re-execution would run every agent


def test_capacity_upgrade_edit_has_the_span_of_the_capacity_value() -> None:
    parsed = parse_spec("Here is my team:\n" + spec_completion(SPEC), POOL)
    assert not [e for e in counterfactual_edits(parsed, POOL) if e.family is EditFamily.capacity_upgrade]  # off
    edits = counterfactual_edits(parsed, POOL, ALL_FAMILIES)
    ups = {e.agent_id: e for e in edits if e.family is EditFamily.capacity_upgrade}
    # plan is small -> medium, check medium -> large; solve is already the dearest level: no upgrade
    assert set(ups) == {"plan", "check"}
    for agent_id, want in (("plan", "medium"), ("check", "large")):
        e = ups[agent_id]
        original = SPEC.agent(agent_id)
        assert parsed.text[e.span[0] : e.span[1]] == original.capacity
        assert e.span == parsed.spans[(agent_id, "capacity")]
        assert e.spec.agent(agent_id).capacity == want
        assert sum(a != b for a, b in zip(SPEC.agents, e.spec.agents, strict=True)) == 1
    # a one-agent small spec - the collapse state - now has a capacity edit (before: none at all)
    one = OrchestrationSpec(agents=[SPEC.agents[0]], output="plan")
    solo = counterfactual_edits(parse_spec(spec_completion(one), POOL), POOL, ALL_FAMILIES)
    assert [e.description for e in solo if e.family.value.startswith("capacity")] == ["plan: capacity small -> medium"]
    assert upgrade(POOL, "large") is None and upgrade(POOL, "small") == "medium"


def test_sampler_samples_only_its_families() -> None:
    parsed = parse_spec(spec_completion(SPEC), POOL)
    every = counterfactual_edits(parsed, POOL, ALL_FAMILIES)
    assert EditFamilySampler().families == DEFAULT_FAMILIES
    paper = EditFamilySampler(families=PAPER_FAMILIES)
    assert paper.families == PAPER_FAMILIES and set(paper.probabilities()) == set(PAPER_FAMILIES)
    chosen = paper.sample(every, k=len(every), rng=random.Random(0))
    assert len(chosen) == 8 and all(c.family is not EditFamily.capacity_upgrade for c in chosen)
    only_up = EditFamilySampler(families=["capacity_upgrade"])
    assert {c.family for c in only_up.sample(every, k=5, rng=random.Random(0))} == {EditFamily.capacity_upgrade}
    # a sampler restored from a checkpoint written before capacity_upgrade existed still works
    both = EditFamilySampler(families=ALL_FAMILIES)
    both.mean_abs_delta = {f: 0.5 for f in PAPER_FAMILIES}
    both.update(EditFamily.capacity_upgrade, 0.0)
    assert sum(both.probabilities().values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="capacity_upgrade"):
        EditFamilySampler(families=["capacity_upgrad"])
    with pytest.raises(ValueError, match="empty"):
        counterfactual_edits(parsed, POOL, [])


def test_capacity_reset_contrasts_every_agent_above_the_cheapest_level_with_it() -> None:
    """capacity_reset: one edit per agent above the pool's cheapest level, to that level; none for an agent there."""
    parsed = parse_spec("Here is my team:\n" + spec_completion(SPEC), POOL)
    assert EditFamily.capacity_reset not in ALL_FAMILIES and EditFamily.capacity_reset not in PAPER_FAMILIES
    assert not [e for e in counterfactual_edits(parsed, POOL, ALL_FAMILIES) if e.family is EditFamily.capacity_reset]
    resets = {e.agent_id: e for e in counterfactual_edits(parsed, POOL, [EditFamily.capacity_reset])}
    assert set(resets) == {"solve", "check"}  # plan is already small
    assert resets["check"].spec.agent("check").capacity == "small"  # medium -> small, as a downgrade would
    assert resets["solve"].spec.agent("solve").capacity == "small"  # large -> small, where a downgrade stops at medium
    for agent_id, e in resets.items():
        assert parsed.text[e.span[0] : e.span[1]] == SPEC.agent(agent_id).capacity
    assert sum(a != b for a, b in zip(SPEC.agents, resets["solve"].spec.agents, strict=True)) == 1


def test_on_a_two_level_pool_resets_are_the_downgrades_edit_for_edit() -> None:
    """The CPU pool has two levels, so the default capacity_reset and the paper's capacity_downgrade list the same
    edits in the same order and a sampler picks the same ones from the same RNG: bench/learning.py and `make run`
    train exactly as before the default changed. On the three-level simulated pool `large` goes to `small`."""
    cpu = load_pool("cpu")
    spec = OrchestrationSpec(agents=[a.model_copy(update={"capacity": "small" if a.id == "plan" else "large"})
                                     for a in SPEC.agents], output=SPEC.output)
    parsed = parse_spec(spec_completion(spec), cpu)
    resets, downgrades = counterfactual_edits(parsed, cpu), counterfactual_edits(parsed, cpu, PAPER_FAMILIES)
    assert [(e.agent_id, e.span, e.spec) for e in resets] == [(e.agent_id, e.span, e.spec) for e in downgrades]
    assert {e.family for e in resets} - {e.family for e in downgrades} == {EditFamily.capacity_reset}
    for seed in range(20):
        picked = EditFamilySampler().sample(resets, 2, random.Random(seed))
        paper = EditFamilySampler(families=PAPER_FAMILIES).sample(downgrades, 2, random.Random(seed))
        assert [(e.agent_id, e.span) for e in picked] == [(e.agent_id, e.span) for e in paper]
    three = counterfactual_edits(parse_spec(spec_completion(spec), POOL), POOL)
    assert {e.agent_id: e.spec.agent(e.agent_id).capacity for e in three
            if e.family is EditFamily.capacity_reset} == {"solve": "small", "check": "small"}


def test_counterfactual_bench_reruns_only_edited_agents_and_their_descendants() -> None:
    """bench/counterfactual.py at the trainer's default families: the node cache re-runs fewer agent calls than a
    full re-execution (75 of 147 on these 40 specs; 0.481 on the bench's 200), every family it prints is one the
    trainer probes, and an unknown family is refused by name."""
    script = Path(__file__).resolve().parents[1] / "bench" / "counterfactual.py"
    done = subprocess.run([sys.executable, str(script), "--specs", "40"], capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    printed = {line.split()[0] for line in lines if "cached_calls=" in line and line.startswith("  ")}
    assert printed and printed <= {f.value for f in DEFAULT_FAMILIES}, printed
    cached, full = (int(lines[-2].split()[i].split("=")[1]) for i in (0, 1))
    assert 0 < cached < full and float(lines[-1].removeprefix("ratio=")) == pytest.approx(cached / full, abs=1e-3)
    bad = subprocess.run([sys.executable, str(script), "--families", "upgrades"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'upgrades'" in bad.stderr
