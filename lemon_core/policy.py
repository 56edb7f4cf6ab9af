"""The orchestrator policy: an HF causal LM that samples specs with logprobs.

Its prompt is ``prompts.orchestrator_messages`` (every prompt of lemon lives in ``prompts.py``).

``spec_format`` picks the spec's written form: ``yaml`` (default, a ```yaml block) or ``json`` (a bare
JSON object, which YAML also reads, so spans and parsing are unchanged). JSON is what a sampler can be
constrained to with a JSON schema (``vllm_sampler.py``); prompt, SFT targets and sampler follow the
same setting.

``OrchestratorPolicy.sample`` returns, per completion, the sampled token ids, the text and the
per-token log-probabilities under the policy at sampling time. Token ids come from the policy's own
``generate`` (transformers, the CPU default) or from ``policy.sampler``, any ``CompletionSampler``
such as vLLM on GPU; everything after the ids - cutting at end-of-turn, decoding, offsets, logprobs -
is shared, so both paths produce identical records. The "old" logprobs are recomputed with one
forward pass (``logprobs.sequence_logprobs``) at the same temperature the loss uses, instead of being read
off the sampler's scores: the sampler may truncate (top_p) or run elsewhere (vLLM), while the PPO
ratio needs exactly log pi_old under the loss's convention.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from lemon_core.backends.shared_prefix import shared_prefix_layout, shared_prefix_length
from lemon_core.logprobs import offsets_from_token_ids, sequence_logprobs
from lemon_core.lora import merged_lora_state
from lemon_core.pool import CapacityPool
from lemon_core.prompts import (  # noqa: F401 - re-exported: the policy's prompt is part of its API
    SPEC_FORMATS,
    PromptSettings,
    SpecFormat,
    _check_format,
    orchestrator_messages,
    spec_completion,
    write_prompt_settings,
)
from lemon_core.spec import OrchestrationSpec
from lemon_core.storage import atomic_path


class CompletionSampler(Protocol):
    """Something other than the policy's own ``generate`` that samples completions (e.g. vLLM).

    ``generate`` gets flat prompt token ids and one seed per prompt and returns, per prompt, the new
    token ids - ending with the stop token when it stopped on one of ``stop_ids``. ``load_weights``
    points it at a plain HF model folder holding the policy's current weights (``export_weights``),
    or, when ``accepts_lora_adapters`` is true and the policy is LoRA, at its adapter folder.
    """

    accepts_lora_adapters: bool

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seeds: Sequence[int],
        stop_ids: Sequence[int],
    ) -> list[list[int]]: ...

    def load_weights(self, model_dir: str) -> None: ...

    def close(self) -> None: ...


@dataclass
class Sample:
    """One sampled completion. ``offsets[t]`` are the char offsets of token t in ``text``."""

    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    old_logprobs: list[float]
    offsets: list[tuple[int, int]]
    finished: bool  # ended with an end-of-turn token (else cut at max_new_tokens)


def pack(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
) -> tuple[Tensor, Tensor, int]:
    """Prompts left-padded to a common width, completions right-padded after them.

    Returns (input_ids, attention_mask, completion_start): the layout ``logprobs.sequence_logprobs``
    expects; the completion mask is ``attention_mask[:, completion_start:]``.
    """
    prompt_ids, prompt_mask = shared_prefix_layout(prompts, 0, pad_id)  # prefix 0: plain left padding
    width = prompt_ids.shape[1]
    length = width + max(max(len(c) for c in completions), 1)
    ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), length), dtype=torch.long)
    ids[:, :width], mask[:, :width] = prompt_ids, prompt_mask
    for row, (_, c) in enumerate(zip(prompts, completions, strict=True)):
        if c:
            ids[row, width : width + len(c)] = torch.tensor(list(c), dtype=torch.long)
            mask[row, width : width + len(c)] = 1
    return ids, mask, width


class OrchestratorPolicy:
    """An HF causal LM + tokenizer that writes orchestration specs.

    ``model`` may be a local folder, a ``lemon models`` alias or an HF id (resolved by
    ``lemon_core.models.resolve_model``). The tokenizer must be fast (offsets) and have a chat template.
    """

    # FSDP (lemon_core/fsdp.py) sets this: every decoding step is then a collective, so ``generate`` keeps
    # stepping (synced_gpus) until every rank's batch is done; the samples themselves do not change.
    lockstep: bool = False

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str = "cpu",
        include_roles: bool = True,
        include_format: bool = True,
        spec_format: SpecFormat = "yaml",
        sampler: CompletionSampler | None = None,
    ) -> None:
        _check_format(spec_format)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the orchestrator tokenizer has no chat template; give it one (tokenizer.chat_template)"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.include_roles = include_roles
        self.include_format = include_format
        self.spec_format: SpecFormat = spec_format
        self.sampler = sampler  # None: sample with the model's own generate
        self.grammar: Any = None  # a grammar.SpecGrammar: the own generate writes only specs (see constrain)
        self.logprob_mode: str = "logits"  # logprobs.sequence_logprobs: chunked; "hidden" for big vocabularies
        self.logprob_chunk_tokens = 256
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos.update([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or []))
        if not eos:
            raise ValueError("the orchestrator tokenizer has no eos token; set tokenizer.eos_token")
        self.eos_ids = sorted(eos)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    @classmethod
    def load(
        cls,
        name_or_path: str,
        device: str = "cpu",
        dtype: str = "float32",
        include_roles: bool = True,
        include_format: bool = True,
        spec_format: SpecFormat = "yaml",
    ) -> OrchestratorPolicy:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from lemon_core.models import ModelError, resolve_model

        dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        if dtype not in dtypes:
            raise ValueError(f"dtype={dtype!r}: use one of {sorted(dtypes)}")
        path = resolve_model(name_or_path)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtypes[dtype]).to(device)
        except (OSError, ValueError) as e:  # not found offline, or not even a valid HF id
            raise ModelError(
                f"cannot load the orchestrator model {name_or_path!r}: it is not a local folder, not an embedded "
                f"alias (`lemon models list`), and loading it as a Hugging Face id failed ({str(e).splitlines()[0]})"
            ) from None
        return cls(
            model,
            tokenizer,
            device=device,
            include_roles=include_roles,
            include_format=include_format,
            spec_format=spec_format,
        )

    # --- prompts ----------------------------------------------------------------------------------
    @property
    def prompt_settings(self) -> PromptSettings:
        """How this policy is prompted; saved beside its weights (checkpoint.save_model_dir)."""
        return PromptSettings.of(self)

    def prompt_ids(self, question: str, pool: CapacityPool) -> list[int]:
        msgs = orchestrator_messages(question, pool, self.include_roles, self.include_format, self.spec_format)
        ids = self.tokenizer.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    def spec_completion(self, spec: OrchestrationSpec) -> str:
        """The SFT target for ``spec`` in this policy's ``spec_format``."""
        return spec_completion(spec, self.spec_format)

    def completion_ids(self, text: str) -> list[int]:
        """Token ids of a target completion (SFT): the text, then the end-of-turn token."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.eos_ids[0]]

    # --- sampling ---------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        batch_size: int = 16,
        with_logprobs: bool = True,
        on_batch: Callable[[list[Sample]], None] | None = None,
    ) -> list[list[Sample]]:
        """``n`` completions per prompt (result[i][j] = j-th sample of prompt i), seeded.

        temperature 0 means greedy. Old logprobs use ``temperature`` (1 when greedy), the same
        convention ``logprobs`` uses in the loss. ``with_logprobs=False`` skips that forward pass over
        prompt + completion (evaluation and the valid-rate check never train on the samples) and leaves
        ``Sample.logprobs`` empty. ``on_batch`` gets each batch's samples as soon as they are done (progress
        on a CPU, where one batch takes minutes).
        """
        if n < 1 or max_new_tokens < 1:
            raise ValueError(f"n={n} and max_new_tokens={max_new_tokens} must both be >= 1")
        flat = [list(p) for p in prompts for _ in range(n)]
        out: list[Sample] = []
        was_training = self.model.training
        self.model.eval()
        step = batch_size if self.sampler is None else len(flat)  # a sampler like vLLM schedules itself
        for lo in range(0, len(flat), step):
            batch = flat[lo : lo + step]
            if self.sampler is not None:
                new = self.sampler.generate(
                    batch, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                    seeds=[seed + lo + i for i in range(len(batch))], stop_ids=self.eos_ids,
                )  # fmt: skip
            else:
                new = self._generate(batch, max_new_tokens, temperature, top_p, seed + lo)
            done = self._to_samples(batch, new, temperature, batch_size, with_logprobs)
            out.extend(done)
            if on_batch is not None:
                on_batch(done)
        self.model.train(was_training)
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _generate(
        self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float, seed: int
    ) -> list[list[int]]:
        """New token ids per prompt from the model's own ``generate`` (seeded per batch).

        The prompts' shared prefix (every orchestrator prompt is the same up to its task) is run once and
        its cache copied to every row (``shared_prefix_layout``); on a CPU that prefill was a third of a
        batch's time. Under FSDP (``lockstep``) every rank must run the same forwards, so there it is off.
        """
        prefix_len = 0 if self.lockstep else shared_prefix_length(prompts)
        ids, mask = shared_prefix_layout(prompts, prefix_len, self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        greedy = temperature <= 0
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new_tokens,
            do_sample=not greedy,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids,
            synced_gpus=self.lockstep,
        )
        if not greedy:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
        if self.grammar is not None:  # masks only: the old log-probs below stay the unconstrained policy's
            from transformers import LogitsProcessorList

            from lemon_core.grammar import SpecLogitsProcessor

            proc = SpecLogitsProcessor(self.tokenizer, self.grammar, len(prompts), eos_ids=self.eos_ids)
            kwargs["logits_processor"] = LogitsProcessorList([proc])
        if prefix_len:
            kwargs["past_key_values"] = self._prefix_cache(ids[:1, :prefix_len], len(prompts))
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(seed)
            generated = self.model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        return generated[:, ids.shape[1]:].tolist()

    def _prefix_cache(self, prefix_ids: Tensor, rows: int) -> Any:
        """The KV cache of one run over ``prefix_ids`` ([1, P]), repeated for ``rows`` rows."""
        cache = self.model(input_ids=prefix_ids, use_cache=True, logits_to_keep=1).past_key_values
        cache.batch_repeat_interleave(rows)
        return cache

    def _to_samples(self, prompts: list[list[int]], new: list[list[int]], temperature: float,
                    batch_size: int = 16, with_logprobs: bool = True) -> list[Sample]:
        """Cut each row after its first end-of-turn token, then decode, take offsets and old logprobs
        (``batch_size`` rows per forward pass: a sampler like vLLM returns the whole batch at once)."""
        greedy = temperature <= 0
        completions, finished = [], []
        for row in new:
            cut = next((t for t, tok in enumerate(row) if tok in self.eos_ids), None)
            completions.append(row if cut is None else row[: cut + 1])
            finished.append(cut is not None)
        t = 1.0 if greedy else temperature
        if with_logprobs:
            old = [lp for lo in range(0, len(prompts), batch_size)
                   for lp in self.logprobs(prompts[lo : lo + batch_size], completions[lo : lo + batch_size], t)]
        else:
            old = [[] for _ in prompts]
        samples = []
        for p, c, lp, done in zip(prompts, completions, old, finished, strict=True):
            body = c[:-1] if done else c  # the end-of-turn token is trained on but is not spec text
            text = self.tokenizer.decode(body, skip_special_tokens=False)
            offsets = offsets_from_token_ids(self.tokenizer, body) + (
                [(len(text), len(text))] if done else []
            )
            samples.append(Sample(p, c, text, lp, offsets, done))
        return samples

    # --- scoring ----------------------------------------------------------------------------------
    def logprobs(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        temperature: float = 1.0,
        grad: bool = False,
    ) -> list[list[float]]:
        """Per-token log pi(completion token | prefix), as plain lists (no grad)."""
        ctx = nullcontext() if grad else torch.no_grad()
        with ctx:
            lp, mask = self.logprob_tensor(prompts, completions, temperature)
        return [row[: int(m.sum())].tolist() for row, m in zip(lp.float().cpu(), mask.cpu(), strict=True)]

    def logprob_tensor(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        temperature: float = 1.0,
        model: Any = None,
    ) -> tuple[Tensor, Tensor]:
        """([B, T] logprobs of the completion tokens, [B, T] mask) under ``model`` (default: the policy)."""
        ids, mask, start = pack(prompts, completions, self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        lp = sequence_logprobs(model if model is not None else self.model, ids, mask, start, temperature,
                               mode=self.logprob_mode, chunk_tokens=self.logprob_chunk_tokens)
        return lp, mask[:, start:]

    # --- handing weights to a sampler -------------------------------------------------------------
    def export_weights(self, dest: str | Path) -> Path:
        """Write the current weights as a plain HF model folder (LoRA adapters merged in), atomically.

        This is what a ``CompletionSampler`` such as vLLM loads: it knows nothing of peft, so for a
        LoRA policy each adapted weight is written as W + ΔW (peft's ``get_delta_weight``) under the base
        name, computed out of place: merging into the live model and unmerging would leave float
        rounding in the frozen base - which is also the KL reference - every iteration.
        """
        final = Path(dest)
        with atomic_path(final, directory=True) as tmp:
            if hasattr(self.model, "get_base_model"):  # a peft model
                base = self.model.get_base_model()
                base.save_pretrained(tmp, state_dict=merged_lora_state(base), safe_serialization=True)
            else:
                self.model.save_pretrained(tmp, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
            write_prompt_settings(tmp, self.prompt_settings)
        return final

    def export_adapter(self, dest: str | Path) -> Path:
        """Write a LoRA policy's adapter (``adapter_config.json`` + weights, a few MB) and tokenizer,
        atomically."""
        if not hasattr(self.model, "peft_config"):
            raise ValueError("export_adapter needs a LoRA (peft) policy; use export_weights for a full model")
        final = Path(dest)
        with atomic_path(final, directory=True) as tmp:
            self.model.save_pretrained(tmp, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)  # self-contained, like a checkpoint: loads with transformers too
            write_prompt_settings(tmp, self.prompt_settings)
        return final

    def sync_sampler(self, model_dir: str | Path) -> None:
        """Give ``self.sampler`` the current weights (after an update), written to ``model_dir``: just
        the adapter when the policy is LoRA and the sampler takes adapters, else the full (merged)
        weights. A no-op without a sampler."""
        if self.sampler is None:
            return
        if getattr(self.sampler, "accepts_lora_adapters", False) and hasattr(self.model, "peft_config"):
            self.sampler.load_weights(str(self.export_adapter(model_dir)))
        else:
            self.sampler.load_weights(str(self.export_weights(model_dir)))
