"""TEST DOUBLES for the service - not models. Used by tests/test_serve*.py and bench/serve_load.py.

``ScriptedOrchestrator`` plays the orchestrator: it returns pre-written spec texts (or a function of
the request), so the HTTP layer, batching, re-sampling and limits can be checked without a trained
model. ``EchoAgent`` plays one capacity level: it answers "The answer is 42." with fixed token counts
and can wait (``delay_s`` per batch, or until an event is set) or fail, to test concurrency and
error paths; while it waits it honours ``GenerationRequest.stop`` like a real backend (a batch whose
requests are all stopped returns at once, with ``STOPPED`` errors). Anything built on them reports
itself as a test double.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from lemon_core.backends.base import STOPPED, Completion, GenerationRequest
from lemon_core.spec import AgentSpec, OrchestrationSpec, render_spec


def two_agent_spec(small: str = "small", large: str = "large") -> str:
    """A valid orchestrator answer: a solver at ``small`` checked by a verifier at ``large``."""
    spec = OrchestrationSpec(agents=[
        AgentSpec(id="solve", role="Arithmetic solver", base_role="solver",
                  duty="Solve the problem step by step.", capacity=small),
        AgentSpec(id="check", role="Answer checker", base_role="verifier",
                  duty="Check the solution and give the final answer.", capacity=large, depends_on=["solve"]),
    ], output="check")
    return f"Here is the team.\n```yaml\n{render_spec(spec)}```\n"


class ScriptedOrchestrator:
    """Returns ``script[k]`` for the k-th request it sees (the last entry repeats), or ``script(request)``."""

    def __init__(self, script: Sequence[str] | Callable[[GenerationRequest], str], tokens: int = 50) -> None:
        self.script = script
        self.tokens = tokens
        self.calls: list[list[GenerationRequest]] = []  # one entry per generate() call (a batch)
        self._lock = threading.Lock()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        with self._lock:
            start = sum(len(c) for c in self.calls)
            self.calls.append(list(requests))
        out = []
        for k, req in enumerate(requests, start):
            text = self.script(req) if callable(self.script) else self.script[min(k, len(self.script) - 1)]
            out.append(Completion(text, prompt_tokens=100, completion_tokens=self.tokens, latency_s=0.001))
        return out

    def close(self) -> None:
        pass


class EchoAgent:
    """One capacity level: "[<name>] The answer is 42." with 10 prompt + ``tokens`` completion tokens."""

    def __init__(self, name: str, tokens: int = 20, delay_s: float = 0.0, gate: threading.Event | None = None,
                 error: str | None = None) -> None:
        self.name = name
        self.tokens = tokens
        self.delay_s = delay_s
        self.gate = gate
        self.error = error
        self.requests: list[GenerationRequest] = []
        self.stopped = 0  # requests answered STOPPED

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.requests.extend(requests)
        self._wait(requests)
        out = []
        for req in requests:
            if req.stopped:
                self.stopped += 1
                out.append(Completion("", error=STOPPED))
            elif self.error:
                out.append(Completion("", latency_s=self.delay_s, error=self.error))
            else:
                out.append(Completion(f"[{self.name}] The answer is 42.", 10, self.tokens, self.delay_s or 0.001))
        return out

    def _wait(self, requests: Sequence[GenerationRequest]) -> None:
        """The gate, then ``delay_s`` (one batched forward pass: the same wait for 1 or 100 requests), in short
        steps that end early once every request of the batch is stopped."""
        deadline = time.monotonic() + 30
        while self.gate is not None and not self.gate.is_set() and time.monotonic() < deadline:
            if all(r.stopped for r in requests):
                return
            self.gate.wait(0.01)
        end = time.monotonic() + self.delay_s
        while (left := end - time.monotonic()) > 0 and not all(r.stopped for r in requests):
            time.sleep(min(left, 0.01))

    def close(self) -> None:
        pass
