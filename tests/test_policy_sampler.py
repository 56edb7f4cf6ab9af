"""The policy's sampler seam and the JSON spec format it enables.

* ``spec_format: json``: specs render as JSON that ``parse_spec`` reads back exactly, match
  ``spec_json_schema`` (which rejects what it can: unknown capacity, extra fields), and prompt and
  SFT targets follow the format.
* ``OrchestratorPolicy.sample`` with a ``CompletionSampler``: the ids come from the sampler (here a
  scripted test double, ``ScriptedSampler``); cutting at end-of-turn, text, offsets and old logprobs
  are the policy's own. The real vLLM sampler is exercised by tests/vllm_cpu_sampler_smoke.py.
* ``export_weights``: what a sampler loads is a plain HF folder with the policy's exact function,
  LoRA adapters merged in - and the live LoRA policy is left unmerged.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import jsonschema
import pytest
import torch

from lemon_core.baselines import BASELINES, baseline_spec
from lemon_core.config import RolloutConfig, SFTConfig, VLLMSamplerConfig
from lemon_core.policy import OrchestratorPolicy, orchestrator_messages, spec_completion
from lemon_core.pool import load_pool
from lemon_core.rollout import attach_sampler, parse_completion
from lemon_core.sft import sft_pairs
from lemon_core.spec import render_spec_json, spec_json_schema
from lemon_core.spec_text import parse_spec

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import build_tiny_chat_model  # noqa: E402

POOL = load_pool("simulated")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture
def policy(model_dir: Path) -> OrchestratorPolicy:
    return OrchestratorPolicy.load(str(model_dir), include_roles=False, include_format=False)


# --- JSON specs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("method", sorted(BASELINES))
def test_json_spec_round_trips_and_matches_the_schema(method: str) -> None:
    spec = baseline_spec(method, "large", cheapest="small")
    text = render_spec_json(spec)
    parsed = parse_spec(text, POOL)
    assert parsed.spec == spec
    for agent in spec.agents:  # spans point at the values inside the JSON text
        assert parsed.span_text(agent.id, "capacity") == agent.capacity
        assert parsed.span_text(agent.id, "duty") == json.dumps(agent.duty, ensure_ascii=False)[1:-1]
    jsonschema.validate(json.loads(text), spec_json_schema(POOL.level_names))


def test_schema_rejects_unknown_capacity_extra_fields_and_missing_fields() -> None:
    schema = spec_json_schema(POOL.level_names)
    good = json.loads(render_spec_json(baseline_spec("cot", "small")))
    bad_level = json.loads(json.dumps(good))
    bad_level["agents"][0]["capacity"] = "huge"
    extra = json.loads(json.dumps(good))
    extra["agents"][0]["temperature"] = 0.2
    missing = json.loads(json.dumps(good))
    del missing["agents"][0]["base_role"]
    bad_id = json.loads(json.dumps(good))
    bad_id["agents"][0]["id"] = "a 1"
    for doc in (bad_level, extra, missing, bad_id):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema)


def test_json_prompt_and_sft_targets_follow_spec_format() -> None:
    user = orchestrator_messages("What is 2 + 3?", POOL, spec_format="json")[1]["content"]
    assert "```yaml" not in user and "JSON object" in user
    example = user[user.index("{") : user.rindex("}") + 1]
    assert parse_spec(example, POOL).spec.agents[0].capacity == "small"
    pairs = sft_pairs(["What is 2 + 3?", "Add 4 and 5."], POOL, SFTConfig(), seed=0, spec_format="json")
    for _, completion in pairs:
        assert completion.lstrip().startswith("{")
        parsed, error = parse_completion(completion, POOL)
        assert error is None and parsed is not None
        jsonschema.validate(json.loads(completion), spec_json_schema(POOL.level_names))
    assert spec_completion(baseline_spec("cot", "small"), "yaml").startswith("```yaml\n")
    with pytest.raises(ValueError, match="spec_format='xml'"):
        spec_completion(baseline_spec("cot", "small"), "xml")  # type: ignore[arg-type]


# --- the sampler seam -----------------------------------------------------------------------------
class ScriptedSampler:
    """Test double of ``CompletionSampler``: returns scripted token rows and records each call."""

    def __init__(self, rows: list[list[int]], accepts_lora_adapters: bool = False) -> None:
        self.rows, self.calls, self.loaded = rows, [], []
        self.accepts_lora_adapters = accepts_lora_adapters

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seeds: Sequence[int],
        stop_ids: Sequence[int],
    ) -> list[list[int]]:
        self.calls.append(dict(n=len(prompts), seeds=list(seeds), stop_ids=list(stop_ids), max=max_new_tokens))
        return [row[:max_new_tokens] for row in self.rows[: len(prompts)]]

    def load_weights(self, model_dir: str) -> None:
        self.loaded.append(model_dir)

    def close(self) -> None:
        pass


def test_sample_takes_ids_from_the_sampler_and_computes_the_rest_itself(policy: OrchestratorPolicy) -> None:
    eos = policy.eos_ids[0]
    word = policy.tokenizer("capacity: small", add_special_tokens=False)["input_ids"]
    rows = [word + [eos] + word, word[:2], word + [eos], word]  # stop mid-row; never stops; ...
    policy.sampler = ScriptedSampler(rows)
    prompts = [policy.prompt_ids("What is 2 + 3?", POOL), policy.prompt_ids("Add 4 and 5.", POOL)]
    groups = policy.sample(prompts, 2, max_new_tokens=len(word) + 3, temperature=0.7, seed=11, batch_size=1)
    call = policy.sampler.calls[0]
    assert len(policy.sampler.calls) == 1 and call["n"] == 4  # one call for the whole batch, not batch_size
    assert call["seeds"] == [11, 12, 13, 14] and call["stop_ids"] == policy.eos_ids
    flat = [s for g in groups for s in g]
    assert [s.completion_ids for s in flat] == [word + [eos], word[:2], word + [eos], word]
    assert [s.finished for s in flat] == [True, False, True, False]
    assert flat[0].text == "capacity: small" and flat[0].offsets[-1] == (15, 15)
    expected = policy.logprobs([p for p in prompts for _ in range(2)], [s.completion_ids for s in flat], 0.7)
    for s, lp in zip(flat, expected, strict=True):
        assert s.old_logprobs == pytest.approx(lp, abs=1e-5)  # chunked log-probs: fp32 sums in another order
    policy.sampler = None


def test_sync_sampler_hands_over_an_exported_folder(policy: OrchestratorPolicy, tmp_path: Path) -> None:
    sampler = ScriptedSampler([])
    policy.sync_sampler(tmp_path / "sampler-weights")  # no sampler: nothing is written
    assert not (tmp_path / "sampler-weights").exists()
    policy.sampler = sampler
    policy.sync_sampler(tmp_path / "sampler-weights")
    assert sampler.loaded == [str(tmp_path / "sampler-weights")]
    assert (tmp_path / "sampler-weights" / "model.safetensors").exists()


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_export_weights_full_model_reloads_identically(policy: OrchestratorPolicy, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([policy.prompt_ids("What is 2 + 3?", POOL)])
    out = policy.export_weights(tmp_path / "w")
    assert not (tmp_path / "w.tmp").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(_logits(reloaded, ids), _logits(policy.model, ids), rtol=0, atol=1e-6)


def test_export_weights_merges_lora_and_leaves_the_policy_unmerged(
    policy: OrchestratorPolicy, tmp_path: Path
) -> None:
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    policy.model = peft.get_peft_model(
        policy.model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # lora_B starts at zero; make the adapters change the function
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    ids = torch.tensor([policy.prompt_ids("What is 2 + 3?", POOL)])
    with_adapters = _logits(policy.model, ids)
    with policy.model.disable_adapter():
        base = _logits(policy.model, ids)
    assert (with_adapters - base).abs().max() > 0.05  # the adapters matter, so the test can fail

    out = policy.export_weights(tmp_path / "merged")
    assert not (out / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out)  # plain transformers, no peft
    torch.testing.assert_close(_logits(merged, ids), with_adapters, rtol=0, atol=5e-4)  # merge rounding
    torch.testing.assert_close(_logits(policy.model, ids), with_adapters, rtol=0, atol=1e-6)  # unmerged again
    with policy.model.disable_adapter():
        torch.testing.assert_close(_logits(policy.model, ids), base, rtol=0, atol=1e-6)


def _lora(policy: OrchestratorPolicy, model_dir: Path) -> None:
    """Wrap ``policy`` in LoRA adapters that change its function (lora_B starts at zero)."""
    from lemon_core.config import LoraSettings
    from lemon_core.lora import apply_lora as _apply_lora

    pytest.importorskip("peft")
    _apply_lora(policy, LoraSettings(enabled=True, r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
                base=str(model_dir))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


@pytest.mark.parametrize("takes_adapters", [True, False])
def test_sync_sampler_hands_a_lora_policy_over_as_adapter_or_merged(
    policy: OrchestratorPolicy, model_dir: Path, tmp_path: Path, takes_adapters: bool
) -> None:
    from transformers import AutoModelForCausalLM

    _lora(policy, model_dir)
    policy.sampler = ScriptedSampler([], accepts_lora_adapters=takes_adapters)
    policy.sync_sampler(tmp_path / "w")
    assert policy.sampler.loaded == [str(tmp_path / "w")]
    ids = torch.tensor([policy.prompt_ids("What is 2 + 3?", POOL)])
    handed = AutoModelForCausalLM.from_pretrained(tmp_path / "w")  # an adapter folder loads its base + adapter
    torch.testing.assert_close(_logits(handed, ids), _logits(policy.model, ids), rtol=0, atol=5e-4)
    files = {f.name for f in (tmp_path / "w").iterdir()}
    if takes_adapters:  # just the adapter: a few KB here, a few MB for a 7B, instead of the whole model
        assert {"adapter_config.json", "adapter_model.safetensors"} <= files and "model.safetensors" not in files
        size = sum(f.stat().st_size for f in (tmp_path / "w").iterdir())
        assert size < (model_dir / "model.safetensors").stat().st_size / 5
    else:
        assert "model.safetensors" in files and "adapter_config.json" not in files


# --- configuration errors -------------------------------------------------------------------------
def test_guided_json_with_yaml_specs_is_a_clear_config_error(policy: OrchestratorPolicy) -> None:
    cfg = RolloutConfig(sampler="vllm", vllm=VLLMSamplerConfig(guided_json=True))
    with pytest.raises(ValueError, match="spec_format: json"):
        attach_sampler(policy, "unused", cfg, POOL)


def test_vllm_sampler_without_vllm_installed_says_how_to_fix(policy: OrchestratorPolicy) -> None:
    pytest.importorskip("transformers")
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm is installed here; the missing-package message cannot be tested")
    with pytest.raises(RuntimeError, match="pip install vllm"):
        attach_sampler(policy, "unused", RolloutConfig(sampler="vllm"), POOL)
    attach_sampler(policy, "unused", RolloutConfig(), POOL)
    assert policy.sampler is None


# --- the training loop keeps the sampler on the current weights -----------------------------------
class FolderSampler:
    """Test double of a vLLM-like sampler: a separate model loaded from the folder it is handed (at
    attach and at every ``load_weights``), generating with transformers. If the trainer handed over
    stale or wrong weights, this sampler's model would differ from the policy's."""

    def __init__(self, model_dir: str, accepts_lora_adapters: bool = False) -> None:
        self.accepts_lora_adapters = accepts_lora_adapters
        self.loaded: list[str] = []
        self.generate_calls = 0
        self.closed = False
        self._load(model_dir)

    def _load(self, model_dir: str) -> None:
        self.policy = OrchestratorPolicy.load(model_dir)

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                 seeds: Sequence[int], stop_ids: Sequence[int]) -> list[list[int]]:
        self.generate_calls += 1
        return self.policy._generate([list(p) for p in prompts], max_new_tokens, temperature, top_p, seeds[0])

    def load_weights(self, model_dir: str) -> None:
        self.loaded.append(model_dir)
        self._load(model_dir)

    def close(self) -> None:
        self.closed = True


def test_train_hands_the_sampler_the_updated_weights_after_every_step(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    import lemon_core.train as train_module
    from lemon_core.train import TrainConfig, train

    attached: list[FolderSampler] = []

    def attach(policy: OrchestratorPolicy, weights: str, cfg: RolloutConfig, pool: object, seed: int = 0) -> None:
        assert cfg.sampler == "vllm"
        policy.sampler = FolderSampler(weights)
        attached.append(policy.sampler)

    real_update = train_module.grpo_update

    def update_that_moves(policy: OrchestratorPolicy, *args: object, **kwargs: object) -> dict[str, float]:
        metrics = real_update(policy, *args, **kwargs)  # a tiny policy's specs are all invalid: zero gradient
        with torch.no_grad():  # so move the weights on purpose: the sampler must see every change
            for p in policy.model.parameters():
                p.add_(0.01)
        return metrics

    monkeypatch.setattr(train_module, "attach_sampler", attach)
    monkeypatch.setattr(train_module, "grpo_update", update_that_moves)
    cfg = TrainConfig.from_yaml("train-tiny", model=str(model_dir), out=str(tmp_path / "run"), progress=False)
    cfg = cfg.model_copy(update={"iterations": 2, "rollout": cfg.rollout.model_copy(update={"sampler": "vllm"})})
    result = train(cfg)
    assert result.steps == 2 and len(attached) == 1
    sampler = attached[0]
    assert sampler.loaded == [str(tmp_path / "run" / "sampler-weights-rank0")] * 2  # once per update
    assert sampler.generate_calls >= 3 and sampler.closed  # 2 rollout steps + the final eval
    final = load_file(tmp_path / "run" / "checkpoints" / "ckpt-000002" / "model.safetensors")
    sft = load_file(tmp_path / "run" / "sft-model" / "model.safetensors")
    held = sampler.policy.model.state_dict()
    assert any(not torch.equal(final[k], sft[k]) for k in final)  # training moved the weights
    for k, v in final.items():
        torch.testing.assert_close(held[k], v, rtol=0, atol=0)


def test_train_config_rejects_guided_json_with_yaml_specs() -> None:
    from lemon_core.train import TrainConfig

    with pytest.raises(ValueError, match="spec_format: json"):
        TrainConfig(rollout=RolloutConfig(sampler="vllm", vllm=VLLMSamplerConfig(guided_json=True)))
    guided = RolloutConfig(sampler="vllm", vllm=VLLMSamplerConfig(guided_json=True))
    ok = TrainConfig(spec_format="json", rollout=guided)
    assert ok.rollout.vllm.guided_json


def test_train_with_lora_hands_the_sampler_the_base_once_then_adapters(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("peft")
    import lemon_core.train as train_module
    from lemon_core.train import TrainConfig, train

    attached: list[tuple[FolderSampler, str, int | None]] = []

    def attach(policy: OrchestratorPolicy, weights: str, cfg: RolloutConfig, pool: object, seed: int = 0,
               max_lora_rank: int | None = None) -> None:
        policy.sampler = FolderSampler(weights, accepts_lora_adapters=max_lora_rank is not None)
        attached.append((policy.sampler, weights, max_lora_rank))

    real_update = train_module.grpo_update

    def update_that_moves(policy: OrchestratorPolicy, *args: object, **kwargs: object) -> dict[str, float]:
        metrics = real_update(policy, *args, **kwargs)
        with torch.no_grad():  # move the adapters on purpose (the tiny policy's gradient is zero)
            for name, p in policy.model.named_parameters():
                if "lora_" in name:
                    p.add_(0.05)
        return metrics

    monkeypatch.setattr(train_module, "attach_sampler", attach)
    monkeypatch.setattr(train_module, "grpo_update", update_that_moves)
    cfg = TrainConfig.from_yaml("train-tiny", model=str(model_dir), out=str(tmp_path / "run"), progress=False)
    cfg = cfg.model_copy(update={
        "iterations": 2, "rollout": cfg.rollout.model_copy(update={"sampler": "vllm"}),
        "lora": cfg.lora.model_copy(update={"enabled": True, "r": 4, "alpha": 8}),
    })  # fmt: skip
    train(cfg)
    (sampler, base, rank), = attached
    assert base == str(tmp_path / "run" / "sft-model") and rank == 4  # the frozen base, LoRA on
    weights = str(tmp_path / "run" / "sampler-weights-rank0")
    assert sampler.loaded == [weights] * 3  # the starting adapter, then one per update
    assert (Path(weights) / "adapter_config.json").exists() and not (Path(weights) / "model.safetensors").exists()
    final = OrchestratorPolicy.load(str(tmp_path / "run" / "checkpoints" / "ckpt-000002"))
    ids = torch.tensor([final.prompt_ids("What is 2 + 3?", POOL)])
    torch.testing.assert_close(_logits(sampler.policy.model, ids), _logits(final.model, ids), rtol=0, atol=1e-5)
    first = OrchestratorPolicy.load(str(tmp_path / "run" / "sft-model"))
    assert (_logits(first.model, ids) - _logits(final.model, ids)).abs().max() > 1e-2  # the adapters moved
