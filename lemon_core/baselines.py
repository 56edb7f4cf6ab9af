"""Baseline multi-agent methods, written as orchestration specs.

Every baseline is a function returning an ``OrchestrationSpec``, so it runs on the same executor,
pool, prompts and scoring as the orchestrator's own specs: comparisons are on the same footing.
The topologies follow the usual multi-agent baselines the LEMON paper compares with (CoT,
self-consistency, chain, tree, complete graph, LLM-debate).

Self-consistency's vote is an ``aggregator`` agent told to report the majority answer of the
solvers; it runs at the cheapest level because reading N short answers needs little capacity.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from lemon_core.config.names import ORCHESTRATOR, SFT_ORCHESTRATOR, SMALL_TOPOLOGIES  # noqa: F401 - baselines.X API
from lemon_core.spec import AgentSpec, OrchestrationSpec, renumber_agents

SOLVE = "Solve the task step by step, then state the final answer."
VERIFY = "Check the previous solution step by step; fix any mistake and state the final answer."
VOTE = "Read the solutions and report the final answer that most of them give."
DEBATE_OPEN = "Solve the task step by step and state your final answer."
DEBATE_REPLY = ("Read the other debaters' answers, point out any mistake, reconsider your own "
                "reasoning and state your final answer.")
JUDGE = "Read the debate and give the final answer the debaters' best arguments support."



def _agent(id_: str, role: str, base_role: str, duty: str, capacity: str, deps: list[str]) -> AgentSpec:
    return AgentSpec(id=id_, role=role, base_role=base_role, duty=duty, capacity=capacity, depends_on=deps)


def cot(capacity: str = "large") -> OrchestrationSpec:
    """Chain-of-thought: one solver agent."""
    return OrchestrationSpec(agents=[_agent("a1", "Solver", "solver", SOLVE, capacity, [])], output="a1")


def self_consistency(capacity: str = "large", n: int = 3, vote_capacity: str | None = None) -> OrchestrationSpec:
    """N independent solvers, then a majority-vote aggregator."""
    solvers = [_agent(f"s{i + 1}", f"Solver {i + 1}", "solver", SOLVE, capacity, []) for i in range(n)]
    vote = _agent("vote", "Majority voter", "aggregator", VOTE, vote_capacity or capacity, [s.id for s in solvers])
    return OrchestrationSpec(agents=[*solvers, vote], output="vote")


def chain(capacity: str = "large", length: int = 3) -> OrchestrationSpec:
    """A solver followed by verifiers, each reading the one before."""
    agents = [_agent("a1", "Solver", "solver", SOLVE, capacity, [])]
    for i in range(2, length + 1):
        agents.append(_agent(f"a{i}", f"Verifier {i - 1}", "verifier", VERIFY, capacity, [f"a{i - 1}"]))
    return OrchestrationSpec(agents=agents, output=agents[-1].id)


def tree(capacity: str = "large", branches: int = 2) -> OrchestrationSpec:
    """A planner fans out to parallel solvers whose answers an aggregator merges."""
    planner = _agent("plan", "Planner", "planner", "Break the task into the steps needed to solve it.", capacity, [])
    solvers = [_agent(f"s{i + 1}", f"Solver {i + 1}", "solver", SOLVE, capacity, ["plan"]) for i in range(branches)]
    merge = _agent("merge", "Aggregator", "aggregator", VOTE, capacity, [s.id for s in solvers])
    return OrchestrationSpec(agents=[planner, *solvers, merge], output="merge")


def complete_graph(capacity: str = "large", n: int = 3) -> OrchestrationSpec:
    """Every agent reads every earlier agent (a DAG's complete graph)."""
    agents = [
        _agent(f"a{i + 1}", f"Solver {i + 1}", "solver" if i == 0 else "verifier",
               SOLVE if i == 0 else VERIFY, capacity, [f"a{j + 1}" for j in range(i)])
        for i in range(n)
    ]
    return OrchestrationSpec(agents=agents, output=agents[-1].id)


def debate(capacity: str = "large", debaters: int = 2, rounds: int = 2) -> OrchestrationSpec:
    """LLM debate: each round every debater reads all answers of the previous round; a judge decides."""
    agents: list[AgentSpec] = []
    previous: list[str] = []
    for r in range(1, rounds + 1):
        current = []
        for d in range(1, debaters + 1):
            aid = f"r{r}d{d}"
            duty = DEBATE_OPEN if r == 1 else DEBATE_REPLY
            agents.append(_agent(aid, f"Debater {d} (round {r})", "debater", duty, capacity, list(previous)))
            current.append(aid)
        previous = current
    agents.append(_agent("judge", "Judge", "aggregator", JUDGE, capacity, previous))
    return OrchestrationSpec(agents=agents, output="judge")


BASELINES: dict[str, Callable[..., OrchestrationSpec]] = {
    "cot": cot,
    "sc": self_consistency,
    "chain": chain,
    "tree": tree,
    "complete": complete_graph,
    "debate": debate,
}




def small_topology(name: str, capacity: str, field: str = "sft.topologies") -> OrchestrationSpec:
    """A baseline topology at its smallest size (2 solvers, 2 steps, 2 branches, 2 debaters x 1 round), all
    at ``capacity``: the teams the SFT warm-up varies and the teacher sweep tries. ``field`` names the
    config field in the error."""
    small = {"cot": lambda: cot(capacity), "sc": lambda: self_consistency(capacity, n=2),
             "chain": lambda: chain(capacity, length=2), "tree": lambda: tree(capacity, branches=2),
             "debate": lambda: debate(capacity, debaters=2, rounds=1)}
    if name not in small:
        raise ValueError(f"{field}: unknown topology {name!r}; use some of {list(small)}")
    return small[name]()


def baseline_spec(method: str, capacity: str, cheapest: str | None = None) -> OrchestrationSpec:
    """The spec of baseline ``method`` with every agent at ``capacity`` (SC votes at ``cheapest``)."""
    if method not in BASELINES:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(BASELINES)} or pass --spec FILE")
    if method == "sc":
        return self_consistency(capacity, vote_capacity=cheapest or capacity)
    return BASELINES[method](capacity)


