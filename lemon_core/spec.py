"""Orchestration spec: the multi-agent program an orchestrator LLM writes, and how lemon reads it.

The orchestrator writes step-structured YAML (JSON is accepted too):

    agents:
      - id: a1
        role: Arithmetic planner
        base_role: planner
        duty: Break the word problem into numbered steps.
        capacity: small
        depends_on: []
      - id: a2
        ...
    output: a2

`parse_spec` finds that block in raw model output (```yaml fence, <spec> tags, or bare YAML),
validates it, and returns it with the character span of every field value in the ORIGINAL text.
Counterfactual training puts its reward contrast on exactly the tokens of an edited field, so spans
must be exact. Span convention: a span covers the value's characters as written. For a plain scalar
that is the exact text; for a quoted scalar the quote characters are excluded (escapes such as \\"
stay as written); for a block scalar (`duty: |`) the header line is skipped and surrounding
whitespace trimmed, so the span runs from the first to the last content character. For a list
(`depends_on`) the span covers the whole list node, `[a1, a2]` or the block `- a1 ... - a2` lines.
A tag or anchor in front of a value (`!!str "Planner"`, `&x Planner`) is not part of its span. A byte
order mark before the spec is skipped.

Validation of a written spec (`validate_spec`, `parse_spec`) adds one rule to the graph checks that
every `OrchestrationSpec` passes: every agent's work must reach the answer, so the output agent is read
by no other agent and every other agent is read by at least one. Role, duty and capacity must be
visible text: no control characters (a duty may hold line breaks and tabs), no zero-width or other
invisible format characters.

Every spec field is text. YAML's typing of unquoted scalars is ignored (`id: 1` is the id "1",
`duty: yes` is the duty "yes"), because the orchestrator writes words, not typed data; only an empty
value (YAML null) counts as missing. The YAML is composed with a SafeLoader subclass that refuses
aliases and bounds node count and depth, so "billion laughs" documents cost nothing; nothing is
ever constructed from tags and nothing is eval'd.
"""

from __future__ import annotations

import difflib
import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from lemon_core.roles import BASE_ROLES


class HasLevels(Protocol):
    """What ``parse_spec`` needs of a capacity pool (``pool.CapacityPool``): its level names, cheapest first.
    A protocol, so the spec layer does not depend on the pool (and its backends)."""

    @property
    def level_names(self) -> list[str]: ...

AGENT_FIELDS = ("id", "role", "base_role", "duty", "capacity", "depends_on")
SPEC_FIELDS = ("agents", "output")
ID_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
NULL_TAG = "tag:yaml.org,2002:null"


class SpecError(ValueError):
    """The spec is unusable; the message names the agent and field and says how to fix it."""


def _where(agent: str | None, field: str) -> str:
    return f"agent {agent!r} field {field!r}" if agent else f"field {field!r}"


