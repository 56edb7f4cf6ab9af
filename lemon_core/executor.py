"""Run orchestration specs as real multi-agent systems, many specs at once.

``execute_specs`` walks all specs level by level (level k = agents whose parents are all in levels
< k). At each level it gathers the agent calls of *every* spec, groups them by capacity, and sends
each group to that capacity's backend as **one** batch. Forty specs of three levels therefore cost
about three batched calls per capacity instead of 120 single calls; ``bench/executor.py`` measures it.

A node-level ``ExecutionCache`` remembers each agent call by everything that determines it: the
capacity level and the exact request (role, duty, task, parents' outputs, sampling parameters and
seed). Re-executing a counterfactually edited spec therefore only runs the edited agent and its
descendants; its ancestors are cache hits with the very same outputs, which is what makes the edit
a counterfactual.

One agent failing (backend timeout, server error) is recorded on its trace; its descendants are
skipped, the spec's answer is empty and ``Trace.error`` says why. The batch goes on.

A task may carry ``stop`` (an event; the service sets it when the client went away): its agents' requests
carry it to the backends, which end them early, and once it is set the task's remaining levels are
skipped, so an abandoned task stops costing compute while the other specs of the batch go on.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Protocol, TextIO

from lemon_core.backends.base import STOPPED, Completion, GenerationRequest, StopSignal
from lemon_core.pool import CapacityPool
from lemon_core.prompts import agent_messages
from lemon_core.roles import ANSWERING_ROLES
from lemon_core.spec import AgentSpec, OrchestrationSpec


class TaskLike(Protocol):
    """What the executor needs of a task: its text and (optionally) how the answer must look. A task may
    also carry ``team_answer_format``: the instruction for a final agent that reads other agents' outputs."""

    question: str
    answer_format: str


@dataclass(frozen=True)
class Task:
    """A plain task. Benchmark examples fit the same shape (``question``, ``answer_format``,
    ``team_answer_format``)."""

    question: str
    answer_format: str = ""
    team_answer_format: str = ""  # "" means answer_format
    stop: StopSignal | None = field(default=None, compare=False, repr=False)  # set: the answer is not wanted


@dataclass
class AgentTrace:
    """One agent's call: what it saw, what it said, what it cost."""

    agent_id: str
    capacity: str
    system: str
    prompt: str
    output: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    latency_s: float = 0.0
    cached: bool = False
    error: str | None = None
    call: str = ""  # the call's identity (``call_key``): two agents with equal ``call`` were one cache entry
    looped: bool = False  # a greedy answer its backend stopped in a repetition loop (Completion.looped)


@dataclass
class Trace:
    """A whole spec's execution on one task. ``answer`` is the output agent's text ('' on failure)."""

    spec: OrchestrationSpec
    task: str
    agents: list[AgentTrace] = field(default_factory=list)
    answer: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def prompt_tokens(self) -> int:
        return sum(a.prompt_tokens for a in self.agents)

    @property
    def completion_tokens(self) -> int:
        return sum(a.completion_tokens for a in self.agents)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost(self) -> float:
        return sum(a.cost for a in self.agents)

    @property
    def agent_calls(self) -> int:
        """Agent calls that really ran (cache hits are free and not counted)."""
        return sum(1 for a in self.agents if not a.cached and a.error is None)

    @property
    def latency_s(self) -> float:
        """Critical-path latency: per DAG level the slowest agent, summed over levels."""
        by_level: dict[int, float] = defaultdict(float)
        levels = {a.id: k for k, level in enumerate(self.spec.levels()) for a in level}
        for a in self.agents:
            by_level[levels[a.agent_id]] = max(by_level[levels[a.agent_id]], a.latency_s)
        return sum(by_level.values())

    def to_dict(self) -> dict[str, object]:
        return {
            "task": self.task, "spec": self.spec.model_dump(), "answer": self.answer, "error": self.error,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "cost": self.cost, "latency_s": self.latency_s, "agents": [asdict(a) for a in self.agents],
        }


