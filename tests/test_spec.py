"""Spec parsing, validation, spans and rendering (lemon_core/spec.py)."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lemon_core.roles import BASE_ROLES
from lemon_core.spec import ID_RE, AgentSpec, OrchestrationSpec, SpecError, SpecLimits, render_spec, validate_spec
from lemon_core.spec_text import ParsedSpec, parse_spec

LEVELS = ["small", "medium", "large"]

SPEC_YAML = """agents:
  - id: a1
    role: Arithmetic planner
    base_role: planner
    duty: Break the word problem into numbered steps.
    capacity: small
    depends_on: []
  - id: a2
    role: Calculator
    base_role: solver
    duty: Carry out the steps and give the final number.
    capacity: large
    depends_on: [a1]
output: a2
"""


def agent(agent_id: str, deps: list[str] | None = None, **overrides: str) -> dict:
    data = {"id": agent_id, "role": f"Role {agent_id}", "base_role": "solver", "duty": "Solve it.",
            "capacity": "small", "depends_on": deps or []}
    data.update(overrides)
    return data


def spec_data(*agents: dict, output: str | None = None) -> dict:
    return {"agents": list(agents), "output": output or agents[-1]["id"]}


def is_quoted(text: str, start: int, end: int) -> bool:
    return start > 0 and text[start - 1] in "\"'" and text[end:end + 1] == text[start - 1]


def decode_span(text: str, start: int, end: int) -> str:
    """What the characters of a span mean as a YAML value, following the span convention:
    quoted scalars exclude their quotes, block scalars are indented continuation lines."""
    if is_quoted(text, start, end):
        return yaml.safe_load(text[start - 1:end + 1])
    segment = text[start:end]
    if "\n" not in segment:
        return segment
    column = start - (text.rfind("\n", 0, start) + 1)
    first, *rest = segment.split("\n")
    return "\n".join([first] + [line[column:] for line in rest])


def assert_spans_exact(parsed: ParsedSpec) -> None:
    """Every recorded span decodes to its field's value, and every present field has a span."""
    text, spec = parsed.text, parsed.spec
    assert decode_span(text, *parsed.spans[("", "output")]) == spec.output
    for a in spec.agents:
        for field in ("id", "role", "base_role", "duty", "capacity"):
            value = getattr(a, field)
            span = parsed.spans[(a.id, field)]
            decoded = decode_span(text, *span)
            if "\n" in value and not is_quoted(text, *span):  # a `|` block: span ends at the last character
                value = value.rstrip("\n")
            assert decoded == value, (field, decoded)
        for i, dep in enumerate(a.depends_on):
            assert decode_span(text, *parsed.spans[(a.id, f"depends_on[{i}]")]) == dep
        if (a.id, "depends_on") in parsed.spans:
            start, end = parsed.spans[(a.id, "depends_on")]
            node = yaml.safe_load(text[start:end].replace("\t", " ")) if end > start else []
            assert node == a.depends_on


# --- finding the spec and exact spans ---------------------------------------------------------------
def test_fenced_yaml_after_prose_has_verbatim_spans() -> None:
    text = "Let me plan this.\n\nHere is the team:\n```yaml\n" + SPEC_YAML + "```\nThat should work."
    parsed = parse_spec(text, pool=LEVELS)
    assert [a.id for a in parsed.spec.agents] == ["a1", "a2"] and parsed.spec.output == "a2"
    for a in parsed.spec.agents:
        for field in ("id", "role", "base_role", "duty", "capacity"):
            assert parsed.span_text(a.id, field) == getattr(a, field)
    assert parsed.span_text("a1", "depends_on") == "[]"
    assert parsed.span_text("a2", "depends_on") == "[a1]"
    assert parsed.span_text("a2", "depends_on[0]") == "a1"
    assert parsed.span_text("", "output") == "a2"
    assert text[slice(*parsed.block)] == SPEC_YAML
    assert ("a1", "depends_on[0]") not in parsed.spans


