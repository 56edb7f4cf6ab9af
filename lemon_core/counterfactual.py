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
  v of a field the way their rewards do; a one-level downgrade's reference moves with v (below). On a two-level
  pool (configs/pool-cpu.yaml) it is the downgrade, edit for edit. Default since 2026-12-07: on bench/credit.py
  (one checker, 32 seeds) 46.78 steps to 90% of r* against 52.50 with downgrades (−5.7 ± 2.1 paired, later on 2
  seeds), P(optimal spec) +0.16 ± 0.04, valid 0.995 against 0.992; with the span-term cap at ρ = 1
  (``GRPOConfig.cf_max_ratio``, the default since) 39.31 steps against plain GRPO's 60.78, ratio 0.647. The
  tables are in bench/credit.py's docstring.

The paper's capacity edit as lemon first built it, and one more, off unless asked for:

- ``capacity_downgrade``: move one agent one capacity level down (``PAPER_FAMILIES`` = the dependency and duty
  edits and this one). With a `small` checker, E[r] is 0.638 / 0.461 / 0.242 for a large / medium / small solver
  on bench/credit.py, so a downgrade credits `large` with 0.177 and `medium` with 0.219: the reference depends on
  the sampled value, and the contrast prefers `medium`.
- ``capacity_upgrade``: move one agent one capacity level up (span: the capacity value). Without it a
  ``small`` agent is never probed - downgrades only point cheaper - so a policy that collapsed to
  ``small`` everywhere gets no span signal that one of its agents needs more capacity.
  Off by default because no measurement has shown a gain yet: in the short CPU runs of
  bench/credit.py (solve_check, seed 0, 12 steps) neither edit set brought the tiny policy to 90% of
  the optimum (both censored; final reward -0.40 with it vs -0.43 without, 4 epochs per batch, one
  seed - noise); on 2026-12-05, seeds 0-3 at 20 steps gave steps-to-target ratios of 0.913 with it (K=2)
  and 1.043 (K=4) against GRPO, where the paper's three give 0.988 over 16 seeds: no gain beyond noise.
  Turn it on (``families=ALL_FAMILIES``, the paper's three and this one) where a collapse to the cheapest
  level is a risk.

``null_resets=True`` (``rollout.null_resets``) also gives each agent already at the cheapest level a reset, the
unchanged spec: its re-execution is all node-cache hits and its contrast exactly 0. That zero matters only under
``GRPOConfig.cf_span_credit: replace``, where it stands in for the group term on the agent's capacity span; under
the default ``add`` it spends one of the K edits on nothing (with it, bench/credit.py gave 48.25 steps over the
32 seeds, without it 46.78).

``EditFamilySampler`` picks families adaptively: in proportion to each family's recent mean |Delta|
(an exponential moving average), mixed with a uniform floor so no family is ever starved. It only
samples its ``families``; ``counterfactual_edits(parsed, pool, sampler.families)`` lists just those.

``sample_uncertain_edits`` is the other way to spend the K re-executions (``rollout.edit_choice:
uncertain``): on the fields the policy has not decided yet. The span term moves a span's tokens by
Δ · ∇ log p, and ∇ log p with respect to the sampled token's logit is 1 − p: a field the policy
writes with p ≈ 1 (a dependency SFT always writes) gains almost nothing from its contrast, however
large Δ is, while a capacity it still hesitates over (p ≈ 0.5) gains most. So each edit is drawn with
weight 1 − p(span), p(span) the product of its tokens' sampling probabilities, mixed with a uniform floor.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

from lemon_core.pool import CapacityPool
from lemon_core.roles import BASE_ROLES
from lemon_core.spec import OrchestrationSpec, ParsedSpec


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
    *, null_resets: bool = False,
) -> list[CounterfactualEdit]:
    """Every possible single-field edit of ``parsed.spec`` in ``families``. ``null_resets`` adds a
    ``capacity_reset`` that changes nothing for each agent already at the cheapest level (module docstring)."""
    wanted = set(parse_families(families))
    spec, spans = parsed.spec, parsed.spans
    reference = pool.level_names[0]  # what a capacity_reset resets to: the cheapest level
    edits: list[CounterfactualEdit] = []

    def add(family: EditFamily, agent_id: str, field: str, description: str, **update: object) -> None:
        if family in wanted:  # build only the edits asked for: each is a validated copy of the spec
            edited = _replace_agent(spec, agent_id, **update)
            edits.append(CounterfactualEdit(family, agent_id, spans[(agent_id, field)], edited, description))

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
                f"{agent.id}: capacity {agent.capacity} -> {lower}", capacity=lower)
        if (higher := upgrade(pool, agent.capacity)) is not None:
            add(EditFamily.capacity_upgrade, agent.id, "capacity",
                f"{agent.id}: capacity {agent.capacity} -> {higher}", capacity=higher)
        if null_resets or agent.capacity != reference:
            add(EditFamily.capacity_reset, agent.id, "capacity",
                f"{agent.id}: capacity {agent.capacity} -> {reference} (the reference level)", capacity=reference)
    return edits


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


def sample_uncertain_edits(
    edits: Sequence[CounterfactualEdit], uncertainty: Sequence[float], k: int, rng: random.Random,
    floor: float = 0.2,
) -> list[CounterfactualEdit]:
    """Up to ``k`` distinct edits, drawn one at a time from those left with probability
    floor / n + (1 - floor) · u_e / Σ u, where u_e = 1 - p(edited span) is ``uncertainty`` (module docstring).
    With every u_e = 0 (a policy sure of every field) the draw is uniform."""
    if len(edits) != len(uncertainty):
        raise ValueError(f"{len(edits)} edits but {len(uncertainty)} uncertainties; need one per edit")
    left = list(zip(edits, uncertainty, strict=True))
    chosen: list[CounterfactualEdit] = []
    while len(chosen) < k and left:
        weights = floored_shares([max(u, 0.0) for _, u in left], floor)
        chosen.append(left.pop(rng.choices(range(len(left)), weights=weights)[0])[0])
    return chosen


def floored_shares(weights: Sequence[float], floor: float) -> list[float]:
    """floor / n + (1 - floor) · w_i / Σ w for each of n non-negative weights (uniform where they are all 0): how
    both edit samplers mix what they prefer with a uniform share, so no family or field is ever starved."""
    total = sum(weights)
    return [floor / len(weights) + (1 - floor) * (w / total if total > 0 else 1 / len(weights)) for w in weights]
