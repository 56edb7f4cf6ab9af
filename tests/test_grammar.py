"""Grammar-constrained decoding: a random-weight model writes only specs under the grammar, garbage without.

The tiny models (tests/tiny_models.py) have random weights, so unconstrained they write gibberish: that
is what makes "100% of constrained samples parse" a test that can fail. Samples from the grammar may
still break reference rules (random ids), which a context-free grammar cannot express; those are
counted apart and each is checked to be ONLY a reference problem by repairing the references and
parsing again.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessorList

from lemon_core.baselines import BASELINES, baseline_spec
from lemon_core.grammar import (
    SpecLogitsProcessor,
    grammar_accepts,
    is_reference_error,
    limits_for_budget,
    max_completion_bytes,
    spec_grammar,
    spec_logits_processor,
)
from lemon_core.policy import OrchestratorPolicy, pack, spec_completion
from lemon_core.pool import load_pool
from lemon_core.roles import BASE_ROLES
from lemon_core.spec import AgentSpec, OrchestrationSpec, SpecError, SpecLimits
from lemon_core.spec_text import parse_spec

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import build_tiny_chat_model  # noqa: E402

LEVELS = ["small", "medium", "large"]
BUDGET = 700  # max_new_tokens of the sampling tests
QUESTIONS = ["What is 12 + 30?", "Janet has 3 apples and buys 5 more. How many now?",
             "Write add(a, b).", "Is 7 prime?"]


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> OrchestratorPolicy:
    torch.set_num_threads(1)
    path = build_tiny_chat_model(tmp_path_factory.mktemp("tiny"), seed=0)
    return OrchestratorPolicy.load(str(path), include_roles=False, include_format=False)


def _sample(policy: OrchestratorPolicy, spec_format: str, *, constrained: bool, do_sample: bool,
            limits: SpecLimits | None = None, seed: int = 0, rows: int = 16,
            max_new_tokens: int = BUDGET, sequential_ids: bool = False) -> list[tuple[str, bool]]:
    """(text, finished) per row of ONE left-padded generate call over prompts of different lengths."""
    pool = load_pool("simulated")
    prompts = [policy.prompt_ids(QUESTIONS[i % len(QUESTIONS)], pool) for i in range(rows)]
    assert len({len(p) for p in prompts}) > 1  # the batch really is left-padded
    ids, mask, width = pack(prompts, [[] for _ in prompts], policy.pad_id)
    processors = LogitsProcessorList()
    if constrained:
        processors.append(spec_logits_processor(policy.tokenizer, LEVELS, spec_format, rows, limits=limits,
                                                eos_ids=policy.eos_ids, sequential_ids=sequential_ids))
    sampling = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0) if do_sample else dict(do_sample=False)
    torch.manual_seed(seed)
    out = policy.model.generate(input_ids=ids[:, :width], attention_mask=mask[:, :width], max_new_tokens=max_new_tokens,
                                pad_token_id=policy.pad_id, eos_token_id=policy.eos_ids,
                                logits_processor=processors, **sampling)
    results = []
    for row in out[:, width:].tolist():
        cut = next((t for t, tok in enumerate(row) if tok in policy.eos_ids), None)
        results.append((policy.tokenizer.decode(row if cut is None else row[:cut]), cut is not None))
    return results


def _outcome(text: str) -> str:
    try:
        parse_spec(text, LEVELS)
    except SpecError as error:
        return "reference" if is_reference_error(error) else "invalid"
    return "valid"


def _repair_references(text: str, spec_format: str) -> str:
    """The same spec with ids a0.., each agent reading the one before and the last agent as output: every
    reference and graph rule holds."""
    if spec_format == "json":
        data = json.loads(text)
        for i, agent in enumerate(data["agents"]):
            agent["id"], agent["depends_on"] = f"a{i}", ([f"a{i - 1}"] if i else [])
        data["output"] = f"a{len(data['agents']) - 1}"
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    ids, deps = iter(range(100)), iter(range(100))
    text = re.sub(r"(?m)^  - id: .*$", lambda _: f"  - id: a{next(ids)}", text)
    text = re.sub(r"(?m)^    depends_on: .*$", lambda _: (lambda i: f"    depends_on: [a{i - 1}]" if i else
                                                            "    depends_on: []")(next(deps)), text)
    last = len(re.findall(r"(?m)^  - id: ", text)) - 1
    return re.sub(r"(?m)^output: .*$", f"output: a{last}", text)


@pytest.mark.parametrize(("spec_format", "do_sample"), [("yaml", True), ("json", True), ("yaml", False)])
def test_constrained_samples_are_all_specs_up_to_references(policy: OrchestratorPolicy, spec_format: str,
                                                            do_sample: bool) -> None:
    limits = limits_for_budget(BUDGET, LEVELS, spec_format, max_agents=2)
    samples = _sample(policy, spec_format, constrained=True, do_sample=do_sample, limits=limits)
    assert all(finished for _, finished in samples), "a grammar-bounded spec must fit the token budget"
    outcomes = [_outcome(text) for text, _ in samples]
    assert outcomes.count("invalid") == 0, [t for (t, _), o in zip(samples, outcomes, strict=True) if o == "invalid"]
    for (text, _), outcome in zip(samples, outcomes, strict=True):
        if outcome == "reference":  # classified right: fixing the references alone makes it valid
            assert _outcome(_repair_references(text, spec_format)) == "valid", text
        parsed = parse_spec(_repair_references(text, spec_format), LEVELS).spec
        assert len(parsed.agents) <= limits.max_agents
        assert all(a.capacity in LEVELS and a.base_role in BASE_ROLES for a in parsed.agents)
        assert all(len(a.role) <= limits.max_role_chars and len(a.duty) <= limits.max_duty_chars
                   for a in parsed.agents)
    if spec_format == "yaml":
        assert all(text.startswith("```yaml\nagents:\n") and text.endswith("```") for text, _ in samples)


@pytest.mark.parametrize("spec_format", ["yaml", "json"])
def test_sequential_ids_make_every_sample_a_valid_spec(policy: OrchestratorPolicy, spec_format: str) -> None:
    limits = limits_for_budget(BUDGET, LEVELS, spec_format, max_agents=3)
    samples = _sample(policy, spec_format, constrained=True, do_sample=True, limits=limits, sequential_ids=True)
    assert all(finished for _, finished in samples)
    outcomes = [_outcome(text) for text, _ in samples]
    assert "invalid" not in outcomes  # ids, references and the output are right by construction ...
    specs = [parse_spec(text, LEVELS).spec for (text, _), o in zip(samples, outcomes, strict=True) if o == "valid"]
    assert len(specs) >= len(samples) // 2  # ... only an agent nobody reads (a graph rule) can remain
    assert all([a.id for a in spec.agents] == [f"a{i + 1}" for i in range(len(spec.agents))] for spec in specs)
    assert any(agent.depends_on for spec in specs for agent in spec.agents)  # the DAG part is exercised


@pytest.mark.parametrize("spec_format", ["yaml", "json"])
def test_sequential_ids_admit_canonical_specs_and_refuse_other_ids(policy: OrchestratorPolicy,
                                                                   spec_format: str) -> None:
    grammar = spec_grammar(LEVELS, spec_format, sequential_ids=True)
    solve = dict(base_role="solver", duty="Solve: step by step.\nThen answer.", capacity="small")
    spec = OrchestrationSpec(agents=[AgentSpec(id="a1", role="Planner", **solve),
                                     AgentSpec(id="a2", role="Solver", depends_on=["a1"], **solve),
                                     AgentSpec(id="a3", role="Judge", depends_on=["a1", "a2"], **solve)], output="a3")
    assert grammar_accepts(policy.tokenizer, grammar, spec_completion(spec, spec_format))
    # the output is the last agent: one that another agent reads (work thrown away) is not in the language
    assert not grammar_accepts(policy.tokenizer, grammar, spec_completion(spec.model_copy(update={"output": "a2"}),
                                                                         spec_format))
    renamed = spec.model_copy(update={"agents": [*spec.agents[:2], spec.agents[2].model_copy(update={"id": "judge"})]})
    reordered = spec.model_copy(update={"agents": [*spec.agents[:2], spec.agents[2].model_copy(
        update={"depends_on": ["a2", "a1"]})]})
    for other in (renamed, reordered):
        assert not grammar_accepts(policy.tokenizer, grammar, spec_completion(other, spec_format))


def test_unconstrained_random_model_writes_almost_no_specs(policy: OrchestratorPolicy) -> None:
    samples = _sample(policy, "yaml", constrained=False, do_sample=True, max_new_tokens=200)
    outcomes = [_outcome(text) for text, _ in samples]
    assert outcomes.count("invalid") >= 15  # ~0% without the grammar: the sampling test above can fail


@pytest.mark.parametrize("spec_format", ["yaml", "json"])
def test_random_walks_through_the_grammar_all_parse_up_to_references(policy: OrchestratorPolicy,
                                                                     spec_format: str) -> None:
    """No model: random scores, boosted on YAML's special characters, drive the processor through the
    grammar's rarer corners (quoted and block scalars, escapes); every completed walk must parse."""
    tokenizer, rows = policy.tokenizer, 48
    pieces = [tokenizer.decode([t]) for t in range(len(tokenizer))]
    boost = torch.tensor([5.0 if p in ("|", "'", '"', "\\") else 3.0 * (len(p) <= 2 and any(c in p for c in "-+ #:?\n"))
                          for p in pieces])
    proc = spec_logits_processor(tokenizer, LEVELS, spec_format, rows,
                                 limits=SpecLimits(max_agents=2, max_id_chars=3, max_role_chars=6, max_duty_chars=10))
    generator = torch.Generator().manual_seed(0)
    ids = torch.zeros((rows, 1), dtype=torch.long)
    ended = torch.zeros(rows, dtype=torch.bool)
    while not ended.all() and ids.shape[1] < 400:
        scores = proc(ids, torch.randn(rows, len(tokenizer), generator=generator) + boost)
        token = torch.multinomial(torch.softmax(scores, -1), 1, generator=generator).squeeze(1)
        token[ended] = tokenizer.pad_token_id
        ended |= token == tokenizer.eos_token_id
        ids = torch.cat([ids, token[:, None]], dim=1)
    assert ended.all()
    texts = [tokenizer.decode(row[1 : row.index(tokenizer.eos_token_id)]) for row in ids.tolist()]
    assert [_outcome(text) for text in texts].count("invalid") == 0
    if spec_format == "yaml":  # the walk did leave plain scalars
        assert sum(": '" in text or ': "' in text or ": |" in text for text in texts) >= 3