@pytest.mark.parametrize("wrap", [
    lambda y: f"```yml\n{y}```",
    lambda y: f"```\n{y}```",
    lambda y: f"Thoughts first.\n<spec>\n{y}</spec>\nDone.",
    lambda y: f"<SPEC>```yaml\n{y}```</SPEC>",
    lambda y: f"I will use two agents.\n{y}\nThis plan balances cost and accuracy.",
    lambda y: y + "\nHope this helps!",
    lambda y: "```python\nprint('no spec here')\n```\nNow the spec:\n```yaml\n" + y + "```",
    lambda y: y.replace("\n", "\r\n"),
])
def test_spec_found_in_every_wrapping(wrap) -> None:
    text = wrap(SPEC_YAML)
    parsed = parse_spec(text, pool=LEVELS)
    assert parsed.spec == parse_spec(SPEC_YAML).spec
    assert_spans_exact(parsed)
    assert parsed.span_text("a2", "capacity") == "large"


def test_quoted_multiline_and_commented_values() -> None:
    text = """Plan:
```yaml
agents:
  - id: "p1"
    role: 'Planner: the "first" step'
    base_role: planner   # inherits planner
    duty: |
      Read the problem.
      List the quantities.
    capacity: small
  - id: s1
    role: "Solver with \\"escapes\\""
    base_role: solver
    duty: Solve the
      whole thing carefully.
    capacity: 'large'
    depends_on:
      - p1   # the plan
  - id: v1
    role: It's a checker
    base_role: verifier
    duty: >-
      Check the answer
      twice.
    capacity: medium
    depends_on:
      - "p1"
      - s1
output: 'v1'
```"""
    parsed = parse_spec(text, pool=LEVELS)
    spec = parsed.spec
    assert spec.agent("p1").duty == "Read the problem.\nList the quantities.\n"
    assert spec.agent("s1").duty == "Solve the whole thing carefully."
    assert parsed.span_text("p1", "id") == "p1"
    assert parsed.span_text("p1", "role") == 'Planner: the "first" step'
    assert parsed.span_text("p1", "base_role") == "planner"
    assert parsed.span_text("p1", "duty") == "Read the problem.\n      List the quantities."
    assert parsed.span_text("s1", "role") == 'Solver with \\"escapes\\"'
    assert parsed.span_text("s1", "duty") == "Solve the\n      whole thing carefully."
    assert parsed.span_text("s1", "capacity") == "large"
    assert parsed.span_text("s1", "depends_on") == "- p1"
    assert parsed.span_text("v1", "role") == "It's a checker"
    assert parsed.span_text("v1", "duty") == "Check the answer\n      twice."
    assert parsed.span_text("v1", "depends_on") == '- "p1"\n      - s1'
    assert parsed.span_text("v1", "depends_on[0]") == "p1"
    assert parsed.span_text("v1", "depends_on[1]") == "s1"
    assert parsed.span_text("", "output") == "v1"
    assert ("p1", "depends_on") not in parsed.spans  # absent field, no span


@pytest.mark.parametrize("indent", [None, 2, "\t"])
def test_json_spec_spans_exclude_quotes(indent) -> None:
    data = spec_data(agent("a1", role="Réviseur \"strict\""),
                     agent("a2", ["a1"], duty="Line one.\nLine two.", capacity="medium"))
    body = json.dumps(data, indent=indent, ensure_ascii=False)
    text = f"Here you go:\n```json\n{body}\n```"
    parsed = parse_spec(text, pool=LEVELS)
    assert parsed.spec.model_dump() == data
    assert parsed.span_text("a1", "role") == 'Réviseur \\"strict\\"'
    assert parsed.span_text("a2", "duty") == "Line one.\\nLine two."
    assert parsed.span_text("a2", "capacity") == "medium"
    assert json.loads(parsed.span_text("a2", "depends_on")) == ["a1"]
    deps = parsed.span_text("a2", "depends_on")
    assert deps[0] == "[" and deps[-1] == "]"
    assert parsed.span_text("a2", "depends_on[0]") == "a1"
    assert parsed.span_text("", "output") == "a2"
    assert_spans_exact(parsed)
    assert parse_spec(body).spec == parsed.spec  # bare JSON


def test_numeric_ids_and_null_depends_on_are_text() -> None:
    text = SPEC_YAML.replace("a1", "1").replace("a2", "02").replace("depends_on: []", "depends_on:")
    parsed = parse_spec(text)
    assert [a.id for a in parsed.spec.agents] == ["1", "02"]
    assert parsed.spec.agent("02").depends_on == ["1"]
    assert parsed.span_text("02", "id") == "02"
    assert parsed.spec.agent("1").depends_on == []


