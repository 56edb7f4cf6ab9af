"""In-process transformers backend: the CPU default, one padded forward pass per batch.

Prompts are rendered with the tokenizer's chat template and LEFT-padded, so every row's last prompt
token sits in the same column and new tokens are appended in lock-step; with the attention mask and
position ids derived from it, a padded row generates exactly what it would alone (greedy).

Sampling is reproducible per request: each row draws from its own ``torch.Generator`` seeded with
``request.seed`` (or the backend seed), so a request's text does not depend on which other requests
shared its batch. That is why the decoding loop is written here instead of calling ``model.generate``,
whose sampling uses one global RNG stream for the whole batch.

On CPU a decoding step is mostly matrix products; what else it costs is kept small by four pieces, each in
its own file with its measurements: linear layers packed for oneDNN (``packed_linear.py``), a forward pass of
its own for Llama and Qwen2 models with fused projections and no per-layer module overhead (``fused_decoder.py``;
other models run transformers' forward with a KV cache that reserves room for the whole answer,
``kv_cache.py``) and glibc keeping freed activation memory (``cpu_allocator.py``). With the fused forward, the
prompt pass runs the batch's shared prompt prefix once (``shared_prefix.py``), and a batch whose rows all decode
greedily without a grammar (the CPU pool's agents) gets each row's pick from a bf16 screen of the output head
rescored in fp32, not from fp32 logits over the whole vocabulary (``screened_argmax.py``: the same picks, the
head in about half the time). ``bench/engines.py`` compares the result with vLLM's CPU build.

A greedy agent row that has fallen into an exact loop (the same run of tokens ``loop_stop_repeats`` times in
a row, ``loop_stop_min_tokens`` tokens at least: ``base.LoopStop``) is stopped there and its
completion marked ``looped``: under greedy decoding such a loop runs to the level's token cap (on the CPU pool
all 23 of SmolLM2's 60 capped MultiArith CoT answers were ``The answer is 12.`` repeated), so a larger cap buys
nothing and the tokens until the cap are wasted decode steps for the whole batch. The evaluation counts those
answers apart (``looped_answers``) from answers cut off mid-reasoning (``truncated_answers``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from lemon_core.backends.base import STOPPED, BackendError, Completion, GenerationRequest, LoopStop
from lemon_core.backends.cpu_allocator import keep_heap_pad
from lemon_core.backends.fused_decoder import FusedDecoder, fused_decoder_refusal, token_positions
from lemon_core.backends.kv_cache import reserved_kv_cache
from lemon_core.backends.packed_linear import pack_linear_layers, packing_available
from lemon_core.backends.screened_argmax import bf16_products_native, bf16_products_run
from lemon_core.backends.shared_prefix import shared_prefix_layout, shared_prefix_length

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TransformersBackend:
    """Generate with a local causal LM. ``model``: local path, `lemon models` alias, or HF id.

    ``self.model`` and ``self.tokenizer`` stay public. With the fused forward (``self.decoder``, the default for
    fp32 on CPU) generation runs on the decoder's own copies of the weights, made at construction: a change to
    ``self.model``'s weights afterwards does not reach what this backend writes. The model keeps its dense
    weights beside those copies; for a checkpoint stored in fp32 (both models of the CPU pool) they are clean
    pages of the mmapped file, for one stored in bf16 and loaded in fp32 a second copy in memory.
    """

    greedy_uses_seed = False  # a greedy answer is the same for every seed (CapacityPool.greedy_uses_seed)

    def __init__(
        self,
        model: str,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
        max_batch_size: int = 16,
        num_threads: int | None = None,
        packed_weights: bool | None = None,
        fused_forward: bool | None = None,
        screened_argmax: bool | None = None,
        loop_stop_repeats: int = LoopStop.repeats,
        loop_stop_min_tokens: int = LoopStop.min_tokens,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from lemon_core.lora import is_lora_checkpoint
        from lemon_core.models import ModelError, resolve_model

        if dtype not in _DTYPES:
            raise BackendError(f"dtype={dtype!r} is not supported; use one of {sorted(_DTYPES)}")
        if max_batch_size < 1:
            raise BackendError(f"max_batch_size={max_batch_size} must be >= 1")
        self.loop_stop = LoopStop(loop_stop_repeats, loop_stop_min_tokens)
        if num_threads is not None:
            # Process-wide. On a busy small machine, fewer intra-op threads than cores avoids OpenMP
            # threads spinning against each other (measured 5x faster decoding with 1 thread of 2 here).
            torch.set_num_threads(num_threads)
        try:
            self.model_path = resolve_model(model)
        except ModelError as e:
            raise BackendError(str(e)) from e
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            if is_lora_checkpoint(self.model_path):  # adapters folded in: plain layers that can be packed or fused
                self.model = self._load_lora(model, dtype)
            else:
                self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=_DTYPES[dtype])
        except (OSError, ValueError) as e:
            raise BackendError(f"cannot load model {model!r} (resolved to {self.model_path!r}): {e}") from e
        self.model.to(device).eval()
        # On CPU, keep freed activation memory in the heap instead of re-faulting it every batch
        # (cpu_allocator.py: prefill of 32 prompts 5.0-8.0 s -> 4.7 s). Process-wide; a no-op off glibc.
        if torch.device(device).type == "cpu":
            keep_heap_pad()
        # None: pack where it helps (fp32 on CPU); see packed_linear.py for the measured speed-up.
        if packed_weights is None:
            packed_weights = packing_available(torch.device(device), _DTYPES[dtype])
        elif packed_weights and not packing_available(torch.device(device), _DTYPES[dtype]):
            raise BackendError(
                f"packed_weights=true needs an fp32 model on a CPU with oneDNN (got device={device!r}, "
                f"dtype={dtype!r}); drop the option or set it to false"
            )
        # None: lemon's own forward (fused_decoder.py) for fp32 on CPU, where it was measured (bench/engines.py),
        # when the architecture allows it; true forces it on any device and dtype (its tests: fp32 on CPU).
        refusal = fused_decoder_refusal(self.model)
        if fused_forward is None:
            fused_forward = torch.device(device).type == "cpu" and dtype == "float32" and refusal is None
        elif fused_forward and refusal is not None:
            raise BackendError(f"fused_forward=true cannot run model {model!r}: {refusal}; drop the option")
        # None: greedy batches pick their tokens through a bf16 screen of the output head (screened_argmax.py)
        # where it runs (the fused forward, an fp32 model on CPU) and the CPU has bf16 instructions, where it was
        # measured faster; true also takes oneDNN's emulated bf16 products on other AVX-512 CPUs.
        screen_refusal = _screen_refusal(bool(fused_forward), torch.device(device), dtype)
        if screened_argmax is None:
            screened_argmax = screen_refusal is None and bf16_products_native()
        elif screened_argmax and screen_refusal is not None:
            raise BackendError(f"screened_argmax=true {screen_refusal}; drop the option")
        # The fused forward holds its own (packed) projections; transformers' forward packs the model's layers.
        self.decoder = (
            FusedDecoder(self.model, pack=packed_weights, screen=screened_argmax) if fused_forward else None
        )
        if self.decoder is not None:
            self.packed_linear_layers = self.decoder.packed_layers
        else:
            self.packed_linear_layers = pack_linear_layers(self.model) if packed_weights else 0
        if not getattr(self.tokenizer, "chat_template", None):
            raise BackendError(
                f"model {model!r} has no chat template; give its tokenizer one (tokenizer.chat_template)"
            )
        self.device = torch.device(device)
        self.seed = seed
        self.max_batch_size = max_batch_size
        self.eos_ids = _eos_ids(self.tokenizer, self.model)
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = next(iter(self.eos_ids)) if self.eos_ids else 0

    def _load_lora(self, model: str, dtype: str) -> Any:
        """A LoRA checkpoint (adapter only) with its adapter folded into its base's weights."""
        from lemon_core.lora import load_merged_lora

        try:
            return load_merged_lora(self.model_path, dtype=_DTYPES[dtype])
        except RuntimeError as e:  # peft is missing (an extra: lemon[dev] or pip install peft)
            raise BackendError(
                f"model {model!r} is a LoRA checkpoint (adapter_config.json in {self.model_path}); loading it "
                f"needs peft: pip install peft==0.21.2"
            ) from e

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out: list[Completion] = []
        for i in range(0, len(requests), self.max_batch_size):
            chunk = list(requests[i : i + self.max_batch_size])
            if all(r.stopped for r in chunk):  # nobody waits for these any more
                out.extend(Completion("", error=STOPPED) for _ in chunk)
                continue
            try:
                out.extend(self._generate_batch(chunk))
            except Exception as e:  # a broken batch must not crash the executor: fail its rows
                out.extend(Completion("", error=f"{type(e).__name__}: {e}") for _ in chunk)
        return out

    def close(self) -> None:
        """Weights are dropped with the object; nothing else to release."""

    # --- internals ----------------------------------------------------------------------------
    def _grammar_processor(self, requests: Sequence[GenerationRequest]) -> Any:
        """A ``grammar.SpecLogitsProcessor`` when the batch's requests carry grammars (all of them must)."""
        grammars = [r.grammar for r in requests]
        if all(g is None for g in grammars):
            return None
        if any(g is None for g in grammars):
            raise BackendError("a batch mixes requests with and without a grammar; send them separately")
        from lemon_core.grammar import SpecLogitsProcessor

        return SpecLogitsProcessor(self.tokenizer, grammars, len(requests), eos_ids=sorted(self.eos_ids))

    def encode(self, request: GenerationRequest) -> list[int]:
        """Prompt token ids: the chat template with the assistant turn opened."""
        ids = self.tokenizer.apply_chat_template(
            request.openai_messages(), add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # some tokenizers return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    @torch.no_grad()
    def _generate_batch(self, requests: list[GenerationRequest]) -> list[Completion]:
        t0 = time.perf_counter()
        prompts = [self.encode(r) for r in requests]
        # The fused forward runs the prompts' shared prefix (the system turn, when the rows share one or the chat
        # template adds a default one) once for the batch; transformers' forward (models the fused one does not
        # cover) runs every row's whole prompt.
        prefix_len = shared_prefix_length(prompts) if self.decoder is not None else 0
        input_ids, attention = shared_prefix_layout(prompts, prefix_len, self.pad_id)
        n, width = input_ids.shape
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        generators = [_generator(r.seed if r.seed is not None else self.seed) for r in requests]
        new_tokens: list[list[int]] = [[] for _ in requests]
        ended_by: list[str] = ["length"] * n  # "eos", "loop", "stopped" or "length" (the request's max_tokens)
        grammar, seq = self._grammar_processor(requests), input_ids
        in_batch = list(range(n))  # the request of each row of the running batch (and of the KV cache)

        longest = max(r.max_tokens for r in requests)
        forward = self.decoder or _TransformersForward(self.model)
        room, step_ids = forward.new_room(n, width + longest), input_ids
        if self.decoder is not None and prefix_len and longest > 0:
            self.decoder.prefill_shared(input_ids[:1, :prefix_len], room)
            step_ids = input_ids[:, prefix_len:]
        # A batch of greedy rows without grammars needs only each row's argmax, not the logits
        # (FusedDecoder.greedy_tokens may find it without computing them all).
        greedy_only = grammar is None and all(r.temperature <= 0 for r in requests)
        for _ in range(longest):
            if greedy_only:
                picks = forward.greedy_tokens(step_ids, attention, room).tolist()
            else:
                logits = forward.logits(step_ids, attention, room).float()
                if grammar is not None:  # masks what the row's spec grammar forbids next
                    logits = grammar(seq, logits)
                picks = _pick_rows(logits, [requests[row] for row in in_batch],
                                   [generators[row] for row in in_batch])
            going = []  # batch rows that write another token
            for i, (row, tok) in enumerate(zip(in_batch, picks, strict=True)):
                if requests[row].max_tokens <= 0:
                    continue
                if requests[row].stopped:  # its answer is no longer wanted: the row leaves the batch now
                    ended_by[row] = "stopped"
                    continue
                if tok in self.eos_ids:
                    ended_by[row] = "eos"
                    continue
                new_tokens[row].append(tok)
                if self.loop_stop.ends(requests[row], new_tokens[row]):
                    ended_by[row] = "loop"
                    continue
                if len(new_tokens[row]) < requests[row].max_tokens:
                    going.append(i)
            if not going:
                break
            if len(going) < len(in_batch):
                # Finished rows leave the batch: a step costs per row, and one batch's answers differ in
                # length (a batch of CoT answers would otherwise run to its longest at full width).
                keep = torch.tensor(going, dtype=torch.long)
                room.batch_select_indices(keep.to(self.device))
                attention, seq = attention[keep.to(self.device)], seq[keep]
                if grammar is not None:
                    grammar.keep_rows(going)
                in_batch = [in_batch[i] for i in going]
            step_ids = torch.tensor([new_tokens[row][-1] for row in in_batch], dtype=torch.long,
                                    device=self.device).unsqueeze(1)
            seq = torch.cat([seq, step_ids.cpu()], 1)
            attention = torch.cat(
                [attention, torch.ones((len(in_batch), 1), dtype=torch.long, device=self.device)], 1
            )

        latency = (time.perf_counter() - t0) / n  # rows share one pass; charge each an equal share
        return [
            Completion(
                text="" if end == "stopped" else self.tokenizer.decode(toks, skip_special_tokens=True),
                prompt_tokens=len(prompt),
                completion_tokens=len(toks) + (1 if end == "eos" else 0),  # + eos
                latency_s=latency,
                looped=end == "loop",
                extra={"batch_size": n},
                error=STOPPED if end == "stopped" else None,
            )
            for prompt, toks, end in zip(prompts, new_tokens, ended_by, strict=True)
        ]


class _TransformersForward:
    """The model's own forward with the decoding loop's interface (``FusedDecoder``'s ``new_room`` and ``logits``;
    both rooms drop finished rows with ``batch_select_indices``): for the models that ``fused_decoder`` does not
    cover, and as the reference it is tested against."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def new_room(self, batch: int, capacity: int) -> Any:
        return reserved_kv_cache(self.model.config, capacity)

    def logits(self, input_ids: torch.Tensor, attention: torch.Tensor, room: Any) -> torch.Tensor:
        positions = token_positions(attention, input_ids.shape[1])
        res = self.model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, past_key_values=room,
            use_cache=True, logits_to_keep=1,  # only the last position's logits are needed: skips the vocab
        )                                      # projection for every prompt token during prefill
        return res.logits[:, -1, :]

    def greedy_tokens(self, input_ids: torch.Tensor, attention: torch.Tensor, room: Any) -> torch.Tensor:
        return self.logits(input_ids, attention, room).max(-1).indices  # the first largest, as _pick_rows


def _screen_refusal(fused_forward: bool, device: torch.device, dtype: str) -> str | None:
    """Why the bf16 screen of the output head cannot run (None when it can)."""
    if not fused_forward:
        return "needs the fused forward (fused_forward); transformers' forward computes the logits itself"
    if device.type != "cpu" or dtype != "float32":
        return f"needs an fp32 model on CPU (device={device.type!r}, dtype={dtype!r})"
    if not bf16_products_run():
        return "needs oneDNN's bf16 products, which this CPU lacks (AVX-512 or newer)"
    return None


def _generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _pick_rows(
    logits: torch.Tensor, requests: Sequence[GenerationRequest], generators: Sequence[torch.Generator]
) -> list[int]:
    """Each row's next token (-1 for a row that may write none). The greedy rows' argmax is one call for the
    whole batch (one call per row over a 152k vocabulary was 5% of a decoding step at batch 32)."""
    is_greedy = [r.temperature <= 0 for r in requests]
    # max(-1).indices is argmax (the first maximal index) at a third of argmax's time on CPU.
    greedy = logits.max(-1).indices.tolist() if any(is_greedy) else []
    return [
        -1 if r.max_tokens <= 0 else greedy[i] if is_greedy[i] else _sample(logits[i], r, g)
        for i, (r, g) in enumerate(zip(requests, generators, strict=True))
    ]


def _sample(logits: torch.Tensor, request: GenerationRequest, generator: torch.Generator) -> int:
    """Temperature + nucleus (top_p) sampling with the row's own RNG (greedy rows are picked in ``_pick_rows``)."""
    probs = torch.softmax(logits / request.temperature, dim=-1)
    if request.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < request.top_p  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def _eos_ids(tokenizer: object, model: object) -> set[int]:
    """Every id that ends a turn: tokenizer eos plus generation_config eos (Qwen lists several)."""
    ids: set[int] = set()
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if tok_eos is not None:
        ids.add(int(tok_eos))
    gen_cfg = getattr(model, "generation_config", None)
    gen_eos = getattr(gen_cfg, "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list):
        ids.update(int(i) for i in gen_eos)
    return ids