@pytest.mark.parametrize(("written", "value"), [
    ("|+\n      a\n\n        b\n\n    ", "a\n\n  b\n\n"),
    ("|-\n      x: y #z\n      - w\n    ", "x: y #z\n- w"),
    ("|\n      one\n    ", "one\n"),
    ('"😀A\\_\\t\\"q\\" é"\n    ', "😀A\xa0\t\"q\" é"),
    ('"\\U0001F600\\_\\u00e9\\xe9"\n    ', "😀\xa0éé"),
    ("'it''s: ok # no'\n    ", "it's: ok # no"),
    ("?x -y:z a#b [c]\n    ", "?x -y:z a#b [c]"),
])
def test_yaml_grammar_reads_every_scalar_style_as_parse_spec_does(policy: OrchestratorPolicy, written: str,
                                                                  value: str) -> None:
    text = spec_completion(_one_agent(duty="DUTY")).replace("DUTY\n    ", written)
    assert grammar_accepts(policy.tokenizer, spec_grammar(LEVELS, "yaml"), text), text
    assert parse_spec(text, LEVELS).spec.agents[0].duty == value


@pytest.mark.parametrize("written", [
    "|\n     five spaces\n    ",  # under-indented block
    "|\n      \n      a\n    ",  # leading blank line
    '"\\q"\n    ',  # unknown escape
    '"\\U00110000"\n    ',  # beyond Unicode: PyYAML's chr() raises
    '"\\ud800"\n    ',  # a lone surrogate no tokenizer can encode
    "'   '\n    ",  # blank
    "x\ty\n    ",  # a raw tab
    "|-\n      " + "x" * 2001 + "\n    ",  # over max_duty_chars in a block
])
def test_yaml_grammar_refuses_scalars_parse_spec_would_not_take(policy: OrchestratorPolicy, written: str) -> None:
    text = spec_completion(_one_agent(duty="DUTY")).replace("DUTY\n    ", written)
    assert not grammar_accepts(policy.tokenizer, spec_grammar(LEVELS, "yaml"), text), text


