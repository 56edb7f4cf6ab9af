"""The service's orchestrator under the spec grammar: in process (transformers backend, a random tiny
model that unconstrained writes no spec at all) and over HTTP (the request body vLLM's guidance backend
reads)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lemon_core.backends.openai_http import OpenAIBackend
from lemon_core.backends.transformers_backend import TransformersBackend
from lemon_core.pool import load_pool
from lemon_core.serve.orchestrator import Job, Orchestrator
from lemon_core.serve.settings import ServeSettings

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import build_tiny_chat_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny_backend(tmp_path_factory: pytest.TempPathFactory) -> TransformersBackend:
    torch.set_num_threads(1)
    return TransformersBackend(str(build_tiny_chat_model(tmp_path_factory.mktemp("tiny"), seed=5)))


def _orchestrator(backend: object, grammar: bool) -> Orchestrator:
    settings = ServeSettings(pool="simulated", orchestrator_grammar=grammar, include_roles=False,
                             include_format=False, orchestrator_max_tokens=600,
                             orchestrator_grammar_max_text_chars=30)
    return Orchestrator(backend, load_pool("simulated"), settings)  # type: ignore[arg-type]


def test_untrained_orchestrator_writes_valid_specs_under_the_grammar(tiny_backend: TransformersBackend) -> None:
    jobs = [Job(task=f"What is {i} times 3?", max_agents=3) for i in range(3)]
    free = _orchestrator(tiny_backend, grammar=False).write_specs(jobs)
    assert all(o.parsed is None and o.error_type == "invalid_spec" for o in free)  # the old 502
    constrained = _orchestrator(tiny_backend, grammar=True).write_specs(jobs)
    for outcome in constrained:
        assert outcome.parsed is not None or "no agent depends on it" in (outcome.error or ""), outcome.error
        if outcome.parsed is not None:
            spec = outcome.parsed.spec
            assert len(spec.agents) <= 3 and spec.output == spec.agents[-1].id  # the job's budget, a sink output
    assert any(o.parsed is not None for o in constrained)
    alone = [_orchestrator(tiny_backend, grammar=True).write_specs([job])[0] for job in jobs]
    assert [o.text for o in alone] == [o.text for o in constrained]  # rows that end first leave the batch


def test_http_orchestrator_sends_the_grammar_as_structured_outputs() -> None:
    request = _orchestrator(None, grammar=True).request("2 + 2?", seed=0, temperature=0.0, max_agents=2)
    body = OpenAIBackend("http://127.0.0.1:9/v1", "orchestrator").payload(request)
    assert body["structured_outputs"] == request.grammar.structured_outputs
    assert "grammar" in body["structured_outputs"] and "a2" in body["structured_outputs"]["grammar"]
    plain = _orchestrator(None, grammar=False).request("2 + 2?", seed=0, temperature=0.0)
    assert "structured_outputs" not in OpenAIBackend("http://127.0.0.1:9/v1", "orchestrator").payload(plain)
