"""The backend contract: a batch of chat requests in, one completion per request out.

Every capacity level of a pool is served by one backend. The executor hands a backend *all* agent
calls of one DAG level that share that capacity in a single ``generate`` call, so backends should
batch (transformers: one padded forward pass; HTTP: concurrent requests; vLLM: one ``LLM.chat``).

A backend never raises for one bad request: it returns a ``Completion`` with ``error`` set, so a
single failing agent yields a failed trace instead of a crashed batch. It raises ``BackendError``
only for failures that make the whole backend unusable (model missing, server unreachable at start).

A request may carry ``stop``, an event its owner sets when nobody will read the answer any more (the
service's client went away): backends check it while they work (each decode step, before and during an
HTTP call) and end such a request early with ``STOPPED`` as its error, so an abandoned request stops
costing compute instead of running to its token cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

STOPPED = "stopped: nobody waits for this answer any more"
UNAVAILABLE = "backend unavailable: "  # the start of an error from a backend that did not answer at all


class StopSignal(Protocol):
    """What ``GenerationRequest.stop`` must offer: ``threading.Event`` fits."""

    def is_set(self) -> bool: ...


class BackendError(RuntimeError):
    """The backend as a whole cannot serve requests (message says what to fix)."""


@dataclass(frozen=True)
class GenerationRequest:
    """One chat completion request. ``messages`` use the OpenAI format: [{"role", "content"}]."""

    messages: tuple[tuple[str, str], ...]  # ((role, content), ...) - a tuple so requests hash
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    grammar: Any = None  # a grammar.SpecGrammar: the completion must be a spec of that language (orchestrator)
    # set when the answer is no longer wanted; not part of the request's identity (cache keys, dedup)
    stop: StopSignal | None = field(default=None, compare=False, repr=False)

    @property
    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    @staticmethod
    def chat(
        system: str | None, user: str, *, max_tokens: int = 256, temperature: float = 0.0,
        top_p: float = 1.0, seed: int | None = None,
    ) -> GenerationRequest:
        msgs = ((("system", system),) if system else ()) + (("user", user),)
        return GenerationRequest(msgs, max_tokens, temperature, top_p, seed)

    def openai_messages(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]


@dataclass
class Completion:
    """What a backend returns for one request. ``error`` is set (and ``text`` empty) on failure."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    error: str | None = None
    looped: bool = False  # a greedy agent answer that ended in an exact repetition loop (LoopStop)
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


@runtime_checkable
class Backend(Protocol):
    """Anything that turns a batch of chat requests into completions, in order."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]: ...

    def close(self) -> None: ...


def repeating_tail(tokens: Sequence[int], repeats: int, min_tokens: int, max_period: int = 64) -> int | None:
    """The period p of a run of ``tokens``' last p tokens repeated ``repeats`` times in a row, covering at least
    ``min_tokens`` tokens (``p * repeats >= min_tokens``), the shortest such p; None if the tail is no loop.

    ``[.. 5, 7, 9, 5, 7, 9, 5, 7, 9]`` with repeats 3 and min_tokens 9 gives 3. min_tokens keeps short,
    legitimate repetitions (``1 1 1``, a table's ``| |``) from counting; the cost is a few list comparisons per
    row and step, beside a forward pass of the whole batch."""
    n = len(tokens)
    for p in range(1, min(max_period, n // repeats) + 1):
        if p * repeats < min_tokens or tokens[n - 1] != tokens[n - 1 - p]:
            continue
        tail = list(tokens[n - p :])
        if all(list(tokens[n - (k + 1) * p : n - k * p]) == tail for k in range(1, repeats)):
            return p
    return None


@dataclass(frozen=True)
class LoopStop:
    """When a greedy agent answer is stuck: its tokens end in the same run repeated ``repeats`` times in a row,
    ``min_tokens`` tokens at least (``repeating_tail``). Under greedy decoding such an answer would repeat until any
    token cap, so a backend stops it (transformers) or marks it (vLLM) as ``Completion.looped``. Sampled rows can
    leave a loop and a spec under a grammar is left to its parser, so those never count. ``repeats`` 0 = off."""

    repeats: int = 4
    min_tokens: int = 32

    def __post_init__(self) -> None:
        if self.repeats == 1 or self.repeats < 0:
            raise BackendError(f"loop_stop_repeats={self.repeats}: use 0 (never stop a loop) or >= 2 "
                               "(a run of tokens seen that many times in a row ends a greedy answer)")
        if self.min_tokens < 1:
            raise BackendError(f"loop_stop_min_tokens={self.min_tokens}: use >= 1 ({LoopStop.min_tokens} by default)")

    def ends(self, request: GenerationRequest, tokens: Sequence[int]) -> bool:
        return (self.repeats >= 2 and request.temperature <= 0 and request.grammar is None
                and repeating_tail(tokens, self.repeats, self.min_tokens) is not None)
