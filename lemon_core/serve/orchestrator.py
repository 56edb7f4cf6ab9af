"""Turn tasks into specs with the orchestrator model, then execute them: the service's batch function.

The orchestrator is reached through a ``Backend`` like every other model: an OpenAI-compatible
server (vLLM in the cluster, ``orchestrator_base_url``) or an in-process transformers model (the CPU
default; a path, a trained checkpoint, a train-output folder or a ``lemon models`` alias). It is
prompted with ``policy.orchestrator_messages`` - the exact prompt it was trained on.

An output that does not parse, or a spec over the request's budget, gets ONE re-sample with another
seed at ``resample_temperature`` (greedy decoding would just repeat the mistake); if that fails too,
the request fails with the parser's message. Budget: at most ``max_agents`` agents (enforced by the
parser's limits) and at most ``max_tokens`` completion tokens in the worst case, i.e. the sum of the
agents' capacity levels' ``max_tokens`` - known before anything runs, so a team can never overspend.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lemon_core.backends.base import STOPPED, Backend, Completion, GenerationRequest
from lemon_core.executor import Task, Trace, execute_specs
from lemon_core.metrics import LemonMetrics
from lemon_core.models import ModelError, resolve_model
from lemon_core.policy import orchestrator_messages
from lemon_core.pool import CapacityPool
from lemon_core.prompts import PromptSettings, settings_for_model
from lemon_core.serve.settings import ServeSettings
from lemon_core.spec import SpecError, SpecLimits
from lemon_core.spec_text import ParsedSpec, parse_spec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """One request's work: the task, how the answer must look, and its budget.

    ``abandoned`` is set by the HTTP layer when the client went away. Every model call made for the job
    carries it as ``GenerationRequest.stop``: a decode in progress drops the job's rows at its next step,
    an HTTP call in flight is dropped, and the batch skips the job's re-sample and its remaining agents,
    so nobody pays for an answer no one will read while the other jobs of the batch go on.
    """

    task: str
    answer_format: str = ""
    team_answer_format: str = ""  # for an output agent with parents; "" means answer_format (executor)
    max_agents: int = 8
    max_tokens: int = 8192
    abandoned: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)


@dataclass
class SpecOutcome:
    """What the orchestrator wrote for one job, over at most two attempts."""

    parsed: ParsedSpec | None = None
    text: str = ""
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    error: str | None = None
    error_type: str | None = None  # "invalid_spec" | "orchestrator_unavailable" | "abandoned"


@dataclass
class JobResult:
    spec: SpecOutcome
    trace: Trace | None = None
    seconds: dict[str, float] = field(default_factory=dict)


def resolve_orchestrator_path(name: str) -> str:
    """A train-output folder (``<out>/checkpoints/latest``) means its latest checkpoint; else ``name``."""
    pointer = Path(name) / "checkpoints" / "latest"
    if pointer.is_file():
        return str(Path(name) / "checkpoints" / pointer.read_text().strip())
    return name


def with_model_prompt(settings: ServeSettings) -> ServeSettings:
    """``settings`` with the in-process orchestrator's own prompt settings, where its folder records them
    (``prompts.PROMPT_SETTINGS_FILE``, written when lemon saves a model): a model trained without the format
    example is served without it. A setting given explicitly that contradicts the record is a ValueError
    naming it. Over HTTP (``orchestrator_base_url``) there is no folder to read: the settings stand."""
    if settings.orchestrator_base_url:
        return settings
    try:
        folder = resolve_model(resolve_orchestrator_path(settings.orchestrator))
    except ModelError:
        return settings  # not provisioned: building its backend says so, with the command to run
    prompt = settings_for_model(folder, PromptSettings.of(settings), settings.model_fields_set,
                                "the service settings (LEMON_*)")
    return settings.model_copy(update=prompt.model_dump())


def make_orchestrator_backend(settings: ServeSettings, pool: CapacityPool) -> Backend:
    """The backend that runs the orchestrator (loads weights for in-process models)."""
    if settings.orchestrator_base_url:
        from lemon_core.backends.openai_http import OpenAIBackend

        return OpenAIBackend(
            base_url=settings.orchestrator_base_url, model=settings.orchestrator,
            api_key_env=settings.orchestrator_api_key_env, timeout_s=settings.orchestrator_timeout_s,
            max_concurrency=settings.batch_max_size,
        )
    for level in pool.levels:  # same model already serves a level: share the loaded weights
        if level.backend == "transformers" and level.model == settings.orchestrator and not level.options:
            return pool.backend(level.name)
    from lemon_core.backends.transformers_backend import TransformersBackend

    return TransformersBackend(
        resolve_orchestrator_path(settings.orchestrator), device=settings.orchestrator_device,
        dtype=settings.orchestrator_dtype, seed=settings.seed, max_batch_size=settings.batch_max_size,
    )


def spec_budget_error(parsed: ParsedSpec, pool: CapacityPool, max_tokens: int) -> str | None:
    """Why the spec's worst-case completion tokens exceed ``max_tokens`` (None when within)."""
    worst = sum(pool.level(a.capacity).max_tokens for a in parsed.spec.agents)
    if worst <= max_tokens:
        return None
    return (f"spec may generate up to {worst} completion tokens ({len(parsed.spec.agents)} agents at their "
            f"levels' max_tokens) but the budget is max_tokens={max_tokens}; use fewer or cheaper agents")