def _choices(value: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(value, list(options), n=1)
    return f"use one of {list(options)}" + (f" (did you mean {close[0]!r}?)" if close else "")


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return f"text {value[:40]!r}"
    return {dict: "a mapping", list: "a list", type(None): "nothing"}.get(type(value), type(value).__name__)


# Control characters (Cc), invisible format characters (Cf: zero-width space and joiners, bidi overrides,
# BOM, soft hyphen), lone surrogates (Cs) and line/paragraph separators (Zl, Zp) in a role or duty are
# text a person reading the spec cannot see, yet the agents' prompts would carry them.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _check_visible(value: str, allowed: str = "") -> None:
    for i, ch in enumerate(value):
        if ch not in allowed and unicodedata.category(ch) in _HIDDEN_CATEGORIES:
            name = unicodedata.name(ch, "a control character")
            fine = " (line breaks and tabs are fine)" if allowed else ""
            raise ValueError(f"character {i + 1} is U+{ord(ch):04X} ({name}), which is invisible or a control "
                             f"character; write plain visible text{fine}")


# --- the spec objects -----------------------------------------------------------------------------
class AgentSpec(BaseModel):
    """One agent: who it is (role, inherited base_role), what it must do (duty), how big a model
    it runs on (capacity), and whose outputs it reads (depends_on, earlier agents only)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    role: str
    base_role: str
    duty: str
    capacity: str
    depends_on: list[str] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _id_shape(cls, value: str) -> str:
        if not ID_RE.fullmatch(value):
            raise ValueError(f"bad id {value!r}; use letters, digits, '_', '-' or '.' (e.g. a1, step_2)")
        return value

    @field_validator("depends_on", mode="before")
    @classmethod
    def _empty_means_none(cls, value: Any) -> Any:
        return [] if value is None else value  # `depends_on:` with nothing after it

    @field_validator("role", "duty", "capacity")
    @classmethod
    def _not_blank(cls, value: str, info: ValidationInfo) -> str:
        if not value.strip():
            raise ValueError("empty; write a value")
        _check_visible(value, allowed="\n\t" if info.field_name == "duty" else "")
        return value

    @field_validator("base_role")
    @classmethod
    def _known_base_role(cls, value: str) -> str:
        if value not in BASE_ROLES:
            raise ValueError(f"unknown base role {value!r}; {_choices(value, list(BASE_ROLES))}")
        return value


class OrchestrationSpec(BaseModel):
    """Agents in execution order plus the id of the agent whose answer is final. Constructing one
    checks the graph (unique ids, references to earlier agents only, known output)."""

    model_config = ConfigDict(extra="forbid")

    agents: list[AgentSpec]
    output: str

    @model_validator(mode="after")
    def _graph_is_valid(self) -> OrchestrationSpec:
        _check_graph(self.agents, self.output)
        return self

    def agent(self, agent_id: str) -> AgentSpec:
        for agent in self.agents:
            if agent.id == agent_id:
                return agent
        raise KeyError(f"no agent {agent_id!r}; agents are {[a.id for a in self.agents]}")

    def levels(self) -> list[list[AgentSpec]]:
        """Topological levels: level 0 has no dependencies, level k = 1 + deepest parent level.
        Agents of one level are independent, so the executor batches them; order is declaration order."""
        depth: dict[str, int] = {}
        for agent in self.agents:  # parents are declared earlier, so one pass suffices
            depth[agent.id] = 1 + max((depth[d] for d in agent.depends_on), default=-1)
        levels: list[list[AgentSpec]] = [[] for _ in range(1 + max(depth.values(), default=-1))]
        for agent in self.agents:
            levels[depth[agent.id]].append(agent)
        return levels

    def children(self, agent_id: str) -> list[str]:
        return [a.id for a in self.agents if agent_id in a.depends_on]

    def descendants(self, agent_id: str) -> set[str]:
        """Agents whose inputs change when `agent_id` changes: what a counterfactual must re-run."""
        found: set[str] = set()
        frontier = [agent_id]
        while frontier:
            for child in self.children(frontier.pop()):
                if child not in found:
                    found.add(child)
                    frontier.append(child)
        return found

    def ancestors(self, agent_id: str) -> set[str]:
        """Agents whose outputs `agent_id` reads, directly or not: reusable from the cache."""
        found: set[str] = set()
        frontier = list(self.agent(agent_id).depends_on)
        while frontier:
            parent = frontier.pop()
            if parent not in found:
                found.add(parent)
                frontier.extend(self.agent(parent).depends_on)
        return found


def _check_graph(agents: Sequence[AgentSpec], output: str) -> None:
    if not agents:
        raise SpecError("spec has no agents; list at least one under 'agents:'")
    position: dict[str, int] = {}
    for i, agent in enumerate(agents):
        if agent.id in position:
            raise SpecError(f"{_where(agent.id, 'id')}: duplicate id (agents #{position[agent.id] + 1} "
                            f"and #{i + 1}); give every agent a unique id")
        position[agent.id] = i
    for agent in agents:
        for j, dep in enumerate(agent.depends_on):
            where = _where(agent.id, f"depends_on[{j}]")
            if dep == agent.id:
                raise SpecError(f"{where}: an agent cannot depend on itself; remove {dep!r}")
            if dep not in position:
                raise SpecError(f"{where}: unknown agent {dep!r}; {_choices(dep, list(position))}")
            if dep in agent.depends_on[:j]:
                raise SpecError(f"{where}: {dep!r} is listed twice; list each dependency once")
    cycle = _find_cycle(agents)
    if cycle:
        raise SpecError(f"{_where(cycle[0], 'depends_on')}: dependency cycle {' -> '.join(cycle)}; "
                        "depends_on may only name agents declared earlier")
    for agent in agents:
        for j, dep in enumerate(agent.depends_on):
            if position[dep] > position[agent.id]:
                raise SpecError(f"{_where(agent.id, f'depends_on[{j}]')}: {dep!r} is declared later; "
                                f"depends_on may only name EARLIER agents (list {dep!r} above {agent.id!r})")
    if output not in position:
        raise SpecError(f"field 'output': unknown agent {output!r}; name the agent whose answer is final, "
                        f"{_choices(output, list(position))}")


def _find_cycle(agents: Sequence[AgentSpec]) -> list[str] | None:
    """Depth-first search for a dependency cycle; returns it as a closed path (a -> b -> a)."""
    parents = {a.id: a.depends_on for a in agents}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for parent in parents.get(node, []):
            if state.get(parent) == 1:
                return path[path.index(parent):] + [parent]
            if parent not in state and (cycle := visit(parent)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for agent_id in parents:
        if agent_id not in state and (cycle := visit(agent_id)):
            return cycle
    return None


# --- limits and validation ------------------------------------------------------------------------
class SpecLimits(BaseModel):
    """Size bounds: a spec is model output, so its size must be bounded before anything runs it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_agents: int = Field(default=12, ge=1)
    max_id_chars: int = Field(default=40, ge=1)
    max_role_chars: int = Field(default=200, ge=1)
    max_duty_chars: int = Field(default=2000, ge=1)
    max_text_chars: int = Field(default=20000, ge=1, description="whole raw text given to parse_spec")
    max_yaml_nodes: int = Field(default=5000, ge=1, description="composed YAML nodes, keys included")
    max_yaml_depth: int = Field(default=10, ge=2, description="YAML nesting depth (a spec needs 5)")


def validate_spec(spec: OrchestrationSpec | Mapping[str, Any], levels: Sequence[str] | None = None,
                  limits: SpecLimits | None = None) -> OrchestrationSpec:
    """Check a spec (object or plain data) against shape, graph, size limits and, when given, the
    capacity level names. Returns the validated OrchestrationSpec or raises SpecError."""
    limits = limits or SpecLimits()
    data = spec.model_dump() if isinstance(spec, OrchestrationSpec) else spec
    _check_shape(data, limits)
    try:
        parsed = OrchestrationSpec.model_validate(data)
    except ValidationError as exc:
        raise _translate(exc, data) from None
    _check_sizes(parsed, limits)
    _check_every_agent_feeds_output(parsed)
    if levels is not None:
        names = [levels] if isinstance(levels, str) else list(levels)
        for agent in parsed.agents:
            if agent.capacity not in names:
                raise SpecError(f"{_where(agent.id, 'capacity')}: unknown level {agent.capacity!r}; "
                                f"{_choices(agent.capacity, names)}")
    return parsed


def _check_every_agent_feeds_output(spec: OrchestrationSpec) -> None:
    """Every agent's answer must reach the final one: the output agent is read by no one (else the work
    of its readers is thrown away) and every other agent is read by someone (else its own work is).
    This is a rule for specs as written, in ``validate_spec``/``parse_spec``; ``OrchestrationSpec``
    itself only requires an executable graph, so a counterfactual edit that drops a dependency (and
    with it the only reader of an agent) still builds."""
    readers: dict[str, list[str]] = {a.id: [] for a in spec.agents}
    for agent in spec.agents:
        for dep in agent.depends_on:
            readers[dep].append(agent.id)
    if readers[spec.output]:
        sinks = [a.id for a in spec.agents if not readers[a.id]]
        raise SpecError(f"field 'output': agent {spec.output!r} is read by {readers[spec.output]}, whose work "
                        f"would then be thrown away; name the final agent, one no agent depends on (e.g. "
                        f"`output: {sinks[-1]}`), or remove {spec.output!r} from their depends_on")
    order = [a.id for a in spec.agents]
    for agent in spec.agents:
        if agent.id != spec.output and not readers[agent.id]:
            example = f" (e.g. the output {spec.output!r})" if order.index(spec.output) > order.index(agent.id) else ""
            raise SpecError(f"agent {agent.id!r}: no agent depends on it and it is not the output, so its work "
                            f"would be thrown away; add {agent.id!r} to the depends_on of an agent declared "
                            f"after it{example}, or remove agent {agent.id!r}")


def _check_shape(data: Any, limits: SpecLimits) -> None:
    """The structural errors pydantic would phrase badly: wrong top-level type, unknown fields, size."""
    if not isinstance(data, Mapping):
        raise SpecError(f"spec must be a mapping with fields 'agents' and 'output'; got {_kind(data)}")
    for key in data:
        if key not in SPEC_FIELDS:
            raise SpecError(f"field {key!r}: unknown top-level field; a spec has only 'agents' and 'output'")
    agents = data.get("agents")
    if agents is None or agents == []:
        raise SpecError("spec has no agents; list at least one under 'agents:'")
    if not isinstance(agents, list):
        raise SpecError(f"field 'agents': expected a list of agents (`- id: ...` items); got {_kind(agents)}")
    if len(agents) > limits.max_agents:
        raise SpecError(f"field 'agents': {len(agents)} agents, at most {limits.max_agents} allowed; "
                        "merge or drop agents")
    for i, agent in enumerate(agents):
        if not isinstance(agent, Mapping):
            raise SpecError(f"agent #{i + 1}: expected a mapping with fields {list(AGENT_FIELDS)}; "
                            f"got {_kind(agent)}")
        for key in agent:
            if key not in AGENT_FIELDS:
                raise SpecError(f"{_where(_agent_name(agents, i), str(key))}: unknown field; "
                                f"allowed fields are {list(AGENT_FIELDS)}")
    if data.get("output") in (None, ""):
        raise SpecError("field 'output': missing; name the agent whose answer is final, e.g. `output: a2`")


def _agent_name(agents: list[Any], index: int) -> str:
    agent_id = agents[index].get("id") if isinstance(agents[index], Mapping) else None
    return agent_id if isinstance(agent_id, str) and agent_id else f"#{index + 1}"


_HINTS = {
    "missing": "missing; every agent needs id, role, base_role, duty and capacity",
    "string_type": "expected text",
    "list_type": "expected a list of agent ids, e.g. [a1, a2]",
}


def _translate(exc: ValidationError, data: Mapping[str, Any]) -> SpecError:
    """Turn pydantic's first error into a SpecError that names the agent (by id) and the field."""
    error = exc.errors()[0]
    original = error.get("ctx", {}).get("error")
    if isinstance(original, SpecError):
        return original
    loc = error["loc"]
    agent, field = None, ".".join(str(part) for part in loc)
    if len(loc) >= 3 and loc[0] == "agents" and isinstance(loc[1], int):
        agent = _agent_name(data["agents"], loc[1])
        field = str(loc[2]) + "".join(f"[{part}]" for part in loc[3:])
    if isinstance(original, ValueError):
        message = str(original)
    else:
        message = _HINTS.get(error["type"], error["msg"])
        if error["type"] != "missing":
            message += f"; got {_kind(error['input'])}"
    return SpecError(f"{_where(agent, field)}: {message}")


def _check_sizes(spec: OrchestrationSpec, limits: SpecLimits) -> None:
    for agent in spec.agents:
        for field, limit in (("id", limits.max_id_chars), ("capacity", limits.max_id_chars),
                             ("role", limits.max_role_chars), ("duty", limits.max_duty_chars)):
            n = len(getattr(agent, field))
            if n > limit:
                name = agent.id if field != "id" else agent.id[: limits.max_id_chars] + "..."
                raise SpecError(f"{_where(name, field)}: {n} characters, at most {limit} allowed; shorten it")


# --- canonical rendering --------------------------------------------------------------------------
class _FlowList(list):
    """Marks a list to be written in flow style: `depends_on: [a1, a2]`."""


class _SpecDumper(yaml.SafeDumper):
    """Canonical spec YAML: indented block lists, no line wrapping, multi-line text as `|` blocks,
    and double quotes (not escaped single quotes) for text containing an apostrophe, so that as
    many span texts as possible equal their values verbatim."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)


def _verbatim_in_double_quotes(ch: str) -> bool:
    """PyYAML writes these unescaped inside "..." (with allow_unicode); others become escapes."""
    return ("\x20" <= ch <= "\x7e" and ch not in '"\\') or ("\xa0" <= ch <= "\ufffd" and ch != "\ufeff")


def _represent_text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = None
    if any(ch in value for ch in "\x85\u2028\u2029\ufeff"):  # PyYAML mangles these unless escaped
        style = '"'
    elif "\n" in value:  # a block span starts at its first visible character, so no leading blanks
        style = "|" if value[0] not in " \t\n" else '"'
    elif "'" in value and all(_verbatim_in_double_quotes(ch) for ch in value):
        style = '"'
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_SpecDumper.add_representer(str, _represent_text)
_SpecDumper.add_representer(_FlowList, lambda dumper, value: dumper.represent_sequence(
    "tag:yaml.org,2002:seq", value, flow_style=True))


def renumber_agents(spec: OrchestrationSpec) -> OrchestrationSpec:
    """The same team with ids a1, a2, ... in execution order (dependencies and output renamed with them):
    the form a grammar with sequential ids writes (``grammar.spec_grammar(sequential_ids=True)``), so SFT
    targets and constrained samples agree."""
    new = {a.id: f"a{i}" for i, a in enumerate(spec.agents, start=1)}
    agents = [a.model_copy(update={"id": new[a.id], "depends_on": [new[d] for d in a.depends_on]})
              for a in spec.agents]
    return OrchestrationSpec(agents=agents, output=new[spec.output])


def render_spec(spec: OrchestrationSpec) -> str:
    """The spec as canonical step-structured YAML; parse_spec(render_spec(s)).spec == s."""
    data = {
        "agents": [{"id": a.id, "role": a.role, "base_role": a.base_role, "duty": a.duty,
                    "capacity": a.capacity, "depends_on": _FlowList(a.depends_on)} for a in spec.agents],
        "output": spec.output,
    }
    return yaml.dump(data, Dumper=_SpecDumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=10**9)


def render_spec_json(spec: OrchestrationSpec) -> str:
    """The spec as compact one-line JSON (the ``spec_format: json`` twin of ``render_spec``).

    JSON is a subset of YAML, so ``parse_spec`` reads it with exact spans like any spec; this is the
    form a JSON-schema-guided sampler (vLLM structured outputs) is constrained to. Compact, because the
    guided grammar then allows no free whitespace: what the policy learns in SFT is exactly what the
    grammar admits, and a weak policy cannot spend its token budget on blank space.
    """
    data = {
        "agents": [{"id": a.id, "role": a.role, "base_role": a.base_role, "duty": a.duty,
                    "capacity": a.capacity, "depends_on": list(a.depends_on)} for a in spec.agents],
        "output": spec.output,
    }
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def spec_json_schema(levels: Sequence[str], limits: SpecLimits | None = None) -> dict[str, Any]:
    """JSON schema of a spec over capacity ``levels``, for guided decoding.

    It pins what a grammar can pin - field names and order, base roles and capacities from their
    closed sets, id shape, sizes - so a guided sample is always well-formed. What a context-free
    schema cannot say (ids unique, ``depends_on`` naming earlier agents, ``output`` naming an agent)
    is still checked by ``parse_spec``, and such a sample is still an invalid spec with its penalty.
    """
    lim = limits or SpecLimits()
    # the id's length bound lives in the pattern: xgrammar rejects pattern + maxLength together
    agent_id = {"type": "string", "pattern": f"^[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{lim.max_id_chars - 1}}}$"}
    agent = {
        "type": "object",
        "properties": {
            "id": agent_id,
            "role": {"type": "string", "minLength": 1, "maxLength": lim.max_role_chars},
            "base_role": {"enum": list(BASE_ROLES)},
            "duty": {"type": "string", "minLength": 1, "maxLength": lim.max_duty_chars},
            "capacity": {"enum": list(levels)},
            "depends_on": {"type": "array", "items": agent_id, "maxItems": lim.max_agents},
        },
        "required": list(AGENT_FIELDS),
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            "agents": {"type": "array", "items": agent, "minItems": 1, "maxItems": lim.max_agents},
            "output": agent_id,
        },
        "required": list(SPEC_FIELDS),
        "additionalProperties": False,
    }