# --- graph helpers --------------------------------------------------------------------------------
def diamond() -> OrchestrationSpec:
    return validate_spec(spec_data(agent("plan"), agent("x", ["plan"]), agent("y", ["plan"]),
                                   agent("solo"), agent("agg", ["y", "x"]), agent("final", ["agg", "solo"])))


def test_levels_descendants_ancestors() -> None:
    spec = diamond()
    levels = [[a.id for a in level] for level in spec.levels()]
    assert levels == [["plan", "solo"], ["x", "y"], ["agg"], ["final"]]
    assert spec.descendants("plan") == {"x", "y", "agg", "final"}
    assert spec.descendants("x") == {"agg", "final"}
    assert spec.descendants("final") == set()
    assert spec.ancestors("agg") == {"x", "y", "plan"}
    assert spec.ancestors("final") == {"x", "y", "plan", "agg", "solo"}
    assert spec.ancestors("plan") == set()
    assert spec.agent("agg").depends_on == ["y", "x"]
    with pytest.raises(KeyError, match="nope"):
        spec.agent("nope")


def test_render_is_canonical_and_round_trips() -> None:
    spec = diamond()
    text = render_spec(spec)
    assert "depends_on: [y, x]" in text and text.startswith("agents:\n  - id: plan\n    role: Role plan\n")
    assert parse_spec(text).spec == spec
    assert render_spec(parse_spec(text).spec) == text
    assert render_spec(parse_spec(SPEC_YAML).spec) == SPEC_YAML


# --- errors ---------------------------------------------------------------------------------------
def parse_error(text: str, **kwargs) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(text, **kwargs)
    return str(info.value)


def validate_error(data, **kwargs) -> str:
    with pytest.raises(SpecError) as info:
        validate_spec(data, **kwargs)
    return str(info.value)


def test_unknown_capacity_names_agent_field_and_levels() -> None:
    message = parse_error(SPEC_YAML.replace("capacity: large", "capacity: huge"), pool=["small", "large"])
    assert message == "agent 'a2' field 'capacity': unknown level 'huge'; use one of ['small', 'large']"
    from lemon_core.pool import load_pool

    message = parse_error(SPEC_YAML.replace("capacity: small", "capacity: smal"), pool=load_pool("simulated"))
    assert "agent 'a1' field 'capacity'" in message and "did you mean 'small'" in message
    any_level = parse_spec(SPEC_YAML.replace("capacity: large", "capacity: huge"))  # no pool: any name
    assert any_level.spec.agent("a2").capacity == "huge"


def test_unknown_base_role() -> None:
    message = parse_error(SPEC_YAML.replace("base_role: solver", "base_role: Solver"))
    assert "agent 'a2' field 'base_role'" in message and "did you mean 'solver'" in message


