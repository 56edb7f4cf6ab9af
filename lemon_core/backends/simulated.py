"""The ``simulated`` capacity pool: a seeded test and research environment with a KNOWN optimum.

This is not a language model and never a default: a pool uses it only when its YAML says
``backend: simulated`` (``lemon_core/configs/pool-simulated.yaml``). It exists so that training can
be checked for *direction* on a CPU in seconds: the best spec for each benchmark is known in advance.

How an agent call is answered:
- The backend finds the task in the prompt (``Task:\\n<question>``) and looks up its gold answer in
  the answer key, which the caller fills explicitly with ``register_examples(examples)``.
- The call is correct with probability ``p = accuracy[benchmark]`` of this level, raised by
  ``parent_boost`` x (fraction of parents whose output was correct) and by ``duty_bonus`` when the
  duty is customised (differs from the base role's default). The draw is a hash of (seed, request),
  so it is reproducible and identical on re-execution.
- ``coupled_draws: true`` (an option of every level, off by default) keys the draw on (seed, the request's
  sampling seed, the task) instead: an agent id (the executor's ``agent_seed``) keeps its number whatever
  its level, duty or inputs, and is right when that number is below its ``p``. A counterfactual
  re-execution then changes the outcome only where the edit changes ``p`` across the drawn number (common
  random numbers), as if the agent kept its luck; with the default, any edit redraws the edited agent, so
  a one-field contrast carries the full noise of a right/wrong outcome. The two are the ends between which
  a real agent lies (a greedy model's answer may flip on any change of its prompt). Note the scope: the
  executor seeds a whole training step alike, so every sample of a task in that step (not only an original
  and its edits) shares its agents' numbers. Each level's marginal chance of being right is the same either
  way. A request without a seed draws as by default.
- Solve-and-check families (a benchmark listed in a level's ``repair_accuracy``): an agent that reads
  parents does not solve from scratch. It keeps a correct parent answer and, where its parents are
  wrong, fixes the answer with probability ``repair_accuracy[benchmark]`` of its level:
  ``p = right + (1 - right) * repair`` with ``right`` the fraction of correct parents (then the duty
  bonus). Checking a right answer takes no capacity; solving does - so the best spec of such a family
  gives its agents *different* capacities (a ``large`` solver, a ``small`` checker).
- A correct call says "The answer is <gold>"; a wrong one gives a deterministic wrong answer.
- Completion tokens are this level's ``completion_tokens``; prompt tokens are whitespace words.

Known optimum of the shipped profile: MultiArith is solved by the cheap level almost always, so a
single ``small`` agent maximises correctness - lambda * cost; GSM8K needs the ``large`` level.
``solve_check`` (simulated only, used by bench/credit.py) is a solve-and-check family: for a
solver -> checker spec the best capacities are ``large`` solver + ``small`` checker (the table is in
``lemon_core/configs/pool-simulated.yaml``, checked by tests/test_simulated_pool.py).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lemon_core.backends.base import Completion, GenerationRequest

_ANSWER_KEY: dict[str, tuple[str, str]] = {}  # question text -> (benchmark, gold answer)
# What may follow the task or a parent's output in an agent's prompt (lemon_core/prompts.py: AGENT_PARENT,
# AGENT_FINAL, UPSTREAM_FORMAT, AGENT_GO).
_NEXT_SECTION = r"\n\nOutput of |\n\nYou give the team|\n\nOther agents read your output|\n\nNow do your duty"
_TASK_RE = re.compile(rf"Task:\n(.*?)(?:{_NEXT_SECTION})", re.S)
_PARENT_RE = re.compile(rf"Output of .*? \(([^)]*)\):\n(.*?)(?={_NEXT_SECTION})", re.S)


def register_examples(examples: Iterable[Any]) -> int:
    """Teach the simulated pool the gold answers of these examples (``question``/``answer``/``benchmark``)."""
    n = 0
    for ex in examples:
        _ANSWER_KEY[ex.question.strip()] = (ex.benchmark, str(ex.answer))
        n += 1
    return n


def _uniform(*parts: object) -> float:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _wrong_answer(gold: str) -> str:
    if len(gold) == 1 and gold.isalpha():
        return "B" if gold.upper() == "A" else "A"
    try:
        return str(int(float(gold)) + 1)
    except ValueError:
        return gold + "?"


class SimulatedBackend:
    """One capacity level of the simulated pool (see the module docstring)."""

    # every call is a seeded draw, greedy or not: the seed stays in the request (and in its cache key)
    greedy_uses_seed = True

    def __init__(
        self, level: str, accuracy: Mapping[str, float], completion_tokens: int = 64,
        parent_boost: float = 0.3, duty_bonus: float = 0.05, seed: int = 0, default_accuracy: float = 0.5,
        repair_accuracy: Mapping[str, float] | None = None, coupled_draws: bool = False,
    ) -> None:
        self.level = level
        self.accuracy = dict(accuracy)
        self.completion_tokens = completion_tokens
        self.parent_boost = parent_boost
        self.duty_bonus = duty_bonus
        self.seed = seed
        self.default_accuracy = default_accuracy
        self.repair_accuracy = dict(repair_accuracy or {})
        self.coupled_draws = coupled_draws
        for name, value in {**self.accuracy, **self.repair_accuracy}.items():
            if not 0 <= value <= 1:
                raise ValueError(
                    f"simulated level {level!r}: accuracy of {name!r} is {value}; use a probability in [0, 1]"
                )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return [self._answer(r) for r in requests]

    def close(self) -> None:
        pass

    def _answer(self, request: GenerationRequest) -> Completion:
        system, user = request.messages[0][1], request.messages[-1][1]
        prompt_tokens = len(system.split()) + len(user.split())
        found = _TASK_RE.search(user + "\n\nNow do your duty")
        question = found.group(1).strip() if found else ""
        key = _ANSWER_KEY.get(question) if found else None
        if key is None:
            return Completion("", prompt_tokens, 0, 0.001,
                              error="simulated pool: task not in the answer key; call register_examples()")
        benchmark, gold = key
        p = self._probability_right(benchmark, gold, _PARENT_RE.findall(user + "\n\nNow do"))
        if self._duty_is_customised(system):
            p = min(1.0, p + self.duty_bonus)
        # module docstring: coupled draws give one agent id one number across levels, duties and inputs
        coupled = self.coupled_draws and request.seed is not None
        draw = (request.seed, question) if coupled else (self.level, request)
        correct = _uniform(self.seed, *draw) < p
        text = f"The answer is {gold if correct else _wrong_answer(gold)}."
        return Completion(text, prompt_tokens, self.completion_tokens, 0.001)

    def _probability_right(self, benchmark: str, gold: str, parents: list[tuple[str, str]]) -> float:
        """Chance this call is right before the duty bonus (module docstring: solve vs solve-and-check)."""
        right = sum(1 for _, out in parents if out.strip().endswith(f"The answer is {gold}.")) / max(len(parents), 1)
        if parents and benchmark in self.repair_accuracy:
            return right + (1 - right) * self.repair_accuracy[benchmark]
        p = self.accuracy.get(benchmark, self.default_accuracy)
        return p + (1 - p) * self.parent_boost * right

    @staticmethod
    def _duty_is_customised(system: str) -> bool:
        from lemon_core.roles import BASE_ROLES

        duty = system.split("Your duty: ", 1)[-1].strip()
        return duty not in BASE_ROLES.values()