def test_sampled_rows_differ_and_are_seeded(policy: OrchestratorPolicy) -> None:
    first = _sample(policy, "json", constrained=True, do_sample=True, rows=4, seed=3,
                    limits=SpecLimits(max_agents=2, max_role_chars=8, max_duty_chars=12))
    again = _sample(policy, "json", constrained=True, do_sample=True, rows=4, seed=3,
                    limits=SpecLimits(max_agents=2, max_role_chars=8, max_duty_chars=12))
    assert first == again
    assert len({text for text, _ in first}) == 4  # each row has its own matcher state and its own draws


@pytest.mark.parametrize("spec_format", ["yaml", "json"])
def test_grammar_accepts_every_baseline_spec(policy: OrchestratorPolicy, spec_format: str) -> None:
    grammar = spec_grammar(LEVELS, spec_format)
    for method in BASELINES:
        for capacity in LEVELS:
            spec = baseline_spec(method, capacity, cheapest="small")
            assert grammar_accepts(policy.tokenizer, grammar, spec_completion(spec, spec_format)), (method, capacity)


def _one_agent(**fields: str) -> OrchestrationSpec:
    agent = dict(id="a1", role="Solver", base_role="solver", duty="Solve it.", capacity="small") | fields
    return OrchestrationSpec(agents=[AgentSpec(**agent)], output=agent["id"])