def team_structure(spec: OrchestrationSpec) -> Hashable:
    """What makes two specs the same team, as one comparable value: per agent its base role, capacity and
    whom it reads, and which agent answers. Free text (roles, duties) and id names are left out, and so is
    the order agents are declared in, so a spec that is CoT@large's with the solver renamed, or a tree with
    its branches listed the other way round, equals the baseline's.

    The agents are put in a canonical order and then renumbered (``renumber_agents``): by dependency depth,
    then by a colour that describes an agent's place in the graph. Colours start as (depth, base role,
    capacity, is output) and are refined with the colours of each agent's parents and children until they
    stop splitting (colour refinement), so agents with equal colours are, in every spec a baseline or an
    orchestrator writes, interchangeable; ties keep declaration order. Equal values always mean the same
    team, since the value is the renumbered graph itself."""
    depth = {a.id: d for d, level in enumerate(spec.levels()) for a in level}
    colour: dict[str, Any] = {a.id: (depth[a.id], a.base_role, a.capacity, a.id == spec.output) for a in spec.agents}
    children = {a.id: spec.children(a.id) for a in spec.agents}
    for _ in spec.agents:
        signature = {a.id: (colour[a.id], tuple(sorted(colour[p] for p in a.depends_on)),
                            tuple(sorted(colour[c] for c in children[a.id]))) for a in spec.agents}
        rank = {sig: i for i, sig in enumerate(sorted(set(signature.values())))}
        refined = {agent_id: rank[sig] for agent_id, sig in signature.items()}
        settled = len(set(refined.values())) == len(set(colour.values()))
        colour = refined
        if settled:
            break
    position = {a.id: i for i, a in enumerate(spec.agents)}
    ordered = sorted(spec.agents, key=lambda a: (colour[a.id], position[a.id]))
    canonical = renumber_agents(OrchestrationSpec(agents=ordered, output=spec.output))
    return (tuple((a.base_role, a.capacity, tuple(sorted(a.depends_on))) for a in canonical.agents), canonical.output)


def team_shape(spec: OrchestrationSpec) -> str:
    """The shape of a team's dependency graph, free text and capacities aside: ``single`` (one agent), ``chainN``
    (each agent reads the one before), ``voteN`` (N − 1 independent agents read by the output agent) or ``dagN``.
    What the training panels count per step, so a move between one solver and a team is visible."""
    n = len(spec.agents)
    if n == 1:
        return "single"
    ids = [a.id for a in spec.agents]
    if all(a.depends_on == ([ids[i - 1]] if i else []) for i, a in enumerate(spec.agents)) and spec.output == ids[-1]:
        return f"chain{n}"
    others = [a for a in spec.agents if a.id != spec.output]
    if all(not a.depends_on for a in others) and sorted(spec.agent(spec.output).depends_on) == sorted(
            a.id for a in others):
        return f"vote{n}"
    return f"dag{n}"