@pytest.mark.parametrize(("data", "expected"), [
    (spec_data(agent("a1"), agent("a2", ["a9"])), "agent 'a2' field 'depends_on[0]': unknown agent 'a9'"),
    (spec_data(agent("a1", ["a2"]), agent("a2")), "agent 'a1' field 'depends_on[0]': 'a2' is declared later"),
    (spec_data(agent("a1"), agent("a2", ["a1", "a2"])), "agent 'a2' field 'depends_on[1]': an agent cannot"),
    (spec_data(agent("a1"), agent("a2", ["a1", "a1"])), "'a1' is listed twice"),
    (spec_data(agent("a1", ["a3"]), agent("a2", ["a1"]), agent("a3", ["a2"])),
     "agent 'a1' field 'depends_on': dependency cycle a1 -> a3 -> a2 -> a1"),
    (spec_data(agent("a1"), agent("a1")), "agent 'a1' field 'id': duplicate id (agents #1 and #2)"),
    (spec_data(agent("a1"), output="a7"), "field 'output': unknown agent 'a7'"),
    ({"agents": [agent("a1")]}, "field 'output': missing"),
    ({"agents": [], "output": "a1"}, "spec has no agents"),
    ({"output": "a1"}, "spec has no agents"),
    ([agent("a1")], "spec must be a mapping with fields 'agents' and 'output'; got a list"),
    ({"agents": {"a1": agent("a1")}, "output": "a1"}, "field 'agents': expected a list of agents"),
    ({"agents": ["a1"], "output": "a1"}, "agent #1: expected a mapping"),
    (spec_data(agent("a1"), agent("a2", "a1")),
     "agent 'a2' field 'depends_on': expected a list of agent ids, e.g. [a1, a2]; got text 'a1'"),
    (spec_data(agent("a1", [3])), "agent 'a1' field 'depends_on[0]': expected text"),
    (spec_data(agent("a1", role={"x": 1})), "agent 'a1' field 'role': expected text; got a mapping"),
    (spec_data({k: v for k, v in agent("a1").items() if k != "duty"}), "agent 'a1' field 'duty': missing"),
    (spec_data(agent("a1", duty="   ")), "agent 'a1' field 'duty': empty"),
    (spec_data(agent("a b")), "agent 'a b' field 'id': bad id"),
    (spec_data(agent("a1", colour="red")), "agent 'a1' field 'colour': unknown field"),
    ({**spec_data(agent("a1")), "notes": "x"}, "field 'notes': unknown top-level field"),
    (spec_data(agent("a1", role="r" * 201)), "agent 'a1' field 'role': 201 characters, at most 200"),
    (spec_data(agent("a1", duty="d" * 2001)), "agent 'a1' field 'duty': 2001 characters, at most 2000"),
    (spec_data(agent("a" * 41)), f"agent '{'a' * 40}...' field 'id': 41 characters, at most 40"),
    (spec_data(*[agent(f"a{i}") for i in range(13)]), "field 'agents': 13 agents, at most 12 allowed"),
])
def test_validation_errors_name_agent_and_field(data, expected: str) -> None:
    assert expected in validate_error(data)


def test_limits_are_configurable() -> None:
    many = spec_data(*[agent(f"a{i}", [f"a{i - 1}"] if i else None) for i in range(13)])  # a chain: all feed a12
    assert len(validate_spec(many, limits=SpecLimits(max_agents=13)).agents) == 13
    assert "at most 3 allowed" in validate_error(many, limits=SpecLimits(max_agents=3))
    assert "at most 10 allowed" in validate_error(spec_data(agent("a1", duty="x" * 11)),
                                                  limits=SpecLimits(max_duty_chars=10))


def test_revalidates_objects_and_direct_construction_checks_graph() -> None:
    spec = parse_spec(SPEC_YAML).spec
    edited = spec.model_copy(update={"agents": [spec.agents[0].model_copy(update={"capacity": "xl"}),
                                                spec.agents[1]]})
    assert "agent 'a1' field 'capacity': unknown level 'xl'" in validate_error(edited, levels=LEVELS)
    assert validate_spec(spec, levels=LEVELS) == spec
    with pytest.raises(ValueError, match="declared later"):
        OrchestrationSpec(agents=[AgentSpec(**agent("a1", ["a2"])), AgentSpec(**agent("a2"))], output="a2")


@pytest.mark.parametrize(("text", "expected"), [
    ("", "no spec found"),
    ("The answer is 42.", "spec must be a mapping with fields 'agents' and 'output'; got text"),
    ("```yaml\n- a1\n- a2\n```", "got a list"),
    ("agents: []\noutput: a1", "spec has no agents"),
    ("```yaml\nagents:\n  - id: a1\n   role: x\n```", "spec is not valid YAML at line"),
    (SPEC_YAML.replace("    duty: Carry", "    role: Again\n    duty: Carry"),
     "agent 'a2' field 'role': given twice"),
    (SPEC_YAML.replace("output: a2", ""), "field 'output': missing"),
    (SPEC_YAML.replace("depends_on: [a1]", "depends_on: a1"),
     "agent 'a2' field 'depends_on': expected a list"),
    (SPEC_YAML.replace("role: Calculator", "role: [a, b]"),
     "agent 'a2' field 'role': expected text; got a list"),
    ("x" * 20001, "at most 20000 allowed"),
])
def test_parse_errors(text: str, expected: str) -> None:
    assert expected in parse_error(text)


def test_billion_laughs_rejected_quickly() -> None:
    bomb = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    bomb += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    bomb += ["agents: *a9", "output: a1"]
    started = time.perf_counter()
    message = parse_error("```yaml\n" + "\n".join(bomb) + "\n```")
    assert time.perf_counter() - started < 1.0
    assert "alias '*a0' at line 3" in message