@pytest.mark.parametrize("spec_format", ["yaml", "json"])
@pytest.mark.parametrize(("field", "value"), [("capacity", "huge"), ("base_role", "wizard"),
                                              ("role", "   "), ("role", "x" * 201), ("duty", "\n\n")])
def test_grammar_rejects_what_parse_spec_rejects(policy: OrchestratorPolicy, spec_format: str, field: str,
                                                 value: str) -> None:
    grammar = spec_grammar(LEVELS, spec_format)
    good = _one_agent()
    bad = good.model_copy(update={"agents": [good.agents[0].model_copy(update={field: value})]})
    text = spec_completion(bad, spec_format)
    with pytest.raises(SpecError):
        parse_spec(text, LEVELS)
    assert grammar_accepts(policy.tokenizer, grammar, spec_completion(good, spec_format))
    assert not grammar_accepts(policy.tokenizer, grammar, text)


def test_yaml_grammar_rejects_broken_yaml_and_plain_null(policy: OrchestratorPolicy) -> None:
    grammar = spec_grammar(LEVELS, "yaml")
    good = spec_completion(_one_agent())
    broken = {
        "null id": good.replace("id: a1", "id: null").replace("output: a1", "output: null"),
        "': ' in a plain scalar": good.replace("role: Solver", "role: Solver: fast"),
        "' #' comment": good.replace("role: Solver", "role: Solver #1"),
        "no fence": good.removeprefix("```yaml\n"),
        "text after the fence": good + " ok",
    }
    for name, text in broken.items():
        assert not grammar_accepts(policy.tokenizer, grammar, text), name
    assert grammar_accepts(policy.tokenizer, grammar, good.replace("id: a1", "id: 'null'").replace(
        "output: a1", "output: 'null'"))


