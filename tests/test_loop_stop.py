"""A greedy agent answer stuck in an exact repetition loop is stopped there and counted as ``looped``, apart from
answers cut off by their level's token cap (``truncated``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from tiny_models import build_tiny_chat_model  # tests/ is on sys.path

from lemon_core.backends import transformers_backend
from lemon_core.backends.base import BackendError, Completion, GenerationRequest, LoopStop, repeating_tail
from lemon_core.backends.simulated import register_examples
from lemon_core.backends.transformers_backend import TransformersBackend
from lemon_core.baselines import cot
from lemon_core.benchmarks import Example, get
from lemon_core.evaluate import evaluate, looped_agents, truncated_agents
from lemon_core.executor import ExecutionCache, execute_specs
from lemon_core.pool import load_pool


def test_repeating_tail_finds_the_shortest_period_of_a_long_enough_loop() -> None:
    assert repeating_tail([1, 2, 5, 7, 9, 5, 7, 9, 5, 7, 9], repeats=3, min_tokens=9) == 3
    assert repeating_tail([5, 7, 9, 5, 7, 9], repeats=3, min_tokens=6) is None  # seen twice, not three times
    assert repeating_tail([4] * 12, repeats=4, min_tokens=8) == 2  # p=1 covers 4 < 8 tokens; p=2 covers 8
    assert repeating_tail([3, 3, 3, 3], repeats=4, min_tokens=32) is None  # `1 1 1 1` in an answer is no loop
    assert repeating_tail(list(range(40)), repeats=2, min_tokens=2) is None
    assert repeating_tail([], repeats=4, min_tokens=32) is None


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _cycle_picker(cycle: Sequence[int], lead: Sequence[int]) -> object:
    """A stand-in for the sampler's token choice (``_pick_rows``): each row writes ``lead`` and then ``cycle``
    forever, the way SmolLM2 repeats ``The answer is 12.`` until the cap. The model still runs every step."""
    streams: dict[int, Iterator[int]] = {}

    def pick_rows(
        logits: torch.Tensor, requests: Sequence[GenerationRequest], generators: Sequence[torch.Generator]
    ) -> list[int]:
        picks = []
        for generator in generators:  # one generator per row of the batch
            stream = streams.setdefault(id(generator), iter(list(lead) + list(cycle) * 1000))
            picks.append(next(stream))
        return picks

    return pick_rows


def test_a_greedy_loop_is_stopped_and_marked_while_a_sampled_row_runs_to_its_cap(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = TransformersBackend(str(model_dir), loop_stop_repeats=4, loop_stop_min_tokens=32)
    cycle, lead = [40, 41, 42, 43, 44, 45, 46, 47, 48], [60, 61, 62]  # period 9, like `The answer is 12.\n\n`
    assert not set(cycle + lead) & backend.eos_ids
    monkeypatch.setattr(transformers_backend, "_pick_rows", _cycle_picker(cycle, lead))
    greedy = GenerationRequest.chat(None, "What is 2 + 3?", max_tokens=120)
    sampled = GenerationRequest.chat(None, "What is 2 + 3?", max_tokens=120, temperature=0.7, seed=1)
    stopped, capped = backend.generate([greedy, sampled])

    # The loop is seen 4 times (36 >= 32 tokens) after the 3 lead tokens: the row ends at 3 + 36 tokens.
    assert stopped.looped and stopped.completion_tokens == 3 + 4 * 9  # no end-of-turn token counted
    expected = backend.tokenizer.decode(lead + cycle * 4, skip_special_tokens=True)
    assert stopped.text == expected
    assert not capped.looped and capped.completion_tokens == 120  # sampling can leave a loop: never stopped

    looping = lead + cycle * 4
    assert backend.loop_stop.ends(greedy, looping)
    spec_request = GenerationRequest(greedy.messages, 120, grammar=object())  # a spec is left to its parser
    assert not backend.loop_stop.ends(spec_request, looping)

    off = TransformersBackend(str(model_dir), loop_stop_repeats=0)
    monkeypatch.setattr(transformers_backend, "_pick_rows", _cycle_picker(cycle, lead))
    [uncut] = off.generate([greedy])
    assert not uncut.looped and uncut.completion_tokens == 120


def test_loop_stop_settings_are_checked(model_dir: Path) -> None:
    with pytest.raises(BackendError, match="loop_stop_repeats=1"):
        TransformersBackend(str(model_dir), loop_stop_repeats=1)


class LoopingBackend:
    """Answers every request with a loop its sampler stopped (what TransformersBackend returns), or, with
    ``looping=False``, with a plain answer."""

    greedy_uses_seed = False

    def __init__(self, looping: bool = True) -> None:
        self.looping = looping

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return [Completion("The answer is 7.\n\n" * 4, prompt_tokens=50, completion_tokens=36, looped=self.looping)
                for _ in requests]

    def close(self) -> None:
        pass


def test_a_looped_answer_is_counted_as_looped_not_truncated_through_the_executor_cache_and_summary(
    tmp_path: Path,
) -> None:
    pool = load_pool("simulated")
    capped = pool.model_copy(deep=True)
    capped.levels = [lv.model_copy(update={"max_tokens": 36}) for lv in capped.levels]  # 36 = the whole cap
    capped.set_backend("small", LoopingBackend())
    examples = [Example(id=f"ma{i}", benchmark="multiarith", question=f"Ann has {i} pens and buys 4. How many?",
                        answer=str(i + 4), answer_format="Answer with a number.") for i in range(3)]
    register_examples(examples)
    summary, records = evaluate(get("multiarith"), examples, cot("small"), capped, method="cot", progress=False)
    assert summary.looped_answers == 3 and summary.truncated_answers == 0
    assert [r["looped_answers"] for r in records] == [1, 1, 1]
    assert all(r["agents"][0]["looped"] for r in records)

    # The flag survives the node cache on disk: a later stage that reuses the answer still counts it.
    cache = ExecutionCache(persist_dir=tmp_path)
    execute_specs([cot("small")], examples[:1], capped, cache=cache)
    reread = ExecutionCache(persist_dir=tmp_path)
    fresh = capped.model_copy(deep=True)
    fresh.set_backend("small", LoopingBackend(looping=False))  # would answer without the flag: a cache miss shows
    [trace] = execute_specs([cot("small")], examples[:1], fresh, cache=reread)
    assert trace.agents[0].cached and trace.agents[0].looped
    assert looped_agents(trace) == 1 and truncated_agents(trace, fresh) == 0

    # An answer that used the whole cap without looping is still truncated.
    plain = execute_specs([cot("small")], examples[:1], pool.model_copy(deep=True))[0]
    plain.agents[0].completion_tokens = 10_000
    assert truncated_agents(plain, pool) == 1 and looped_agents(plain) == 0


def test_vllm_marks_a_greedy_answer_that_ran_to_its_cap_in_a_loop() -> None:
    """vLLM decodes the batch itself, so a loop runs to the cap; the backend marks it ``looped`` afterwards."""
    from types import SimpleNamespace

    from lemon_core.backends.vllm_backend import VLLMBackend, _completion

    rule = LoopStop(repeats=4, min_tokens=32)  # no engine: only the output conversion is exercised
    looping = [60, 61] + [40, 41, 42, 43, 44, 45, 46, 47, 48] * 6

    def output(finish: str, ids: list[int]) -> SimpleNamespace:
        return SimpleNamespace(prompt_token_ids=[1, 2, 3],
                               outputs=[SimpleNamespace(text="x", token_ids=ids, finish_reason=finish)])

    greedy = GenerationRequest.chat(None, "What is 2 + 3?", max_tokens=len(looping))
    sampled = GenerationRequest.chat(None, "What is 2 + 3?", max_tokens=len(looping), temperature=0.7)
    marked = _completion(output("length", looping), 0.1, greedy, rule)
    assert marked.looped and marked.completion_tokens == len(looping)  # every generated token is still paid
    assert not _completion(output("stop", looping), 0.1, greedy, rule).looped  # it ended by itself
    assert not _completion(output("length", looping), 0.1, sampled, rule).looped
    assert not _completion(output("length", list(range(56))), 0.1, greedy, rule).looped  # cut off, no loop
    with pytest.raises(BackendError, match="loop_stop_min_tokens=0"):
        VLLMBackend("smollm2-135m-instruct", loop_stop_min_tokens=0)  # checked before vLLM is imported