def test_node_and_depth_budgets() -> None:
    wide = SPEC_YAML.replace("depends_on: [a1]", "depends_on: [" + ",".join(["a1"] * 6000) + "]")
    assert "more than 5000 nodes" in parse_error(wide)
    deep = "agents: " + "[" * 50 + "]" * 50 + "\noutput: a1"
    assert "nested deeper than 10 levels" in parse_error(deep)


def test_no_code_execution_from_tags() -> None:
    text = SPEC_YAML.replace("role: Calculator", "role: !!python/object/apply:os.system ['echo pwned']")
    assert "expected text" in parse_error(text)  # the tagged node is never constructed


# --- property: render -> parse round-trips with exact spans -------------------------------------------
# Visible text only: control, format (zero-width) and separator characters are refused in role and duty.
_TEXT_CHARS = st.characters(blacklist_categories=("Cs", "Cc", "Cf", "Zl", "Zp"))
_LINE = st.text(_TEXT_CHARS, min_size=1, max_size=30).filter(lambda s: s.strip() != "")
_IDS = st.from_regex(ID_RE, fullmatch=True).filter(lambda s: len(s) <= 40)


def verbatim_in_double_quotes(ch: str) -> bool:
    """Characters PyYAML writes unescaped between double quotes."""
    return ("\x20" <= ch <= "\x7e" and ch not in '"\\') or ("\xa0" <= ch <= "\ufffd" and ch != "\ufeff")


@st.composite
def specs(draw) -> OrchestrationSpec:
    ids = draw(st.lists(_IDS, min_size=1, max_size=6, unique=True))
    deps = [draw(st.lists(st.sampled_from(ids[:i]), unique=True)) if i else [] for i in range(len(ids))]
    read = {d for ds in deps for d in ds}
    deps[-1] += [i for i in ids[:-1] if i not in read]  # every agent feeds the output (the last one)
    agents = []
    for i, agent_id in enumerate(ids):
        lines = draw(st.lists(_LINE, min_size=1, max_size=3))
        duty = "\n".join(lines) + draw(st.sampled_from(["", "\n"]))
        agents.append(AgentSpec(
            id=agent_id, role=draw(_LINE), base_role=draw(st.sampled_from(sorted(BASE_ROLES))), duty=duty,
            capacity=draw(st.sampled_from(LEVELS)), depends_on=deps[i],
        ))
    return OrchestrationSpec(agents=agents, output=ids[-1])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_render_parse_round_trip_with_exact_spans(spec: OrchestrationSpec) -> None:
    text = render_spec(spec)
    parsed = parse_spec(text, pool=LEVELS)
    assert parsed.spec == spec
    assert_spans_exact(parsed)
    for a in spec.agents:  # values needing no escapes appear verbatim
        for field in ("id", "role", "base_role", "capacity"):
            value = getattr(a, field)
            if value.isprintable() and ("'" not in value or all(verbatim_in_double_quotes(c) for c in value)):
                assert parsed.span_text(a.id, field) == value
    wrapped = parse_spec(f"Plan below.\n```yaml\n{text}```\n", pool=LEVELS)
    assert wrapped.spec == spec
    assert_spans_exact(wrapped)


def test_indentless_list_between_prose_lines() -> None:
    text = ("I'll use one agent.\nagents:\n- id: a1\n  role: Solver\n  base_role: solver\n  duty: Solve.\n"
            "  capacity: small\n  depends_on: [ ]\noutput: a1\nDone!")
    parsed = parse_spec(text)
    assert parsed.spec.agents[0].depends_on == []
    assert parsed.span_text("a1", "depends_on") == "[ ]"
    block = text[slice(*parsed.block)]
    assert block.startswith("agents:") and block.endswith("output: a1\n")  # "Done!" left out
    assert_spans_exact(parsed)


def test_control_characters_are_a_spec_error_not_a_reader_crash() -> None:
    """A small model's raw output can hold control characters; PyYAML's reader rejects them in its
    constructor, which must still surface as a SpecError."""
    with pytest.raises(SpecError, match="not valid YAML"):
        parse_spec("agents:\n  - id: a1\x07\n    role: r\noutput: a1\n")