class ExecutionCache:
    """Completed agent calls keyed by (capacity, request). Counts hits and misses.

    ``persist_dir`` (a run's ``node-cache/<pool>`` folder, see ``CapacityPool.remember_answers``) keeps the
    answers on disk too, so a later stage of the same run reuses them: the evaluation of an orchestrator
    that writes CoT's very spec costs nothing twice. Each writing process appends to its own JSONL file
    (no two writers share a file); every file is read at start. A line cut short by a killed writer is
    skipped. Requests with a grammar (the orchestrator's) are only remembered in memory.
    """

    def __init__(self, persist_dir: Path | None = None) -> None:
        self._store: dict[tuple[str, GenerationRequest], Completion] = {}
        self.hits = 0
        self.misses = 0
        self._persist_dir = persist_dir
        self._out: TextIO | None = None
        if persist_dir is not None:
            for path in sorted(persist_dir.glob("*.jsonl")):
                self._load(path)

    @classmethod
    def for_pool(cls, pool: CapacityPool) -> ExecutionCache:
        """A cache that also reads and writes the pool's remembered answers, when it has any."""
        return cls(pool.answer_cache_dir)

    def get(self, capacity: str, request: GenerationRequest) -> Completion | None:
        found = self._store.get((capacity, request))
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def put(self, capacity: str, request: GenerationRequest, completion: Completion) -> None:
        if not completion.ok:  # failures are not remembered: a retry should really retry
            return
        self._store[(capacity, request)] = completion
        if self._persist_dir is not None and request.grammar is None:
            self._append({"capacity": capacity, "request": _request_row(request),
                          "completion": asdict(completion)})

    def __len__(self) -> int:
        return len(self._store)

    def _load(self, path: Path) -> None:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                request = GenerationRequest(
                    messages=tuple((r, c) for r, c in row["request"]["messages"]),
                    **{k: v for k, v in row["request"].items() if k != "messages"},
                )
                self._store[(row["capacity"], request)] = Completion(**row["completion"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # a torn last line of a killed writer: that call simply runs again

    def _append(self, row: dict[str, object]) -> None:
        if self._out is None:
            assert self._persist_dir is not None
            self._persist_dir.mkdir(parents=True, exist_ok=True)
            name = f"answers-{os.getpid()}-{uuid.uuid4().hex[:6]}.jsonl"
            self._out = (self._persist_dir / name).open("a", encoding="utf-8")
        self._out.write(json.dumps(row, default=str) + "\n")
        self._out.flush()


def _request_row(request: GenerationRequest) -> dict[str, object]:
    """The JSON form of a grammar-free request (what ``ExecutionCache._load`` reads back): every field of
    the request's identity, so a field added to ``GenerationRequest`` is part of the persisted key too. Not
    ``asdict``: it would deep-copy ``stop`` (an event holding a lock), which is no part of the identity."""
    return {f.name: getattr(request, f.name) for f in fields(request) if f.compare and f.name != "grammar"}


def call_key(capacity: str, request: GenerationRequest) -> str:
    """A short stable digest of (capacity, request), so traces can tell which agents of different specs were
    served by one call without keeping the requests. For agent calls (no grammar) it is the node cache's
    key; of a grammar only its presence counts (the cache keys on the grammar object itself)."""
    row = json.dumps([capacity, _request_row(request), request.grammar is not None], sort_keys=True, default=str)
    return hashlib.sha256(row.encode()).hexdigest()[:16]


def agent_seed(seed: int, agent_id: str) -> int:
    """Sampling seed of one agent: stable across specs, so edited and original specs share it."""
    digest = hashlib.sha256(f"{seed}:{agent_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def build_request(
    agent: AgentSpec, spec: OrchestrationSpec, task: TaskLike | str, outputs: dict[str, str],
    pool: CapacityPool, seed: int,
) -> GenerationRequest:
    """The chat request for ``agent`` given its parents' outputs (all parents must be done)."""
    question = _task_text(task)
    parents = [(p, spec.agent(p).role, outputs[p]) for p in agent.depends_on]
    is_output = agent.id == spec.output
    answers = is_output or agent.base_role in ANSWERING_ROLES  # an upstream planner or critic gets no format line
    system, user = agent_messages(
        role=agent.role, base_role=agent.base_role, duty=agent.duty, task=question, parents=parents,
        answer_format=final_answer_format(task, in_team=bool(parents) or not is_output) if answers else None,
        is_output=is_output,
    )
    level = pool.level(agent.capacity)
    return GenerationRequest.chat(
        system, user, max_tokens=level.max_tokens, temperature=level.temperature,
        top_p=level.top_p, seed=agent_seed(seed, agent.id) if uses_seed(pool, agent.capacity) else None,
    )


def uses_seed(pool: CapacityPool, capacity: str) -> bool:
    """Whether a call at ``capacity`` depends on its seed. A greedy call (temperature 0) to a language
    model does not: it carries no seed, so the same agent call made by the teacher sweep, a rollout and an
    evaluation (each with its own seed) is one cache entry and runs once per run. The simulated pool draws
    even greedy answers from the seed (``CapacityPool.greedy_uses_seed``)."""
    return pool.level(capacity).temperature > 0 or pool.greedy_uses_seed(capacity)


def execute_specs(
    specs: Sequence[OrchestrationSpec],
    tasks: Sequence[TaskLike | str],
    pool: CapacityPool,
    *,
    cache: ExecutionCache | None = None,
    seed: int = 0,
    on_calls: Callable[[int], None] | None = None,
) -> list[Trace]:
    """Execute ``specs[i]`` on ``tasks[i]`` for all i, batching each level's calls per capacity.

    ``cache`` (optional) is read and written; pass the same cache to re-execute edited specs
    cheaply. ``on_calls(n)`` is told after each batched group that ``n`` more agent calls are done
    (cache hits included): one group can take minutes on a CPU pool, so progress is counted in calls.
    """
    if len(specs) != len(tasks):
        raise ValueError(f"execute_specs got {len(specs)} specs but {len(tasks)} tasks; pass one task per spec")
    traces = [Trace(spec=s, task=_task_text(t)) for s, t in zip(specs, tasks, strict=True)]
    outputs: list[dict[str, str]] = [{} for _ in specs]
    failed: list[set[str]] = [set() for _ in specs]
    spec_levels = [s.levels() for s in specs]
    depth = max((len(lv) for lv in spec_levels), default=0)

    for k in range(depth):
        # Gather this level's agent calls from every spec, grouped by capacity.
        groups: dict[str, list[tuple[int, AgentSpec, GenerationRequest]]] = defaultdict(list)
        for i, levels in enumerate(spec_levels):
            if k >= len(levels):
                continue
            stop = getattr(tasks[i], "stop", None)
            for agent in levels[k]:
                if stop is not None and stop.is_set():
                    failed[i].add(agent.id)
                    traces[i].agents.append(AgentTrace(agent.id, agent.capacity, "", "", error=STOPPED))
                    continue
                bad_parents = [p for p in agent.depends_on if p in failed[i]]
                if bad_parents:
                    failed[i].add(agent.id)
                    traces[i].agents.append(AgentTrace(
                        agent.id, agent.capacity, "", "", error=f"skipped: parent {bad_parents[0]!r} failed"))
                    continue
                request = replace(build_request(agent, specs[i], tasks[i], outputs[i], pool, seed), stop=stop)
                groups[agent.capacity].append((i, agent, request))

        for capacity, group in groups.items():
            completions, cached = _run_group(capacity, [r for _, _, r in group], pool, cache)
            if on_calls is not None:
                on_calls(len(group))
            for (i, agent, request), completion, was_cached in zip(group, completions, cached, strict=True):
                system, user = request.messages[0][1], request.messages[-1][1]
                # cost = the call's price at pool rates, cache hit or not: a spec's reward (and so a
                # counterfactual's Delta) must not depend on which other specs shared the batch/cache
                record = AgentTrace(
                    agent.id, capacity, system, user, completion.text, completion.prompt_tokens,
                    completion.completion_tokens,
                    pool.cost(capacity, completion.prompt_tokens, completion.completion_tokens),
                    0.0 if was_cached else completion.latency_s, was_cached, completion.error,
                    call_key(capacity, request), completion.looped,
                )
                traces[i].agents.append(record)
                if completion.ok:
                    outputs[i][agent.id] = completion.text
                else:
                    failed[i].add(agent.id)

    for i, trace in enumerate(traces):
        out = specs[i].output
        if out in outputs[i]:
            trace.answer = outputs[i][out]
        else:
            first = next((a for a in trace.agents if a.error and not a.error.startswith("skipped")), None)
            trace.error = f"agent {first.agent_id!r} failed: {first.error}" if first else "no answer"
    return traces


def _run_group(
    capacity: str, requests: list[GenerationRequest], pool: CapacityPool, cache: ExecutionCache | None,
) -> tuple[list[Completion], list[bool]]:
    """Serve one capacity's requests: cache hits first, then one backend batch for the rest.

    Identical requests inside the batch (same agent call in several specs) are sent once.
    """
    results: list[Completion | None] = [None] * len(requests)
    was_cached = [False] * len(requests)
    pending: dict[GenerationRequest, list[int]] = {}
    for j, req in enumerate(requests):
        hit = cache.get(capacity, req) if cache is not None else None
        if hit is not None:
            results[j], was_cached[j] = hit, True
        else:
            pending.setdefault(req, []).append(j)
    if pending:
        # a call shared by several specs may stop only when every one of them stopped
        unique = [replace(req, stop=_all_of([requests[j].stop for j in js])) for req, js in pending.items()]
        start = time.perf_counter()
        completions = pool.backend(capacity).generate(unique)
        if len(completions) != len(unique):
            raise RuntimeError(f"backend for {capacity!r} returned {len(completions)} completions "
                               f"for {len(unique)} requests")
        if any(c.latency_s == 0 for c in completions):  # backend did not time requests itself
            share = (time.perf_counter() - start) / len(unique)
            for c in completions:
                c.latency_s = c.latency_s or share
        for req, completion in zip(unique, completions, strict=True):
            if cache is not None:
                cache.put(capacity, req, completion)
            first, *dupes = pending[req]
            results[first] = completion
            for j in dupes:  # the same call made by another spec: served once, counted once
                results[j], was_cached[j] = completion, True
    return [r for r in results if r is not None], was_cached


class _AllSet:
    """Set once every one of ``signals`` is set."""

    def __init__(self, signals: Sequence[StopSignal]) -> None:
        self.signals = signals

    def is_set(self) -> bool:
        return all(s.is_set() for s in self.signals)


def _all_of(signals: Sequence[StopSignal | None]) -> StopSignal | None:
    """One stop signal for a call several owners share: None when any owner never stops."""
    if any(s is None for s in signals):
        return None
    unique = list({id(s): s for s in signals if s is not None}.values())
    return unique[0] if len(unique) == 1 else _AllSet(unique)


DEFAULT_ANSWER_FORMAT = "Give your final answer clearly."  # a bare-string task, or one without a format


def final_answer_format(task: TaskLike | str, in_team: bool) -> str:
    """The answer-format line of an answering agent. A lone solver (a spec of one agent) gets the task's
    ``answer_format``; an agent that reads or is read by other agents gets ``team_answer_format`` where the
    task has one, because a final agent that reads others copies a format's placeholder ("The answer is N.")
    instead of answering (bench/answer_format.py: 24 of 24 team answers with MultiArith's format, 0 of 24
    without the placeholder), and an upstream solver's placeholder would be copied downstream."""
    lone = "" if isinstance(task, str) else task.answer_format
    team = "" if isinstance(task, str) else getattr(task, "team_answer_format", "")
    return (team if in_team and team else lone) or DEFAULT_ANSWER_FORMAT


def _task_text(task: TaskLike | str) -> str:
    return task if isinstance(task, str) else task.question