# texts of every kind render_spec meets: YAML indicators, quotes, escapes, blank lines, unicode, emoji
# visible text only (spec.py refuses control and invisible characters; a duty may hold \n and \t)
_TEXT = st.text(st.sampled_from(list("aZ09 :#-?'\"\\|>,[]{}&*!%@`\n\t\xa0\u3000é😀")), max_size=30)
_JSON_TEXT = _TEXT
_ID = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,6}", fullmatch=True)


@st.composite
def _specs(draw: st.DrawFn, text: st.SearchStrategy[str]) -> OrchestrationSpec:
    ids = draw(st.lists(_ID, min_size=1, max_size=3, unique=True))
    agents = []
    for i, agent_id in enumerate(ids):
        role = draw(text.filter(lambda t: t.strip() and "\n" not in t and "\t" not in t))
        duty = draw(text.filter(str.strip))
        deps = draw(st.lists(st.sampled_from(ids[:i]), unique=True)) if i else []
        agents.append(AgentSpec(id=agent_id, role=role, base_role=draw(st.sampled_from(list(BASE_ROLES))),
                                duty=duty, capacity=draw(st.sampled_from(LEVELS)), depends_on=deps))
    read = {d for a in agents for d in a.depends_on}  # every agent feeds the output, which is the last one
    last = agents[-1]
    unread = [a.id for a in agents[:-1] if a.id not in read and a.id not in last.depends_on]
    agents[-1] = last.model_copy(update={"depends_on": [*last.depends_on, *unread]})
    return OrchestrationSpec(agents=agents, output=ids[-1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=_specs(_TEXT))
def test_yaml_grammar_accepts_render_spec_of_any_valid_spec(policy: OrchestratorPolicy,
                                                             spec: OrchestrationSpec) -> None:
    text = spec_completion(spec, "yaml")
    assert parse_spec(text, LEVELS).spec == spec
    assert grammar_accepts(policy.tokenizer, spec_grammar(LEVELS, "yaml"), text), text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=_specs(_JSON_TEXT))
def test_json_grammar_accepts_render_spec_json_of_any_valid_spec(policy: OrchestratorPolicy,
                                                                  spec: OrchestrationSpec) -> None:
    text = spec_completion(spec, "json")
    assert parse_spec(text, LEVELS).spec == spec
    assert grammar_accepts(policy.tokenizer, spec_grammar(LEVELS, "json"), text), text


@pytest.mark.parametrize(("spec_format", "sequential_ids"), [("yaml", False), ("json", False), ("json", True)])
def test_structured_outputs_body_constrains_like_vllms_guidance_backend(policy: OrchestratorPolicy, spec_format: str,
                                                                        sequential_ids: bool) -> None:
    """What vLLM 0.32's guidance backend does with the body (backend_guidance.serialize_guidance_grammar):
    a grammar goes through llguidance.grammar_from("grammar", ...), a schema through grammar_from_json_schema
    with its default flexible whitespace, which the schema's x-guidance entry must override."""
    import llguidance
    from llguidance.hf import from_tokenizer

    grammar = spec_grammar(LEVELS, spec_format, sequential_ids=sequential_ids)
    assert hash(grammar) == hash(spec_grammar(list(LEVELS), spec_format, sequential_ids=sequential_ids))
    body = grammar.structured_outputs
    if "json" in body:
        serialized = llguidance.LLMatcher.grammar_from_json_schema(body["json"], defaults={"whitespace_flexible": True})
    else:
        serialized = llguidance.grammar_from("grammar", body["grammar"])
    ll = from_tokenizer(policy.tokenizer)

    def accepts(text: str) -> bool:
        matcher = llguidance.LLMatcher(ll, serialized, log_level=0)
        return not matcher.is_error() and matcher.consume_tokens(ll.tokenize_str(text)) and matcher.is_accepting()

    spec = baseline_spec("chain", "medium")
    spec = spec.model_copy(update={"agents": [a.model_copy(update={"id": f"a{i + 1}", "depends_on": [
        f"a{i}"] if i else []}) for i, a in enumerate(spec.agents)], "output": f"a{len(spec.agents)}"})
    text = spec_completion(spec, spec_format)
    assert accepts(text)
    assert not accepts(text.replace("medium", "huge"))
    if spec_format == "json":
        assert not accepts(text.replace(",", ", "))  # compact separators hold per request


