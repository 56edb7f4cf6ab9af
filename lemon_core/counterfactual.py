"""Localized counterfactual edits of an orchestration spec (the paper's three edit families).

Each edit changes exactly one field of one agent and remembers the character span of that field
in the orchestrator's original completion. After re-execution (with the node cache, so everything
upstream of the edited agent is held fixed), the contrast Delta = r(original) - r(edited) says how
much that one decision was worth; the GRPO loss applies it to the tokens of that span only.

Families:
- ``drop_dependency``: remove one ``depends_on`` entry (span: that entry).
- ``duty_rollback``: replace a customised duty by its base role's default duty (span: the duty).
- ``capacity_downgrade``: move one agent one capacity level down (span: the capacity value).

``EditFamilySampler`` picks families adaptively: in proportion to each family's recent mean |Delta|
(an exponential moving average), mixed with a uniform floor so no family is ever starved.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from lemon_core.pool import CapacityPool
from lemon_core.roles import BASE_ROLES
from lemon_core.spec import OrchestrationSpec, ParsedSpec


class EditFamily(StrEnum):
    drop_dependency = "drop_dependency"
    duty_rollback = "duty_rollback"
    capacity_downgrade = "capacity_downgrade"


@dataclass(frozen=True)
class CounterfactualEdit:
    """One single-field edit: the edited spec and the span (in the original text) that it changed."""

    family: EditFamily
    agent_id: str
    span: tuple[int, int]
    spec: OrchestrationSpec
    description: str


def _replace_agent(spec: OrchestrationSpec, agent_id: str, **update: object) -> OrchestrationSpec:
    agents = [a.model_copy(update=update) if a.id == agent_id else a for a in spec.agents]
    return OrchestrationSpec(agents=agents, output=spec.output)


def counterfactual_edits(parsed: ParsedSpec, pool: CapacityPool) -> list[CounterfactualEdit]:
    """Every possible single-field edit of ``parsed.spec`` in the three families."""
    spec, spans = parsed.spec, parsed.spans
    edits: list[CounterfactualEdit] = []
    for agent in spec.agents:
        for i, parent in enumerate(agent.depends_on):
            kept = [p for p in agent.depends_on if p != parent]
            edits.append(CounterfactualEdit(
                EditFamily.drop_dependency, agent.id, spans[(agent.id, f"depends_on[{i}]")],
                _replace_agent(spec, agent.id, depends_on=kept), f"{agent.id}: drop dependency on {parent}",
            ))
        default_duty = BASE_ROLES[agent.base_role]
        if agent.duty.strip() != default_duty:
            edits.append(CounterfactualEdit(
                EditFamily.duty_rollback, agent.id, spans[(agent.id, "duty")],
                _replace_agent(spec, agent.id, duty=default_duty),
                f"{agent.id}: duty back to the {agent.base_role} default",
            ))
        lower = pool.downgrade(agent.capacity)
        if lower is not None:
            edits.append(CounterfactualEdit(
                EditFamily.capacity_downgrade, agent.id, spans[(agent.id, "capacity")],
                _replace_agent(spec, agent.id, capacity=lower),
                f"{agent.id}: capacity {agent.capacity} -> {lower}",
            ))
    return edits


class EditFamilySampler:
    """Adaptive choice of edit families: p(f) = floor/F + (1 - floor) * ema|Delta|_f / sum ema|Delta|."""

    def __init__(self, floor: float = 0.2, decay: float = 0.9, initial: float = 1.0) -> None:
        if not 0 <= floor <= 1:
            raise ValueError(f"floor must be in [0, 1], got {floor}")
        self.floor = floor
        self.decay = decay
        self.mean_abs_delta = {f: initial for f in EditFamily}

    def probabilities(self, families: Sequence[EditFamily] | None = None) -> dict[EditFamily, float]:
        fams = list(families) if families is not None else list(EditFamily)
        total = sum(self.mean_abs_delta[f] for f in fams)
        return {
            f: self.floor / len(fams)
            + (1 - self.floor) * (self.mean_abs_delta[f] / total if total > 0 else 1 / len(fams))
            for f in fams
        }

    def update(self, family: EditFamily, delta: float) -> None:
        self.mean_abs_delta[family] = self.decay * self.mean_abs_delta[family] + (1 - self.decay) * abs(delta)

    def sample(self, edits: Sequence[CounterfactualEdit], k: int, rng: random.Random) -> list[CounterfactualEdit]:
        """Up to ``k`` distinct edits: pick a family by probability, then an edit of it uniformly."""
        by_family: dict[EditFamily, list[CounterfactualEdit]] = {}
        for e in edits:
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
