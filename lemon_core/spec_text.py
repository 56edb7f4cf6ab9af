"""Finding a spec in raw orchestrator output: ``parse_spec`` locates the spec block (a ```yaml fence, <spec> tags or
bare YAML/JSON), composes it with a bounded YAML loader (no aliases bombs, no deep nesting), validates it
(``spec.validate_spec``) and returns it with the character span of every field value in the text: the spans the
counterfactual credit is applied to. Every failure is a ``SpecError`` a person can act on."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from lemon_core.spec import (
    NULL_TAG,
    HasLevels,
    OrchestrationSpec,
    SpecError,
    SpecLimits,
    _where,
    validate_spec,
)

# --- finding the spec in raw model output ---------------------------------------------------------
_TAG_RE = re.compile(r"<spec>(.*?)(?:</spec>|\Z)", re.S | re.I)
_FENCE_LINE_RE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*$", re.M)
_TOP_KEY_RE = re.compile(r"^(?:agents|output)[ \t]*:", re.M)
_KEY_HERE_RE = re.compile(r"(?:agents|output)[ \t]*:")
_LEAD = " \t\r\n\ufeff"  # a byte order mark is not content (YAML skips one at the start of a stream)


def _skip_lead(text: str, lo: int, hi: int) -> int:
    while lo < hi and (text[lo] in _LEAD or text[lo].isspace()):
        lo += 1
    return lo
_YAML_LINE_RE = re.compile(r"[ \t\r\n]|-|#|\.\.\.|[A-Za-z_][\w-]*[ \t]*:(?:[ \t\r\n]|$)|$")


def _locate(text: str) -> tuple[int, int]:
    """(start, end) of the spec block in `text`. A text that starts with the spec is the spec; else
    <spec> tags, then the first ```yaml/```yml/```json/``` fence (preferring one that mentions
    agents), then bare YAML from the first top-level `agents:`/`output:` line."""
    first = _skip_lead(text, 0, len(text))
    if text.startswith("{", first) or _KEY_HERE_RE.match(text, first):
        return _bare(text, 0, len(text))
    lo, hi = 0, len(text)
    if tag := _TAG_RE.search(text):
        lo, hi = tag.span(1)
    fences = list(_FENCE_LINE_RE.finditer(text[lo:hi]))  # sliced, so `^` matches right after <spec>
    blocks = []
    for opening, closing in zip(fences[::2], fences[1::2] + [None], strict=False):
        if opening.group(1).lower() in ("", "yaml", "yml", "json"):
            blocks.append((min(lo + opening.end() + 1, hi), lo + closing.start() if closing else hi))
    if blocks:
        return next((b for b in blocks if "agents" in text[b[0]:b[1]]), blocks[0])
    return _bare(text, lo, hi)


def _bare(text: str, lo: int, hi: int) -> tuple[int, int]:
    """Bare JSON (first `{` to last `}`) or bare YAML from the first top-level key, up to the first
    line that cannot continue a YAML mapping (trailing prose such as "Hope this helps!")."""
    start = _skip_lead(text, lo, hi)
    if text.startswith("{", start):
        return start, max(text.rfind("}", start, hi) + 1, start + 1)
    key = _KEY_HERE_RE.match(text, start, hi) or _TOP_KEY_RE.search(text, lo, hi)
    if not key:
        return lo, hi  # no recognisable spec: let the YAML reader report what it sees
    start = end = pos = key.start()
    for line in text[start:hi].splitlines(keepends=True):
        if not _YAML_LINE_RE.match(line):
            break
        pos += len(line)
        if line.strip():
            end = pos
    return start, end


# --- bounded YAML composition ---------------------------------------------------------------------
class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases outright and stops after a node and depth budget. We only
    compose (build the node graph, keeping source marks); nothing is constructed from tags."""

    def __init__(self, stream: str, limits: SpecLimits, first_line: int) -> None:
        super().__init__(stream)
        self.limits, self.first_line = limits, first_line
        self.nodes_seen, self.depth = 0, 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            line = self.first_line + event.start_mark.line + 1
            raise SpecError(f"YAML alias '*{event.anchor}' at line {line}: "
                            "anchors and aliases are not allowed in a spec; write each value out")
        self.nodes_seen += 1
        if self.nodes_seen > self.limits.max_yaml_nodes:
            raise SpecError(f"spec YAML has more than {self.limits.max_yaml_nodes} nodes; "
                            "a spec is far smaller")
        self.depth += 1
        try:
            if self.depth > self.limits.max_yaml_depth:
                raise SpecError(f"spec YAML is nested deeper than {self.limits.max_yaml_depth} levels; "
                                "a spec is agents -> fields -> depends_on")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _compose(block: str, limits: SpecLimits, first_line: int) -> yaml.Node | None:
    try:  # the reader checks characters already in the constructor, so it sits inside the try
        loader = _BoundedLoader(block, limits, first_line)
    except yaml.YAMLError as exc:
        raise SpecError(f"spec is not valid YAML: {exc}; remove control characters from the spec") from None
    try:
        return loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" at line {first_line + mark.line + 1} column {mark.column + 1}" if mark else ""
        raise SpecError(f"spec is not valid YAML{at}: {exc.problem or exc.context}; "
                        "write the spec as YAML (or JSON) with 'agents:' and 'output:'") from None
    except yaml.YAMLError as exc:  # reader errors: non-printable characters and the like
        raise SpecError(f"spec is not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _to_data(node: yaml.Node) -> Any:
    """Composed node -> plain data with every scalar kept as its text (null -> None)."""
    if isinstance(node, yaml.ScalarNode):
        return None if node.tag == NULL_TAG else node.value
    if isinstance(node, yaml.SequenceNode):
        return [_to_data(item) for item in node.value]
    owner = _mapping(node).get("id")
    owner_id = owner.value if isinstance(owner, yaml.ScalarNode) else None
    data: dict[Any, Any] = {}
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode):
            raise SpecError(f"line {key.start_mark.line + 1}: mapping keys must be plain field names")
        if key.value in data:
            raise SpecError(f"{_where(owner_id, key.value)}: given twice; keep one")
        data[key.value] = _to_data(value)
    return data


