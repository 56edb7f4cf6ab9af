"""The backend contract: a batch of chat requests in, one completion per request out.

Every capacity level of a pool is served by one backend. The executor hands a backend *all* agent
calls of one DAG level that share that capacity in a single ``generate`` call, so backends should
batch (transformers: one padded forward pass; HTTP: concurrent requests; vLLM: one ``LLM.chat``).

A backend never raises for one bad request: it returns a ``Completion`` with ``error`` set, so a
single failing agent yields a failed trace instead of a crashed batch. It raises ``BackendError``
only for failures that make the whole backend unusable (model missing, server unreachable at start).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


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
    looped: bool = False  # a greedy answer stopped in an exact repetition loop (transformers_backend.repeating_tail)
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


@runtime_checkable
class Backend(Protocol):
    """Anything that turns a batch of chat requests into completions, in order."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]: ...

    def close(self) -> None: ...
