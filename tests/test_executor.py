"""Executor: level-by-level batching across specs, cost accounting, node cache, failure isolation."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from lemon_core.backends.base import Completion, GenerationRequest
from lemon_core.baselines import chain, cot, debate, self_consistency, tree
from lemon_core.executor import ExecutionCache, Task, execute_specs
from lemon_core.pool import CapacityLevel, CapacityPool
from lemon_core.spec import AgentSpec, OrchestrationSpec


class RecordingBackend:
    """Test double: answers '<level>:<agent role>:<n parents>' and records every batch it gets."""

    def __init__(self, name: str, fail_roles: Sequence[str] = ()) -> None:
        self.name = name
        self.batches: list[int] = []
        self.fail_roles = set(fail_roles)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.batches.append(len(requests))
        out = []
        for r in requests:
            system, user = r.messages[0][1], r.messages[-1][1]
            role = system.split("You are ", 1)[1].split(",", 1)[0]
            if role in self.fail_roles:
                out.append(Completion("", 10, 0, 0.5, error="timeout after 1.0 s"))
                continue
            n_parents = user.count("Output of ")
            out.append(Completion(f"{self.name}:{role}:{n_parents}", 10, 5, 0.25))
        return out

    def close(self) -> None:
        pass


def make_pool(fail_roles: Sequence[str] = ()) -> tuple[CapacityPool, dict[str, RecordingBackend]]:
    pool = CapacityPool(levels=[
        CapacityLevel(name="small", backend="simulated", model="x", price_in_per_1m=1.0, price_out_per_1m=2.0),
        CapacityLevel(name="large", backend="simulated", model="y", price_in_per_1m=10.0, price_out_per_1m=20.0),
    ])
    backends = {n: RecordingBackend(n, fail_roles) for n in pool.level_names}
    for n, b in backends.items():
        pool.set_backend(n, b)
    return pool, backends


def test_one_batch_per_level_and_capacity_across_specs() -> None:
    pool, backends = make_pool()
    specs = [chain("large", length=3) for _ in range(5)]
    traces = execute_specs(specs, [f"task {i}" for i in range(5)], pool)
    # 3 levels, each with 5 agents (one per spec), all at 'large': 3 calls of 5.
    assert backends["large"].batches == [5, 5, 5]
    assert backends["small"].batches == []
    assert all(t.ok and t.answer == "large:Verifier 2:1" for t in traces)


def test_mixed_capacities_split_into_one_batch_each() -> None:
    pool, backends = make_pool()
    spec = self_consistency("large", n=3, vote_capacity="small")
    traces = execute_specs([spec, spec], [Task("q1"), Task("q2")], pool)
    assert backends["large"].batches == [6]  # 3 solvers x 2 specs in one call
    assert backends["small"].batches == [2]  # the two voters
    assert traces[0].answer == "small:Majority voter:3"


def test_parent_outputs_reach_child_prompts_and_only_answering_agents_get_a_format_line() -> None:
    pool, _ = make_pool()
    (trace,) = execute_specs([chain("small", length=2)], [Task("What is 2+2?", "End with 'The answer is N'.")], pool)
    first, second = trace.agents
    assert "Output of Solver (a1):\nsmall:Solver:0" in second.prompt
    assert "You give the team's final answer. End with 'The answer is N'." in second.prompt
    # the upstream solver is told how to state its result, not that its answer is the team's
    assert "Other agents read your output. End with 'The answer is N'." in first.prompt
    assert "You give the team's final answer" not in first.prompt
    # a planner's duty is a plan: no answer-format line, so nothing asks it to answer
    (planned,) = execute_specs([tree("small", branches=2)], [Task("What is 2+2?", "End with 'The answer is N'.")], pool)
    planner, *solvers, merge = planned.agents
    assert planner.agent_id == "plan" and "The answer is N" not in planner.prompt
    assert all("Other agents read your output." in s.prompt for s in solvers)
    assert "You give the team's final answer." in merge.prompt


def test_an_output_agent_with_parents_gets_the_team_answer_format_and_a_lone_solver_the_plain_one() -> None:
    pool, _ = make_pool()
    task = Task("What is 2+2?", "End with 'The answer is N'.", "Your last line: 'The answer is' and the number.")
    lone, team = execute_specs([cot("small"), chain("small", length=2)], [task, task], pool)
    assert "End with 'The answer is N'." in lone.agents[0].prompt and "Your last line" not in lone.agents[0].prompt
    solver, verifier = team.agents
    assert "Your last line: 'The answer is' and the number." in verifier.prompt
    assert "Other agents read your output. Your last line: 'The answer is' and the number." in solver.prompt
    assert "The answer is N" not in verifier.prompt + solver.prompt  # no placeholder anywhere in a team
    # a task without a team format keeps its one format; a bare string gets a generic line
    (plain,) = execute_specs([chain("small", length=2)], [Task("What is 2+2?", "End with 'The answer is N'.")], pool)
    assert "End with 'The answer is N'." in plain.agents[1].prompt
    (bare,) = execute_specs([chain("small", length=2)], ["What is 2+2?"], pool)
    assert "Give your final answer clearly." in bare.agents[1].prompt


def test_cost_tokens_and_latency_totals() -> None:
    pool, _ = make_pool()
    (trace,) = execute_specs([debate("small", debaters=2, rounds=2)], ["q"], pool)
    assert len(trace.agents) == 5 and trace.agent_calls == 5
    assert trace.prompt_tokens == 50 and trace.completion_tokens == 25
    assert trace.cost == pytest.approx(5 * (10 * 1.0 + 5 * 2.0) / 1e6)
    assert trace.latency_s == pytest.approx(3 * 0.25)  # three levels on the critical path


def test_cache_reexecutes_only_edited_agent_and_descendants() -> None:
    pool, backends = make_pool()
    cache = ExecutionCache()
    original = chain("large", length=3)
    execute_specs([original], ["q"], pool, cache=cache)
    calls_before = sum(backends["large"].batches)
    # Counterfactual edit: downgrade the middle agent. a1 must come from the cache.
    agents = [a.model_copy() for a in original.agents]
    agents[1] = agents[1].model_copy(update={"capacity": "small"})
    edited = OrchestrationSpec(agents=agents, output=original.output)
    (trace,) = execute_specs([edited], ["q"], pool, cache=cache)
    assert [a.cached for a in trace.agents] == [True, False, False]
    assert sum(backends["large"].batches) - calls_before == 1  # a3 only (its parent's output changed)
    assert backends["small"].batches == [1]  # a2
    assert trace.agent_calls == 2 and cache.hits == 1
    a1 = trace.agents[0]  # a cache hit is priced like a real call, so rewards do not depend on the cache
    assert a1.cost == pytest.approx(pool.cost("large", a1.prompt_tokens, a1.completion_tokens)) and a1.cost > 0


def test_identical_calls_in_one_batch_are_sent_once() -> None:
    pool, backends = make_pool()
    traces = execute_specs([cot("small")] * 4, ["same task"] * 4, pool)
    assert backends["small"].batches == [1]
    assert len({t.cost for t in traces}) == 1 and traces[0].cost > 0  # same spec, same price (reward)


def test_failed_agent_fails_its_spec_only() -> None:
    pool, _ = make_pool(fail_roles=["Verifier 1"])
    traces = execute_specs([chain("large", 3), cot("large")], ["q1", "q2"], pool)
    bad, good = traces
    assert not bad.ok and "a2" in (bad.error or "") and "timeout" in (bad.error or "")
    assert bad.answer == ""
    assert bad.agents[2].error == "skipped: parent 'a2' failed"
    assert good.ok and good.answer == "large:Solver:0"


def test_mismatched_specs_and_tasks() -> None:
    pool, _ = make_pool()
    with pytest.raises(ValueError, match="2 specs but 1 tasks"):
        execute_specs([cot("small"), cot("small")], ["q"], pool)


def test_specs_of_different_depth_in_one_call() -> None:
    pool, backends = make_pool()
    spec = OrchestrationSpec(agents=[
        AgentSpec(id="p", role="Planner", base_role="planner", duty="Plan.", capacity="small"),
        AgentSpec(id="s", role="Solver", base_role="solver", duty="Solve.", capacity="large", depends_on=["p"]),
    ], output="s")
    traces = execute_specs([spec, cot("large"), chain("large", 4)], ["a", "b", "c"], pool)
    assert all(t.ok for t in traces)
    assert backends["large"].batches == [2, 2, 1, 1]
    assert backends["small"].batches == [1]


def test_remembered_answers_are_reused_by_a_later_process_and_charged_the_same(tmp_path: Path) -> None:
    """A run's stages share answers on disk (pool.remember_answers): the second execution of the same specs
    sends nothing to the backends, and its traces cost exactly what the first ones cost."""
    pool, backends = make_pool()
    pool.remember_answers(tmp_path / "answers")
    specs, tasks = [chain("large", length=2), cot("small")], ["task a", "task b"]
    first = execute_specs(specs, tasks, pool, cache=ExecutionCache.for_pool(pool))
    assert backends["large"].batches == [1, 1] and backends["small"].batches == [1]
    files = list((tmp_path / "answers").glob("*.jsonl"))
    assert len(files) == 1 and len(files[0].read_text().splitlines()) == 3

    later, later_backends = make_pool()  # a later stage: a fresh process, the same folder
    later.remember_answers(tmp_path / "answers")
    cache = ExecutionCache.for_pool(later)
    again = execute_specs(specs, tasks, later, cache=cache)
    assert later_backends["large"].batches == [] and later_backends["small"].batches == []
    assert cache.hits == 3 and all(a.cached for t in again for a in t.agents)
    assert [(t.answer, t.cost, t.tokens) for t in again] == [(t.answer, t.cost, t.tokens) for t in first]
    other_seed = execute_specs(specs, tasks, later, cache=ExecutionCache.for_pool(later), seed=1)
    assert later_backends["large"].batches == [1, 1] and other_seed[0].ok  # a different call really runs


def test_a_torn_line_in_the_answer_files_is_skipped_not_fatal(tmp_path: Path) -> None:
    pool, backends = make_pool()
    pool.remember_answers(tmp_path)
    execute_specs([cot("large")], ["task"], pool, cache=ExecutionCache.for_pool(pool))
    [answers] = tmp_path.glob("*.jsonl")
    line = answers.read_text()
    answers.write_text(line + line[: len(line) // 2])  # a writer killed mid-line
    assert len(ExecutionCache.for_pool(pool)) == 1
    assert len(ExecutionCache()) == 0 and ExecutionCache.for_pool(make_pool()[0]).hits == 0  # off by default


def test_requests_with_a_grammar_stay_in_memory(tmp_path: Path) -> None:
    cache = ExecutionCache(tmp_path)
    request = GenerationRequest((("user", "write a spec"),), grammar=object())
    cache.put("large", request, Completion("spec", 5, 5))
    assert cache.get("large", request) is not None and not list(tmp_path.glob("*.jsonl"))


class GreedyModelBackend(RecordingBackend):
    """A language model double: its greedy answer does not depend on the seed."""

    greedy_uses_seed = False


def test_greedy_model_calls_carry_no_seed_so_every_stage_shares_them() -> None:
    """The teacher sweep, the rollouts and the evaluation execute with different seeds; a greedy call to a
    language model gives the same answer for every seed, so it carries none and runs once per run. A sampled
    level and the simulated pool (whose draws depend on the seed) keep the seed: there another seed is
    another call."""
    pool = CapacityPool(levels=[
        CapacityLevel(name="small", backend="transformers", model="x", price_in_per_1m=1.0, price_out_per_1m=2.0),
        CapacityLevel(name="large", backend="transformers", model="y", price_in_per_1m=10.0, price_out_per_1m=20.0,
                      temperature=0.7),
    ])
    assert not pool.greedy_uses_seed("small")  # decided from the level: no model is loaded to ask
    small, large = GreedyModelBackend("small"), GreedyModelBackend("large")
    pool.set_backend("small", small)
    pool.set_backend("large", large)
    cache = ExecutionCache()
    first = execute_specs([cot("small"), cot("large")], ["task", "task"], pool, cache=cache, seed=0)
    again = execute_specs([cot("small"), cot("large")], ["task", "task"], pool, cache=cache, seed=7)
    assert small.batches == [1] and large.batches == [1, 1]  # the greedy call ran once; the sampled one twice
    assert again[0].agents[0].cached and not again[1].agents[0].cached
    assert first[0].answer == again[0].answer

    simulated, backends = make_pool()  # greedy, but every simulated answer is a seeded draw
    assert simulated.greedy_uses_seed("large")
    sim_cache = ExecutionCache()
    execute_specs([cot("large")], ["task"], simulated, cache=sim_cache, seed=0)
    execute_specs([cot("large")], ["task"], simulated, cache=sim_cache, seed=7)
    assert backends["large"].batches == [1, 1]
    unknown = CapacityPool(levels=[CapacityLevel(name="small", backend="transformers", model="x",
                                                 price_in_per_1m=1.0, price_out_per_1m=2.0)])
    unknown.set_backend("small", RecordingBackend("small"))  # a backend that does not say: keep the seed
    assert unknown.greedy_uses_seed("small")


def test_call_key_names_one_cache_entry() -> None:
    """``AgentTrace.call`` tells which agents of different specs one call served: equal exactly when the
    node cache's key (capacity, whole request) is equal."""
    from lemon_core.executor import call_key

    base = GenerationRequest.chat("sys", "user", max_tokens=64, temperature=0.0, top_p=1.0, seed=None)
    assert call_key("small", base) == call_key("small", GenerationRequest.chat("sys", "user", max_tokens=64,
                                                                               temperature=0.0, top_p=1.0))
    others = [("large", base), ("small", GenerationRequest.chat("sys", "user", max_tokens=65)),
              ("small", GenerationRequest.chat("sys", "user", max_tokens=64, seed=3)),
              ("small", GenerationRequest.chat("sys", "other", max_tokens=64))]
    assert len({call_key("small", base), *(call_key(c, r) for c, r in others)}) == 1 + len(others)
    pool, _ = make_pool()
    traces = execute_specs([cot("small"), cot("small"), cot("large")], ["q", "q", "q"], pool, cache=ExecutionCache())
    calls = [t.agents[0].call for t in traces]
    assert calls[0] == calls[1] != calls[2] and traces[1].agents[0].cached