def _mapping(node: yaml.Node) -> dict[str, yaml.Node]:
    return {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode)}


# --- spans ----------------------------------------------------------------------------------------
_YAML_SPACE = " \t\r\n"  # not str.isspace(): a no-break space can end a plain scalar


def _skip_properties(block: str, start: int, end: int) -> int:
    """Past a node's tag (`!!str`, `!<tag:...>`) and anchor (`&x`), and the blanks and comments after
    them: the node's start mark sits on those, but credit belongs to the value's own characters."""
    while start < end and block[start] in "!&":
        while start < end and block[start] not in _YAML_SPACE:
            start += 1
        while start < end and (block[start] in _YAML_SPACE or block[start] == "#"):
            if block[start] == "#":
                newline = block.find("\n", start, end)
                start = end if newline < 0 else newline
            else:
                start += 1
    return start


def _span(node: yaml.Node, block: str, base: int) -> tuple[int, int]:
    end = _source_end(node, block)
    start = _skip_properties(block, node.start_mark.index, end)
    if isinstance(node, yaml.ScalarNode) and node.style in ('"', "'") and end - start >= 2:
        start, end = start + 1, end - 1
    elif isinstance(node, yaml.ScalarNode) and node.style in ("|", ">"):
        newline = block.find("\n", start, end)
        start = end if newline < 0 else newline + 1
        while start < end and block[start] in _YAML_SPACE:
            start += 1
    return base + start, base + end


def _source_end(node: yaml.Node, block: str) -> int:
    """End of the node's own characters: block lists and block scalars otherwise run on over
    trailing blank lines, comments and indentation up to the next token."""
    if isinstance(node, yaml.CollectionNode) and not node.flow_style and node.value:
        last = node.value[-1]
        return _source_end(last[1] if isinstance(last, tuple) else last, block)
    end = node.end_mark.index
    while end > node.start_mark.index and block[end - 1] in _YAML_SPACE:
        end -= 1
    return end


def _collect_spans(root: yaml.Node, block: str, base: int) -> dict[tuple[str, str], tuple[int, int]]:
    top = _mapping(root)
    spans = {("", "output"): _span(top["output"], block, base)}
    for agent_node in top["agents"].value:
        fields = _mapping(agent_node)
        agent_id = fields["id"].value
        for name, node in fields.items():
            spans[(agent_id, name)] = _span(node, block, base)
            if name == "depends_on" and isinstance(node, yaml.SequenceNode):
                for i, item in enumerate(node.value):
                    spans[(agent_id, f"depends_on[{i}]")] = _span(item, block, base)
    return spans


@dataclass(frozen=True)
class ParsedSpec:
    """A validated spec plus where each field value sits in the raw text it came from.
    spans[(agent_id, field)] for id/role/base_role/duty/capacity/depends_on (fields present in the
    text), spans[(agent_id, "depends_on[i]")] per dependency, spans[("", "output")]; `block` is
    the (start, end) of the extracted spec block."""

    spec: OrchestrationSpec
    text: str
    spans: dict[tuple[str, str], tuple[int, int]]
    block: tuple[int, int] = (0, 0)

    def span_text(self, agent_id: str, field: str) -> str:
        start, end = self.spans[(agent_id, field)]
        return self.text[start:end]


def parse_spec(text: str, pool: HasLevels | Sequence[str] | None = None,
               limits: SpecLimits | None = None) -> ParsedSpec:
    """Find, validate and locate the spec in raw orchestrator output. `pool` (a CapacityPool or a
    list of level names) restricts capacities; None accepts any capacity name."""
    limits = limits or SpecLimits()
    if not isinstance(text, str):
        raise SpecError(f"spec text must be a string; got {type(text).__name__}")
    if len(text) > limits.max_text_chars:
        raise SpecError(f"output is {len(text)} characters, at most {limits.max_text_chars} allowed; "
                        "write a shorter spec")
    start, end = _locate(text)
    block = text[start:end]
    if block.lstrip().startswith("{"):
        block = block.replace("\t", " ")  # raw tabs are only whitespace in valid JSON; YAML rejects them
    root = _compose(block, limits, text.count("\n", 0, start))
    if root is None:
        raise SpecError("no spec found: write YAML with 'agents:' and 'output:', ideally in a ```yaml block")
    levels = pool.level_names if hasattr(pool, "level_names") else pool
    spec = validate_spec(_to_data(root), levels=levels, limits=limits)
    return ParsedSpec(spec=spec, text=text, spans=_collect_spans(root, block, start), block=(start, end))
