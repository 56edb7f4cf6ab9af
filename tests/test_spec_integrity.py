"""Issue #11 spec fixes: spans of tagged/anchored values, specs whose agents' work is thrown away,
invisible characters in role/duty, and a byte order mark in front of the spec."""

from __future__ import annotations

import json

import pytest
from test_spec import SPEC_YAML, agent, assert_spans_exact, spec_data

from lemon_core import baselines
from lemon_core.counterfactual import EditFamily, counterfactual_edits
from lemon_core.pool import load_pool
from lemon_core.spec import OrchestrationSpec, SpecError, render_spec, validate_spec
from lemon_core.spec_text import parse_spec

LEVELS = ["small", "medium", "large"]


def error_of(call, *args, **kwargs) -> str:
    with pytest.raises(SpecError) as err:
        call(*args, **kwargs)
    return str(err.value)


# ----------------------------------------------------------------------------- tags and anchors


@pytest.mark.parametrize(("written", "expected"), [
    ('!!str "Calculator"', "Calculator"),
    ("!!str 'Calculator'", "Calculator"),
    ('&x "Calculator"', "Calculator"),
    ("&x Calculator", "Calculator"),
    ("&x !!str Calculator", "Calculator"),
    ("!!str &x Calculator", "Calculator"),
    ("!<tag:yaml.org,2002:str> Calculator", "Calculator"),
    ("!!str # a comment\n      Calculator", "Calculator"),
    ("!!str\n      Calculator", "Calculator"),
])
def test_tags_and_anchors_are_not_part_of_a_value_span(written: str, expected: str) -> None:
    parsed = parse_spec(SPEC_YAML.replace("role: Calculator", f"role: {written}"))
    assert parsed.spec.agent("a2").role == expected
    assert parsed.span_text("a2", "role") == expected


def test_tagged_block_scalar_and_lists_have_exact_spans() -> None:
    text = (SPEC_YAML.replace("duty: Carry out the steps and give the final number.",
                              "duty: !!str |\n      Carry out the steps.\n      Give the number.")
            .replace("depends_on: [a1]", "depends_on: !!seq [&first a1]"))
    parsed = parse_spec(text)
    assert parsed.span_text("a2", "duty") == "Carry out the steps.\n      Give the number."
    assert parsed.span_text("a2", "depends_on") == "[&first a1]"
    assert parsed.span_text("a2", "depends_on[0]") == "a1"
    assert parsed.span_text("", "output") == "a2"
    block = SPEC_YAML.replace("output: a2", "output: &o a2").replace("capacity: large", "capacity: !!str large")
    parsed = parse_spec(block)
    assert (parsed.span_text("", "output"), parsed.span_text("a2", "capacity")) == ("a2", "large")
    assert_spans_exact(parsed)


# ------------------------------------------------------------------- every agent feeds the output


def test_output_read_by_another_agent_is_refused() -> None:
    message = error_of(validate_spec, spec_data(agent("a1"), agent("a2", ["a1"]), output="a1"))
    assert message.startswith("field 'output': agent 'a1' is read by ['a2']")
    assert "`output: a2`" in message


def test_agent_whose_work_is_thrown_away_is_refused() -> None:
    message = error_of(validate_spec, spec_data(agent("a1"), agent("lost"), agent("a3", ["a1"])))
    assert message.startswith("agent 'lost': no agent depends on it and it is not the output")
    assert "add 'lost' to the depends_on of an agent declared after it (e.g. the output 'a3')" in message
    text = SPEC_YAML.replace("output: a2", "") + (
        "  - id: extra\n    role: Extra\n    base_role: critic\n    duty: Criticise.\n    capacity: small\n"
        "output: a2\n")
    message = error_of(parse_spec, text)
    assert "agent 'extra': no agent depends on it" in message
    assert "e.g. the output" not in message  # the output is declared before it: it cannot read it


