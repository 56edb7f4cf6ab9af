"""Every prompt of lemon, in one place: the orchestrator's and each executed agent's.

The orchestrator prompt (``orchestrator_messages``) is used everywhere - SFT, rollouts, evaluation and
serving - so the policy is always trained on exactly what it will be asked. It lists the task, the
pool's capacity levels (cheapest first, with prices) and, optionally, the base-role library, then asks
for a step-structured YAML spec in a ```yaml block (or a bare JSON object with ``spec_format="json"``,
which YAML also reads). The format example is rendered by ``render_spec``, so prompt, SFT targets and
parser can never disagree about the format.

An agent's prompt is its role and customised duty (system message), then the task, then the outputs
of the agents it depends on (user message). The agent named as the spec's ``output`` also gets the
benchmark's answer-format instruction, so the team's final answer can be extracted and scored; when it
reads other agents' outputs, the benchmark's placeholder-free team format instead
(``executor.final_answer_format``). An answering agent (``roles.ANSWERING_ROLES``) that other agents read
gets the team format too, as ``UPSTREAM_FORMAT``: a solver told how to state its result is a stronger
solver, whether or not its answer is the team's (bench/solver_prompt.py).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from lemon_core.pool import CapacityPool
from lemon_core.roles import BASE_ROLES
from lemon_core.spec import AgentSpec, OrchestrationSpec, render_spec, render_spec_json

# --- the orchestrator -----------------------------------------------------------------------------
SpecFormat = Literal["yaml", "json"]
SPEC_FORMATS: tuple[str, ...] = ("yaml", "json")

ORCHESTRATOR_SYSTEM = (
    "You are an orchestrator. You do not solve tasks yourself: you design a small team of AI agents "
    "that solves the task reliably at low cost, and write it as an executable YAML spec."
)

ORCHESTRATOR_FORMAT = (
    "Write the team as a YAML spec in a ```yaml block, in exactly this format:\n"
    "```yaml\n{example}```\n"
    "Agents run in the listed order. depends_on lists earlier agents whose outputs the agent reads. "
    "output is the id of the agent whose answer is final; every other agent is read by a later one. "
    "capacity is one of: {levels}. "
    "The example only shows the format: choose the agents and each one's capacity for the task below "
    "(a capable level costs more; a wrong answer is worth nothing)."
)

ORCHESTRATOR_FORMAT_JSON = (
    "Write the team as a JSON object, in exactly this format:\n{example}\n"
    "Agents run in the listed order. depends_on lists earlier agents whose outputs the agent reads. "
    "output is the id of the agent whose answer is final; every other agent is read by a later one. "
    "capacity is one of: {levels}. "
    "The example only shows the format: choose the agents and each one's capacity for the task below "
    "(a capable level costs more; a wrong answer is worth nothing)."
)


PROMPT_SETTINGS_FILE = "lemon_prompt.json"


class PromptSettings(BaseModel):
    """How an orchestrator model is prompted. A model must be asked the way it was trained, so these are written
    beside its weights (``PROMPT_SETTINGS_FILE``, by ``checkpoint.save_model_dir``) and read back by every loader:
    training stages, ``lemon eval --orchestrator`` and the service (``settings_for_model``)."""

    model_config = ConfigDict(extra="forbid")

    include_roles: bool = True
    include_format: bool = True
    spec_format: SpecFormat = "yaml"

    @classmethod
    def of(cls, source: object) -> PromptSettings:
        """The prompt settings held by ``source``: a train config, the service settings or a policy, which all
        carry these three fields under the same names."""
        return cls(**{name: getattr(source, name) for name in cls.model_fields})


def write_prompt_settings(folder: str | Path, settings: PromptSettings) -> None:
    (Path(folder) / PROMPT_SETTINGS_FILE).write_text(settings.model_dump_json(indent=2) + "\n")


def read_prompt_settings(folder: str | Path) -> PromptSettings | None:
    """The prompt settings a model folder was trained with; None where it has no record (a base model)."""
    path = Path(folder) / PROMPT_SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        return PromptSettings.model_validate(json.loads(path.read_text()))
    except (ValueError, ValidationError) as e:
        raise ValueError(f"{path}: not a prompt-settings record ({str(e).splitlines()[0]}); lemon writes it when "
                         "a model is saved: restore it, or delete it to prompt with your own settings") from None


def settings_for_model(folder: str | Path, requested: PromptSettings, explicit: Collection[str],
                       where: str = "the config") -> PromptSettings:
    """The prompt settings to use for the model in ``folder``: its recorded ones, else ``requested``.

    A setting the caller chose explicitly (named in ``explicit``, e.g. pydantic's ``model_fields_set``) that
    differs from the record is an error, not a silent override: the model would be asked in a prompt it was never
    trained on. Settings the caller left at their defaults take the record's values.
    """
    record = read_prompt_settings(folder)
    if record is None:
        return requested
    conflicts = [f for f in PromptSettings.model_fields
                 if f in explicit and getattr(requested, f) != getattr(record, f)]
    if conflicts:
        said = ", ".join(f"{f}={getattr(requested, f)!r}" for f in conflicts)
        trained = ", ".join(f"{f}: {json.dumps(getattr(record, f))}" for f in conflicts)
        raise ValueError(f"{where} asks for {said}, but the model in {folder} was trained with {trained} "
                         f"({PROMPT_SETTINGS_FILE}); set {trained} or leave it out to use the model's own")
    return record


def _check_format(spec_format: str) -> None:
    if spec_format not in SPEC_FORMATS:
        raise ValueError(f"spec_format={spec_format!r}: use one of {list(SPEC_FORMATS)}")


def _example_spec(pool: CapacityPool) -> OrchestrationSpec:
    """The format example: two agents at two different levels, so the prompt shows the fields and a
    dependency without suggesting one team or one capacity as the default answer."""
    levels = pool.level_names
    return OrchestrationSpec(
        agents=[
            AgentSpec(id="a1", role="Planner", base_role="planner", duty="List the steps that solve the task.",
                      capacity=levels[0]),
            AgentSpec(id="a2", role="Solver", base_role="solver", duty="Follow the plan and state the answer.",
                      capacity=levels[-1], depends_on=["a1"]),
        ],
        output="a2",
    )


def orchestrator_messages(
    question: str,
    pool: CapacityPool,
    include_roles: bool = True,
    include_format: bool = True,
    spec_format: SpecFormat = "yaml",
) -> list[dict[str, str]]:
    """Chat messages asking for a spec for ``question`` (the one orchestrator prompt of lemon).

    ``include_roles`` lists the base-role library; ``include_format`` shows the format (YAML or JSON,
    ``spec_format``) with an example. Both are on for real models; a policy already fine-tuned on the
    format (or a tiny test model with 1024 positions) may drop them for a much shorter prompt.
    """
    _check_format(spec_format)
    levels = "\n".join(
        f"- {lv.name}: ${lv.price_in_per_1m:g} in / ${lv.price_out_per_1m:g} out per 1M tokens"
        for lv in pool.levels
    )
    # The task comes last: everything before it is the same for every task, so a sampler computes that
    # shared prefix once per batch instead of once per row (backends/shared_prefix.py).
    parts = [f"Capacity levels (cheapest first):\n{levels}"]
    if include_roles:
        # names only: every prompt token is paid at every sample and every update (docs/training.md)
        parts.append("Base roles (each agent inherits one as base_role and customises its duty): "
                     + ", ".join(BASE_ROLES) + ".")
    levels_list = ", ".join(pool.level_names)
    if include_format and spec_format == "json":
        parts.append(ORCHESTRATOR_FORMAT_JSON.format(example=render_spec_json(_example_spec(pool)), levels=levels_list))
    elif include_format:
        parts.append(ORCHESTRATOR_FORMAT.format(example=render_spec(_example_spec(pool)), levels=levels_list))
    elif spec_format == "json":
        parts.append("Write the team as a JSON object.")
    else:
        parts.append("Write the team as a YAML spec in a ```yaml block.")
    parts.append(f"Task:\n{question.strip()}")
    user = "\n\n".join(parts)
    return [{"role": "system", "content": ORCHESTRATOR_SYSTEM}, {"role": "user", "content": user}]


def spec_completion(spec: OrchestrationSpec, spec_format: SpecFormat = "yaml") -> str:
    """What a perfect orchestrator answer looks like (SFT target): the rendered spec in a ```yaml block,
    or the bare JSON object for ``spec_format="json"`` (what a JSON-schema-guided sampler emits)."""
    _check_format(spec_format)
    if spec_format == "json":
        return render_spec_json(spec)
    return f"```yaml\n{render_spec(spec)}```"


# --- agents ---------------------------------------------------------------------------------------
MAX_PARENT_CHARS = 2000  # a parent's output is cut to this many characters before it is passed on

AGENT_SYSTEM = "You are {role}, working as the {base_role} in a small team of AI agents.\nYour duty: {duty}"

AGENT_TASK = "Task:\n{task}"
AGENT_PARENT = "Output of {role} ({agent_id}):\n{output}"
AGENT_FINAL = "You give the team's final answer. {answer_format}"
UPSTREAM_FORMAT = "Other agents read your output. {answer_format}"  # measured in bench/solver_prompt.py
AGENT_GO = "Now do your duty."


def agent_messages(
    *, role: str, base_role: str, duty: str, task: str,
    parents: list[tuple[str, str, str]], answer_format: str | None, is_output: bool = True,
) -> tuple[str, str]:
    """(system, user) for one agent. ``parents`` is [(agent_id, role, output)] in spec order. ``answer_format``
    (None: no format line) is worded as the team's final answer for the output agent, else as ``UPSTREAM_FORMAT``."""
    system = AGENT_SYSTEM.format(role=role, base_role=base_role, duty=duty)
    parts = [AGENT_TASK.format(task=task)]
    for agent_id, parent_role, output in parents:
        shown = output if len(output) <= MAX_PARENT_CHARS else output[:MAX_PARENT_CHARS] + " [...]"
        parts.append(AGENT_PARENT.format(role=parent_role, agent_id=agent_id, output=shown))
    if answer_format is not None:
        parts.append((AGENT_FINAL if is_output else UPSTREAM_FORMAT).format(answer_format=answer_format).strip())
    parts.append(AGENT_GO)
    return system, "\n\n".join(parts)