def test_processor_forbids_end_of_turn_until_the_spec_is_complete_then_allows_only_it(
        policy: OrchestratorPolicy) -> None:
    tokenizer = policy.tokenizer
    eos = [tokenizer.eos_token_id, tokenizer.pad_token_id]  # two end-of-turn ids, as Qwen chat models have
    proc = spec_logits_processor(tokenizer, LEVELS, "yaml", 1, eos_ids=eos)
    completion = tokenizer(spec_completion(_one_agent()), add_special_tokens=False)["input_ids"]
    vocab = len(tokenizer)
    ids = torch.tensor([[tokenizer.eos_token_id, 5, 6]])  # a prompt (its content is irrelevant)
    for token in completion:
        scores = proc(ids, torch.zeros(1, vocab))
        assert torch.isinf(scores[0, eos]).all()  # cannot stop mid-spec
        assert scores[0, token] == 0  # the spec's own next token is allowed
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    scores = proc(ids, torch.zeros(1, vocab))
    assert torch.isfinite(scores[0]).nonzero().flatten().tolist() == sorted(eos)


def test_processor_takes_one_grammar_per_row(policy: OrchestratorPolicy) -> None:
    """Rows of one batch under different grammars (here: different pools) each keep to their own."""
    tokenizer, rows = policy.tokenizer, 4
    limits = SpecLimits(max_agents=2, max_id_chars=3, max_role_chars=6, max_duty_chars=10)
    grammars = [spec_grammar(["small"] if row % 2 else ["large"], "yaml", limits) for row in range(rows)]
    proc = SpecLogitsProcessor(tokenizer, grammars, rows, eos_ids=[tokenizer.eos_token_id])
    generator = torch.Generator().manual_seed(1)
    ids = torch.zeros((rows, 1), dtype=torch.long)
    ended = torch.zeros(rows, dtype=torch.bool)
    while not ended.all() and ids.shape[1] < 400:
        scores = proc(ids, torch.randn(rows, len(tokenizer), generator=generator))
        token = torch.multinomial(torch.softmax(scores, -1), 1, generator=generator).squeeze(1)
        token[ended] = tokenizer.pad_token_id
        ended |= token == tokenizer.eos_token_id
        ids = torch.cat([ids, token[:, None]], dim=1)
    for row in range(rows):
        text = tokenizer.decode(ids[row, 1:].tolist()).split(tokenizer.eos_token)[0]
        capacities = re.findall(r"(?m)^    capacity: (\w+)$", text)
        assert capacities and set(capacities) == {"small" if row % 2 else "large"}, text
    with pytest.raises(ValueError, match="3 grammars for batch_size=4"):
        SpecLogitsProcessor(tokenizer, grammars[:3], rows)


def test_processor_is_one_per_generate_call(policy: OrchestratorPolicy) -> None:
    proc = spec_logits_processor(policy.tokenizer, LEVELS, "json", 2)
    ids = torch.zeros((2, 4), dtype=torch.long)
    proc(ids, torch.zeros(2, len(policy.tokenizer)))
    with pytest.raises(ValueError, match="batch_size=2"):
        proc(torch.zeros((3, 5), dtype=torch.long), torch.zeros(3, len(policy.tokenizer)))
    with pytest.raises(ValueError, match="one processor per generate call"):
        proc(ids, torch.zeros(2, len(policy.tokenizer)))  # same length again: a second generate call


