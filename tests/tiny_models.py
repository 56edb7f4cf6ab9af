"""Build tiny chat models offline for tests: no hub, a few seconds on a laptop CPU.

The model is real (a Qwen2 or Llama architecture that transformers *and* vLLM load) but has random
weights, so its text is gibberish; tests use it for plumbing that must not depend on model quality:
padding, batching, token counting, seeding, checkpoints, gradient steps.
"""

from __future__ import annotations

from pathlib import Path

IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

# ChatML, as SmolLM2/Qwen2.5 use: the backend's chat-template path is exercised for real.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = """\
An orchestrator writes a plan: a planner splits the task, a solver works each step, a verifier checks
the answer and an aggregator writes the final reply. Each agent has a role, a duty and a capacity.
Question: what is 12 + 30? Answer with a number. The answer is 42.
Janet has 3 apples and buys 5 more; she now has 8 apples. If a train travels 60 miles per hour for
2 hours it covers 120 miles. def add(a, b):\n    return a + b\nprint(add(2, 3))
The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } : ; , . ? !
You are a helpful assistant. Think step by step, then give the final answer.
"""


def build_tiny_chat_model(
    path: str | Path,
    seed: int = 0,
    arch: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    vocab_size: int = 384,
    kv_heads: int = 1,
    whole_words: tuple[str, ...] = (),
) -> Path:
    """Train a byte-level BPE tokenizer, build a random-weight causal LM, save both to ``path``.

    Returns ``path``, loadable with ``AutoTokenizer``/``AutoModelForCausalLM.from_pretrained`` and by
    vLLM. ``arch`` is ``qwen2`` or ``llama``. Attention heads are of size 64 (``hidden_size // 64`` of them)
    because vLLM's CPU attention kernels only accept common head sizes (64 is one); ``kv_heads`` key/value
    heads are shared by them (grouped-query attention). Same ``seed`` -> same weights.

    ``whole_words``: words (with their leading space, e.g. ``" large"``) the tokenizer must write as ONE token each,
    as real tokenizers write common words: the tokenizer is trained on a corpus that repeats them, and a word that
    still splits raises ``ValueError``. Without them a word like ``large`` is a run of character tokens shared with
    all other text (bench/credit.py says why that matters there).
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        AutoModelForCausalLM,
        GenerationConfig,
        LlamaConfig,
        PreTrainedTokenizerFast,
        Qwen2Config,
    )

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # each whole word repeated often enough that its merges come before the corpus's own
    repeated = [("".join(whole_words) + "\n") * 8] * 64 if whole_words else []
    bpe.train_from_iterator(_CORPUS.splitlines() * 4 + repeated, trainer=trainer)
    split = [w for w in whole_words if len(bpe.encode(w).ids) != 1]
    if split:
        raise ValueError(f"whole_words {split} still take several tokens at vocab_size={vocab_size}: raise it")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=None, eos_token=IM_END, pad_token=EOT, unk_token=EOT
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=max(1, hidden_size // 64),
        num_key_value_heads=kv_heads,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        initializer_range=0.3,  # large random weights: varied (not all-newline) greedy text
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    if arch == "qwen2":
        config = Qwen2Config(**common)
    elif arch == "llama":
        config = LlamaConfig(**common)
    else:
        raise ValueError(f"arch={arch!r}: use 'qwen2' or 'llama'")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    return out
