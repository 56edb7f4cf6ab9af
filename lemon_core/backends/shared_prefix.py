"""A batch's shared prompt prefix, laid out so that it is computed once per batch instead of once per row.

Why: the prompts of one batch often start alike. Every orchestrator prompt is the same up to its task
(``prompts.py`` puts the task last for this), and agent prompts share their system turn when their rows have
the same system prompt (one role's calls across tasks) or none and the chat template adds a default one
(Qwen2.5's default system message is 24 tokens of a ~53-token prompt in ``bench/engines.py``). Running that
prefix once and giving its keys and values to every row saves its share of the prompt pass.

Both samplers use these two functions: the orchestrator policy (``policy.OrchestratorPolicy._generate``, whose
prefix cache is copied to every row) and the agents' CPU backend (``TransformersBackend`` over
``FusedDecoder.prefill_shared``, which writes the prefix's keys and values into every row of its room).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

MIN_SHARED_PREFIX = 16  # shorter shared prefixes are not worth a forward pass of their own


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every prompt shares, leaving each prompt at least one token of its own
    (generation needs one uncached input per row); 0 when that is under ``MIN_SHARED_PREFIX``."""
    if len(prompts) < 2:
        return 0
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for other in prompts[1:]:
        n = next((i for i in range(n) if other[i] != first[i]), n)
    return n if n >= MIN_SHARED_PREFIX else 0


def shared_prefix_layout(prompts: Sequence[Sequence[int]], prefix_len: int, pad_id: int) -> tuple[Tensor, Tensor]:
    """(input_ids, attention_mask) with the shared prefix first, then each row's own tokens left-padded.

    Row i is ``prefix + [pad ...] + prompt_i[prefix_len:]``: the pads sit between the prefix and the row's
    own tokens, masked out; positions come from the mask, so every row's tokens keep their positions and the
    row attends to exactly its own prompt. With ``prefix_len=0`` this is plain left padding.
    """
    rests = [list(p[prefix_len:]) for p in prompts]
    width = max(len(r) for r in rests)
    ids = torch.full((len(rests), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rests), width), dtype=torch.long)
    for row, rest in enumerate(rests):
        ids[row, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
        mask[row, width - len(rest) :] = 1
    if prefix_len == 0:
        return ids, mask
    prefix = torch.tensor(list(prompts[0][:prefix_len]), dtype=torch.long).expand(len(prompts), -1)
    return torch.cat([prefix, ids], 1), torch.cat([torch.ones_like(prefix), mask], 1)
