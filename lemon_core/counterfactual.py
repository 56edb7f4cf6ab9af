"""Localized counterfactual edits of an orchestration spec (dependency, duty and capacity edits).

Each edit changes exactly one field of one agent and remembers the character span of that field
in the orchestrator's original completion. After re-execution (with the node cache, so everything
upstream of the edited agent is held fixed), the contrast Delta = r(original) - r(edited) says how
much that one decision was worth; the GRPO loss applies it to the tokens of that span only.

Families (``DEFAULT_FAMILIES``, what ``rollout.edit_families`` probes unless told otherwise):
- ``drop_dependency``: remove one ``depends_on`` entry (span: that entry).
- ``duty_rollback``: replace a customised duty by its base role's default duty (span: the duty).
- ``capacity_reset``: move one agent above the pool's cheapest level to that level (span: the capacity value).
  Every level is contrasted with the same reference, so Δ = r(v, rest) − r(cheapest, rest) ranks the levels
  v of a field the way their rewards do. On a two-level pool it is the one-level downgrade, edit for edit.

Two more, off unless asked for:
- ``capacity_downgrade``: move one agent one capacity level down (the paper's capacity edit; ``PAPER_FAMILIES``
  = the dependency and duty edits and this one). Its reference moves with the sampled value (`large` is
  measured against `medium`, `medium` against `small`), so the contrast can prefer a middle level that is not
  the best.
- ``capacity_upgrade``: move one agent one capacity level up, so a ``small`` agent is probed too
  (``ALL_FAMILIES`` = the paper's three and this one).

``EditFamilySampler`` picks families adaptively: in proportion to each family's recent mean |Delta|
(an exponential moving average), mixed with a uniform floor so no family is ever starved. It only
samples its ``families``; ``counterfactual_edits(parsed, pool, sampler.families)`` lists just those.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

import yaml

from lemon_core.pool import CapacityPool
from lemon_core.roles import BASE_ROLES
from lemon_core.spec import OrchestrationSpec, SpecError
from lemon_core.spec_text import ParsedSpec, parse_spec


class EditFamily(StrEnum):
    drop_dependency = "drop_dependency"
    duty_rollback = "duty_rollback"
    capacity_downgrade = "capacity_downgrade"
    capacity_upgrade = "capacity_upgrade"
    capacity_reset = "capacity_reset"


PAPER_FAMILIES: tuple[EditFamily, ...] = (
    EditFamily.drop_dependency, EditFamily.duty_rollback, EditFamily.capacity_downgrade,
)
ALL_FAMILIES: tuple[EditFamily, ...] = (*PAPER_FAMILIES, EditFamily.capacity_upgrade)
DEFAULT_FAMILIES: tuple[EditFamily, ...] = (
    EditFamily.drop_dependency, EditFamily.duty_rollback, EditFamily.capacity_reset,
)
# the three sets by the short names the benches take (bench/credit.py, bench/counterfactual.py: --families)
FAMILY_SETS: dict[str, tuple[EditFamily, ...]] = {"reset": DEFAULT_FAMILIES, "paper": PAPER_FAMILIES,
                                                  "all": ALL_FAMILIES}


@dataclass(frozen=True)
class CounterfactualEdit:
    """One single-field edit: the edited spec and the span (in the original text) that it changed."""

    family: EditFamily
    agent_id: str
    span: tuple[int, int]
    spec: OrchestrationSpec
    description: str
    # the level a capacity edit puts in the span, for the pairwise credit term (``credit.pair_loss``); None for the
    # other families: a dropped dependency writes nothing there, and a duty's pair would push a whole sentence down
    # token by token against the reference (DPO's failure on long spans), which garbled specs on the credit bench
    value: str | None = None


def _replace_agent(spec: OrchestrationSpec, agent_id: str, **update: object) -> OrchestrationSpec:
    agents = [a.model_copy(update=update) if a.id == agent_id else a for a in spec.agents]
    return OrchestrationSpec(agents=agents, output=spec.output)


def upgrade(pool: CapacityPool, name: str) -> str | None:
    """The next dearer level (levels are listed cheapest first), or None if ``name`` is the dearest."""
    names = pool.level_names
    i = names.index(pool.level(name).name)
    return names[i + 1] if i + 1 < len(names) else None


def parse_families(names: Collection[str | EditFamily]) -> tuple[EditFamily, ...]:
    """Edit families from config strings, with an error naming the valid ones."""
    try:
        families = tuple(dict.fromkeys(EditFamily(n) for n in names))
    except ValueError as e:
        raise ValueError(f"edit families {list(names)!r}: {e}; use some of {[f.value for f in EditFamily]}") from e
    if not families:
        raise ValueError(f"edit families is empty; use some of {[f.value for f in EditFamily]} (or edits_per_spec: 0)")
    return families


def counterfactual_edits(
    parsed: ParsedSpec, pool: CapacityPool, families: Collection[str | EditFamily] = DEFAULT_FAMILIES,
) -> list[CounterfactualEdit]:
    """Every possible single-field edit of ``parsed.spec`` in ``families``."""
    wanted = set(parse_families(families))
    spec, spans = parsed.spec, parsed.spans
    reference = pool.level_names[0]  # what a capacity_reset resets to: the cheapest level
    edits: list[CounterfactualEdit] = []

    def add(family: EditFamily, agent_id: str, field: str, description: str, value: str | None = None,
            **update: object) -> None:
        if family in wanted:  # build only the edits asked for: each is a validated copy of the spec
            edited = _replace_agent(spec, agent_id, **update)
            edits.append(CounterfactualEdit(family, agent_id, spans[(agent_id, field)], edited, description, value))

    for agent in spec.agents:
        for i, parent in enumerate(agent.depends_on):
            add(EditFamily.drop_dependency, agent.id, f"depends_on[{i}]", f"{agent.id}: drop dependency on {parent}",
                depends_on=[p for p in agent.depends_on if p != parent])
        default_duty = BASE_ROLES[agent.base_role]
        if agent.duty.strip() != default_duty:
            add(EditFamily.duty_rollback, agent.id, "duty", f"{agent.id}: duty back to the {agent.base_role} default",
                duty=default_duty)
        if (lower := pool.downgrade(agent.capacity)) is not None:
            add(EditFamily.capacity_downgrade, agent.id, "capacity",
                f"{agent.id}: capacity {agent.capacity} -> {lower}", value=lower, capacity=lower)
        if (higher := upgrade(pool, agent.capacity)) is not None:
            add(EditFamily.capacity_upgrade, agent.id, "capacity",
                f"{agent.id}: capacity {agent.capacity} -> {higher}", value=higher, capacity=higher)
        if agent.capacity != reference:
            add(EditFamily.capacity_reset, agent.id, "capacity",
                f"{agent.id}: capacity {agent.capacity} -> {reference} (the reference level)", value=reference,
                capacity=reference)
    return edits


def written_value(parsed: ParsedSpec, edit: CounterfactualEdit, pool: CapacityPool) -> str | None:
    """What to write in ``edit.span`` of the completion so that it reads as the edited spec, or None.

    The pairwise credit term (``credit.pair_loss``) scores the edit's value at the place the policy wrote the
    original one, so it needs text, not a spec. The value is taken verbatim only where the completion with it
    written in parses to exactly ``edit.spec``; an edit without a value (``CounterfactualEdit.value``) gets None
    and no pairwise term.
    """
    if edit.value is None:
        return None
    start, end = edit.span
    try:
        reparsed = parse_spec(parsed.text[:start] + edit.value + parsed.text[end:], pool)
    except (SpecError, yaml.YAMLError):
        return None
    return edit.value if reparsed.spec == edit.spec else None


class EditFamilySampler:
    """Adaptive choice of edit families: p(f) = floor/F + (1 - floor) * ema|Delta|_f / sum ema|Delta|.

    Only ``families`` are ever sampled (default ``DEFAULT_FAMILIES``; ``PAPER_FAMILIES`` and ``ALL_FAMILIES``
    in the module docstring). ``mean_abs_delta`` keeps an entry for every family so checkpoints have one
    shape; a family missing from a restored dict (an older checkpoint) starts at ``initial``.
    """

    def __init__(
        self, floor: float = 0.2, decay: float = 0.9, initial: float = 1.0,
        families: Collection[str | EditFamily] = DEFAULT_FAMILIES,
    ) -> None:
        if not 0 <= floor <= 1:
            raise ValueError(f"floor must be in [0, 1], got {floor}")
        self.floor = floor
        self.decay = decay
        self.initial = initial
        self.families = parse_families(families)
        self.mean_abs_delta = {f: initial for f in EditFamily}

    def probabilities(self, families: Sequence[EditFamily] | None = None) -> dict[EditFamily, float]:
        fams = list(families) if families is not None else list(self.families)
        ema = [self.mean_abs_delta.get(f, self.initial) for f in fams]
        return dict(zip(fams, floored_shares(ema, self.floor), strict=True))

    def update(self, family: EditFamily, delta: float) -> None:
        old = self.mean_abs_delta.get(family, self.initial)
        self.mean_abs_delta[family] = self.decay * old + (1 - self.decay) * abs(delta)

    def sample(self, edits: Sequence[CounterfactualEdit], k: int, rng: random.Random) -> list[CounterfactualEdit]:
        """Up to ``k`` distinct edits of this sampler's families: pick a family by probability, then an
        edit of it uniformly. Edits of other families are ignored."""
        by_family: dict[EditFamily, list[CounterfactualEdit]] = {}
        for e in edits:
            if e.family in self.families:
                by_family.setdefault(e.family, []).append(e)
        chosen: list[CounterfactualEdit] = []
        while len(chosen) < k and by_family:
            probs = self.probabilities(list(by_family))
            family = rng.choices(list(probs), weights=list(probs.values()))[0]
            pool = by_family[family]
            chosen.append(pool.pop(rng.randrange(len(pool))))
            if not pool:
                del by_family[family]
        return chosen


def floored_shares(weights: Sequence[float], floor: float) -> list[float]:
    """floor / n + (1 - floor) · w_i / Σ w for each of n non-negative weights (uniform where they are all 0): how
    the family sampler mixes what it prefers with a uniform share, so no family is ever starved."""
    total = sum(weights)
    return [floor / len(weights) + (1 - floor) * (w / total if total > 0 else 1 / len(weights)) for w in weights]