class Orchestrator:
    """Writes (and re-samples once) specs for a batch of jobs through one backend call per attempt."""

    def __init__(self, backend: Backend, pool: CapacityPool, settings: ServeSettings,
                 metrics: LemonMetrics | None = None) -> None:
        self.backend = backend
        self.pool = pool
        self.settings = settings
        self.metrics = metrics

    def request(self, task: str, seed: int, temperature: float, max_agents: int | None = None,
                stop: threading.Event | None = None) -> GenerationRequest:
        s = self.settings
        msgs = orchestrator_messages(task, self.pool, s.include_roles, s.include_format, s.spec_format)
        grammar = None
        if s.orchestrator_grammar:
            from lemon_core.grammar import spec_grammar

            text = s.orchestrator_grammar_max_text_chars
            limits = SpecLimits(max_agents=max_agents or SpecLimits().max_agents, max_role_chars=min(text, 200),
                                max_duty_chars=text)
            grammar = spec_grammar(self.pool.level_names, s.spec_format, limits, sequential_ids=True)
        return GenerationRequest(messages=tuple((m["role"], m["content"]) for m in msgs),
                                 max_tokens=s.orchestrator_max_tokens, temperature=temperature, seed=seed,
                                 grammar=grammar, stop=stop)

    def write_specs(self, jobs: Sequence[Job]) -> list[SpecOutcome]:
        s = self.settings
        outcomes = [SpecOutcome() for _ in jobs]
        todo = [i for i, job in enumerate(jobs) if not job.abandoned.is_set()]
        for attempt, (seed, temperature) in enumerate(
                [(s.seed, s.orchestrator_temperature), (s.seed + 1, s.resample_temperature)]):
            if not todo:
                break
            completions = self.backend.generate(
                [self.request(jobs[i].task, seed, temperature, jobs[i].max_agents, jobs[i].abandoned) for i in todo])
            if len(completions) != len(todo):
                raise RuntimeError(f"orchestrator backend returned {len(completions)} completions "
                                   f"for {len(todo)} requests")
            for i, completion in zip(todo, completions, strict=True):
                self._check(outcomes[i], jobs[i], completion, attempt + 1)
            todo = [i for i in todo if outcomes[i].parsed is None and not jobs[i].abandoned.is_set()]
        return outcomes

    def _check(self, out: SpecOutcome, job: Job, completion: Completion, attempt: int) -> None:
        out.attempts = attempt
        out.text = completion.text
        out.prompt_tokens += completion.prompt_tokens
        out.completion_tokens += completion.completion_tokens
        out.latency_s += completion.latency_s
        if completion.error == STOPPED:  # the client went away: not a failure of the orchestrator
            out.error, out.error_type = "the client went away", "abandoned"
            return
        if not completion.ok:
            log.warning("orchestrator call failed (attempt %d): %s", attempt, completion.error)
            out.error = "the orchestrator model did not answer; see server logs"
            out.error_type = "orchestrator_unavailable"
            return
        try:
            parsed = parse_spec(completion.text, self.pool, SpecLimits(max_agents=job.max_agents))
            why = spec_budget_error(parsed, self.pool, job.max_tokens)
            if why is not None:
                raise SpecError(why)
        except (SpecError, yaml.YAMLError) as e:  # YAMLError: parse_spec lets some reader errors through
            if self.metrics is not None:
                self.metrics.spec_invalid.inc()
            log.info("invalid spec from the orchestrator (attempt %d): %s", attempt, e)
            out.error = f"the orchestrator wrote an invalid spec twice; last error: {e}"
            out.error_type = "invalid_spec"
            return
        out.parsed, out.error, out.error_type = parsed, None, None


def run_jobs(orchestrator: Orchestrator, jobs: Sequence[Job]) -> list[JobResult]:
    """The service's batch function: write all specs, execute the valid ones together, count metrics."""
    t0 = time.perf_counter()
    outcomes = orchestrator.write_specs(jobs)
    t1 = time.perf_counter()
    results = [JobResult(spec=o, seconds={"orchestrate": t1 - t0}) for o in outcomes]
    for job, outcome in zip(jobs, outcomes, strict=True):
        if job.abandoned.is_set():
            outcome.parsed, outcome.error, outcome.error_type = None, "the client went away", "abandoned"
    ok = [i for i, o in enumerate(outcomes) if o.parsed is not None]
    if ok:
        traces = execute_specs(
            [outcomes[i].parsed.spec for i in ok],  # type: ignore[union-attr]
            [Task(jobs[i].task, jobs[i].answer_format, jobs[i].team_answer_format, stop=jobs[i].abandoned)
             for i in ok],
            orchestrator.pool, seed=orchestrator.settings.seed,
        )
        t2 = time.perf_counter()
        for i, trace in zip(ok, traces, strict=True):
            results[i].trace = trace
            results[i].seconds["execute"] = t2 - t1
            if orchestrator.metrics is not None:
                for a in trace.agents:
                    if not a.cached and a.error is None:
                        orchestrator.metrics.record_call(
                            a.capacity, a.prompt_tokens, a.completion_tokens, a.cost)
    return results