@pytest.mark.parametrize("method", sorted(baselines.BASELINES))
def test_every_baseline_still_validates(method: str) -> None:
    spec = baselines.baseline_spec(method, "large", cheapest="small")
    assert parse_spec(render_spec(spec), pool=LEVELS).spec == spec


def test_counterfactual_drop_dependency_may_leave_an_agent_unread() -> None:
    """The rule is for written specs; an edited spec only needs to be executable, so the paper's
    drop-a-dependency edit of a two-agent chain still exists (its Δ asks whether a1 mattered)."""
    pool = load_pool("simulated")
    edits = counterfactual_edits(parse_spec(SPEC_YAML, pool=pool), pool)
    drops = [e for e in edits if e.family == EditFamily.drop_dependency]
    assert len(drops) == 1 and drops[0].spec.agent("a2").depends_on == []
    assert isinstance(drops[0].spec, OrchestrationSpec)
    with pytest.raises(SpecError, match="agent 'a1': no agent depends on it"):
        validate_spec(drops[0].spec)


# -------------------------------------------------------------------------- invisible characters


@pytest.mark.parametrize(("field", "value", "code"), [
    ("role", "Plan\u200bner", "U+200B (ZERO WIDTH SPACE)"),
    ("role", "Planner\u200d", "U+200D (ZERO WIDTH JOINER)"),
    ("role", "Plan\tner", "U+0009"),
    ("role", "\u202eRenalp", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ("duty", "Solve\x1b[2J it.", "U+001B"),
    ("duty", "Solve\u2060 it.", "U+2060 (WORD JOINER)"),
    ("duty", "Solve\ufeff it.", "U+FEFF (ZERO WIDTH NO-BREAK SPACE)"),
    ("duty", "Solve\r it.", "U+000D"),
    ("duty", "Solve\u2028it.", "U+2028 (LINE SEPARATOR)"),
    ("capacity", "sm\x00all", "U+0000"),
])
def test_invisible_and_control_characters_are_refused(field: str, value: str, code: str) -> None:
    message = error_of(validate_spec, spec_data(agent("a1", **{field: value})))
    assert message.startswith(f"agent 'a1' field '{field}': character")
    assert code in message and "write plain visible text" in message


def test_invisible_characters_are_refused_when_escaped_in_json_too() -> None:
    data = spec_data(agent("a1", role="Plan\u200bner"))
    text = json.dumps(data)  # ensure_ascii: the character arrives as the escape \u200b
    assert "\\u200b" in text
    assert "U+200B" in error_of(parse_spec, text)


def test_line_breaks_and_tabs_stay_allowed_in_a_duty() -> None:
    spec = validate_spec(spec_data(agent("a1", duty="Step 1:\tadd.\nStep 2:\tcheck.")))
    assert spec.agents[0].duty == "Step 1:\tadd.\nStep 2:\tcheck."
    assert validate_spec(spec_data(agent("a1", role="Planer für Brüche 🍋"))).agents[0].role == "Planer für Brüche 🍋"


# ------------------------------------------------------------------------------- byte order mark


@pytest.mark.parametrize("prefix", ["\ufeff", "\ufeff\n", " \ufeff", "\ufeff\ufeff  \n"])
def test_byte_order_mark_before_yaml(prefix: str) -> None:
    parsed = parse_spec(prefix + SPEC_YAML)
    assert [a.id for a in parsed.spec.agents] == ["a1", "a2"]
    assert parsed.span_text("a1", "role") == "Arithmetic planner"
    assert parsed.block[0] == len(prefix)
    assert_spans_exact(parsed)


def test_byte_order_mark_before_json_and_inside_tags() -> None:
    data = spec_data(agent("a1"), agent("a2", ["a1"]))
    parsed = parse_spec("\ufeff" + json.dumps(data))
    assert parsed.spec.output == "a2" and parsed.span_text("a2", "depends_on[0]") == "a1"
    parsed = parse_spec("<spec>\ufeff" + SPEC_YAML + "</spec>")
    assert parsed.span_text("a2", "role") == "Calculator"