def test_processor_refuses_a_slow_tokenizer_and_bad_format(policy: OrchestratorPolicy) -> None:
    with pytest.raises(ValueError, match="spec_format='toml'"):
        spec_grammar(LEVELS, "toml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="levels"):
        spec_grammar([], "yaml")
    with pytest.raises(ValueError, match="fast"):
        spec_logits_processor(object(), LEVELS, "yaml", 1, eos_ids=[0])


@pytest.mark.parametrize(("mutate", "reference"), [
    (lambda t: t.replace("id: vote", "id: s1"), True),  # duplicate id
    (lambda t: t.replace("depends_on: [s1, s2, s3]", "depends_on: [s1, s9]"), True),  # unknown agent
    (lambda t: t.replace("depends_on: [s1, s2, s3]", "depends_on: [s1, s1]"), True),  # listed twice
    (lambda t: t.replace("depends_on: [s1, s2, s3]", "depends_on: [vote]"), True),  # itself
    (lambda t: t.replace("depends_on: []", "depends_on: [vote]", 1), True),  # later agent (a cycle)
    (lambda t: t.replace("depends_on: []", "depends_on: [s2]", 1), True),  # later agent, no cycle
    (lambda t: t.replace("output: vote", "output: judge"), True),  # unknown output
    (lambda t: t.replace("capacity: small", "capacity: huge"), False),
    (lambda t: t.replace("base_role: solver", "base_role: wizard"), False),
    (lambda t: t.replace("agents:", "agents: ["), False),
])
def test_is_reference_error_tells_graph_errors_from_the_rest(mutate, reference: bool) -> None:  # type: ignore[no-untyped-def]
    text = mutate(spec_completion(baseline_spec("sc", "large", cheapest="small")))
    with pytest.raises(SpecError) as error:
        parse_spec(text, LEVELS)
    assert is_reference_error(error.value) is reference, str(error.value)


@pytest.mark.parametrize("spec_format", ["yaml", "json"])
def test_max_completion_bytes_bounds_the_worst_spec(spec_format: str) -> None:
    limits = SpecLimits(max_agents=3, max_id_chars=6, max_role_chars=5, max_duty_chars=9)
    # the costliest visible text: emoji, which YAML writes as 10-byte \U escapes in double quotes (a tab in
    # the duty forces them) and JSON as 4 UTF-8 bytes or a 12-byte escaped pair; ids need quotes; everyone
    # depends on everyone
    ids = ["111111", "222222", "333333"]
    duty = ("\t" + "😀" * 8) if spec_format == "yaml" else "😀" * 9
    agents = [AgentSpec(id=i, role="😀" * 5, base_role="aggregator", duty=duty, capacity="medium",
                        depends_on=ids[:k]) for k, i in enumerate(ids)]
    worst = spec_completion(OrchestrationSpec(agents=agents, output=ids[-1]), spec_format)
    assert len(worst.encode()) <= max_completion_bytes(limits, LEVELS, spec_format)


@pytest.mark.parametrize("spec_format", ["yaml", "json"])
def test_limits_for_budget_fit_the_budget_or_say_what_would(spec_format: str) -> None:
    limits = limits_for_budget(BUDGET, LEVELS, spec_format, max_agents=3)
    assert max_completion_bytes(limits, LEVELS, spec_format) < BUDGET  # + 1 end-of-turn token
    roomier = limits.model_copy(update={"max_duty_chars": limits.max_duty_chars + 1})
    assert max_completion_bytes(roomier, LEVELS, spec_format) >= BUDGET - 10  # and not far from it
    with pytest.raises(ValueError, match="max_new_tokens=100 .* raise it to at least"):
        limits_for_budget(100, LEVELS, spec_format, max_agents=3)
