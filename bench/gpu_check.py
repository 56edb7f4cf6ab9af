"""GPU check: the training paths that have never run on a GPU, each run once on tiny models built on the spot.

Run by ``bench/gpu_check.sh`` (which first installs lemon's few pure-Python dependencies from a wheel folder);
docs/gpu_check.md says how. Every check prints one line, ``check <name>: ok <figure>`` or
``check <name>: FAIL <why>``, and the exit status is non-zero when any failed. Each check runs in its own
``try`` under a time budget (SIGALRM), so one failure or hang does not hide the others. The same script runs
on the CPU (``--device cpu``, smaller sizes) so CI proves it is not stale.

Checks (names as printed):

* ``env``            torch/transformers versions, the device, bf16 support.
* ``sft_bf16``       ``lemon_core.sft.sft_train`` on a bf16 policy: the loss on a fixed batch must fall.
* ``grpo_bf16``      ``lemon_core.update.grpo_update`` on a bf16 policy loaded as the trainer loads it (chunked
                     log-probs, ``optim.logprob_mode: hidden``) + bf16 KL reference, with records sampled by the
                     policy itself: finite loss and gradient, weights move, on-policy PPO ratio ~ 1.
* ``fsdp_ws1``       a process group of world size 1 (NCCL on CUDA, gloo on CPU), the policy sharded with
                     the FSDP strategy, one ``grpo_update``; weights must equal the replicate update's.
* ``logprobs_152k``  completion log-probs at the Qwen2.5 vocabulary (151,936) with forward + backward: the
                     full [B, T, V] float32 log_softmax versus the chunked ``sequence_logprobs`` (modes hidden
                     and logits); peak memory of each and the max abs difference.
* ``sampler_parity`` greedy ``OrchestratorPolicy.sample`` (fp32): one prompt at a time on the CPU versus a
                     batch on the device; the same tokens (a flip at a numerical near-tie is reported, not failed).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

QWEN_VOCAB = 151_936  # Qwen2.5 tokenizer's embedding rows (config.json "vocab_size" of Qwen/Qwen2.5-*)
NEAR_TIE = 1e-4  # greedy parity: a token flip where the top-2 logits differ by less than this is float rounding


class CheckFailed(Exception):
    """A check ran but its result is wrong; the message is the ``why`` printed after FAIL."""


@dataclass
class Sizes:
    """How big each check's tensors are: large enough on a GPU to matter, small enough for CI on 2 cores."""

    hidden: int  # tiny chat model width (its vocab is the tiny tokenizer's)
    layers: int
    lp_batch: int  # logprobs_152k: rows and completion tokens; [B, T, V] fp32 = lp_batch*lp_tokens*V*4 bytes
    lp_tokens: int
    lp_chunk: int  # chunk_tokens of the chunked log-probs (lemon_core.logprobs)
    new_tokens: int  # sampled tokens per completion (GRPO records, parity)


SIZES = {
    # [B, T, V] fp32: 4.7 GB on a GPU, 58 MB on the CPU
    "cuda": Sizes(hidden=128, layers=2, lp_batch=8, lp_tokens=960, lp_chunk=256, new_tokens=32),
    "cpu": Sizes(hidden=64, layers=2, lp_batch=2, lp_tokens=48, lp_chunk=16, new_tokens=12),
}


@dataclass
class Context:
    device: str
    sizes: Sizes
    model_dir: Path


# --- helpers --------------------------------------------------------------------------------------
@contextlib.contextmanager
def time_budget(seconds: int) -> Iterator[None]:
    """Raise TimeoutError in the main thread after ``seconds`` (checked between Python bytecodes)."""

    def fire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"over its {seconds} s budget")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _rss_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise CheckFailed(f"/proc/self/status has no {field}")


class PeakMemory:
    """Peak memory of a block above what was held when it started: CUDA allocator on a GPU, process RSS on
    the CPU (torch's CPU tensors are invisible to tracemalloc). RSS is sampled every millisecond by a thread,
    so on the CPU the figure is approximate; the CUDA one is exact."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        else:
            self._base = self._high = _rss_bytes("VmRSS")
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._high = max(self._high, _rss_bytes("VmRSS"))
            time.sleep(0.001)

    def __exit__(self, *exc: Any) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self._base
        else:
            self._stop.set()
            self._thread.join()
            self._high = max(self._high, _rss_bytes("VmRSS"))
            self.peak = self._high - self._base


def mib(n: float) -> str:
    return f"{n / 2**20:.0f}MiB"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tiny_policy(ctx: Context, dtype: str = "float32", device: str | None = None) -> Any:
    """The tiny chat model as an OrchestratorPolicy; short prompts (no role list / format) keep it fast."""
    from lemon_core.policy import OrchestratorPolicy

    return OrchestratorPolicy.load(str(ctx.model_dir), device or ctx.device, dtype, include_roles=False,
                                   include_format=False)


def trainer_policy(cfg: Any, ctx: Context) -> Any:
    """The policy as ``lemon train`` loads it (dtype, prompt settings and log-prob mode from ``cfg``)."""
    from lemon_core.train import load_policy

    return load_policy(cfg, str(ctx.model_dir))


def questions(n: int) -> list[str]:
    return [f"Janet has {3 + i} apples and buys {5 * i + 1} more. How many apples does she have?" for i in range(n)]


def sampled_records(policy: Any, ctx: Context, groups: int = 2, per_group: int = 4) -> list[Any]:
    """Rollout records sampled by ``policy`` itself (so old log-probs are on-policy), with fixed rewards
    that differ inside each group (every group gets a non-zero advantage)."""
    from lemon_core.pool import load_pool
    from lemon_core.reward import RewardTerms
    from lemon_core.rollout import RolloutRecord

    pool = load_pool("cpu")
    prompts = [policy.prompt_ids(q, pool) for q in questions(groups)]
    samples = policy.sample(prompts, per_group, max_new_tokens=ctx.sizes.new_tokens, temperature=1.0, seed=7)
    rewards = [1.0, 0.0, 0.5, -1.0]
    return [
        RolloutRecord(step=1, task_id=f"t{g}", benchmark="check", sample=j, prompt_ids=s.prompt_ids,
                      completion_ids=s.completion_ids, old_logprobs=s.old_logprobs, offsets=s.offsets,
                      temperature=1.0, text=s.text, valid=True, truncated=False,
                      reward=RewardTerms(total=rewards[j % len(rewards)]))
        for g, group in enumerate(samples)
        for j, s in enumerate(group)
    ]


def weights(model: Any) -> dict[str, torch.Tensor]:
    """Every parameter in full on the CPU (gathered when FSDP-sharded)."""
    from lemon_core import fsdp

    if fsdp.is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v.detach().float().cpu() for k, v in full.items()}
    return {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}


def max_change(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    return max(float((after[k] - before[k]).abs().max()) for k in before)


# --- the checks -----------------------------------------------------------------------------------
def check_env(ctx: Context) -> str:
    import transformers

    where = ctx.device
    if ctx.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise CheckFailed("--device cuda but torch.cuda.is_available() is False (CPU-only torch or no driver)")
        where = f"{torch.cuda.get_device_name()} cuda={torch.version.cuda} bf16={torch.cuda.is_bf16_supported()}"
    return f"torch={torch.__version__} transformers={transformers.__version__} device={where}"


def check_sft_bf16(ctx: Context) -> str:
    """sft_train on a fixed batch (batch size = number of pairs): the loss must fall over the steps."""
    from lemon_core.config import SFTConfig
    from lemon_core.pool import load_pool
    from lemon_core.sft import sft_pairs, sft_train

    policy = tiny_policy(ctx, "bfloat16")
    pool = load_pool("cpu")
    cfg = SFTConfig(steps=4, batch_size=2, lr=3e-3)
    pairs = sft_pairs(questions(2), pool, cfg, seed=0)
    sync(ctx.device)
    t0 = time.perf_counter()
    with PeakMemory(ctx.device) as mem:
        losses = sft_train(policy, pairs, pool, cfg, seed=0)
    sync(ctx.device)
    step_s = (time.perf_counter() - t0) / cfg.steps
    dtype = next(policy.model.parameters()).dtype
    if dtype != torch.bfloat16:
        raise CheckFailed(f"policy loaded as {dtype}, not bfloat16")
    if not all(math.isfinite(x) for x in losses):
        raise CheckFailed(f"non-finite SFT loss: {losses}")
    if not losses[-1] < losses[0]:
        raise CheckFailed(f"loss did not fall on a fixed batch: {losses[0]:.3f} -> {losses[-1]:.3f}")
    return (f"loss {losses[0]:.3f}->{losses[-1]:.3f} in {cfg.steps} steps, {step_s * 1000:.0f}ms/step, "
            f"peak {mib(mem.peak)}")


def check_grpo_bf16(ctx: Context) -> str:
    """One grpo_update (bf16 policy + bf16 KL reference, AdamW) on records the policy sampled itself."""
    from lemon_core.config import TrainConfig
    from lemon_core.update import grpo_update

    cfg = TrainConfig(device=ctx.device, dtype="bfloat16", include_roles=False, include_format=False,
                      grpo={"kl_coef": 0.04}, optim={"micro_batch_size": 4, "logprob_mode": "hidden"})
    policy = trainer_policy(cfg, ctx)
    ref = tiny_policy(ctx, "bfloat16").model.eval().requires_grad_(False)
    records = sampled_records(policy, ctx)
    optimizer = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    before = weights(policy.model)
    with PeakMemory(ctx.device) as mem:
        m = grpo_update(policy, ref, records, optimizer, scheduler, cfg)
    moved = max_change(before, weights(policy.model))
    bad = [k for k in ("loss", "grad_norm") if not torch.isfinite(torch.tensor(m[k]))]
    if bad:
        raise CheckFailed(f"non-finite {bad}: {m}")
    if m["grad_norm"] <= 0 or moved == 0:
        raise CheckFailed(f"no update: grad_norm={m['grad_norm']} max weight change={moved}")
    if abs(m["ratio/mean"] - 1.0) > 0.05:  # sampled by this very policy: new/old log-probs must agree
        raise CheckFailed(f"on-policy ratio/mean={m['ratio/mean']:.4f}, expected ~1 (sampling and training "
                          "log-probs disagree)")
    return (f"logprob_mode={policy.logprob_mode} loss {m['loss']:.2e} grad_norm {m['grad_norm']:.3f} "
            f"ratio {m['ratio/mean']:.4f} kl {m.get('kl', 0):.2e} "
            f"{m['update_tokens_per_s']:.0f} tok/s, peak {mib(mem.peak)}")


@contextlib.contextmanager
def process_group(device: str) -> Iterator[str]:
    """A torch.distributed group of world size 1 (NCCL for CUDA, gloo for CPU) on a free loopback port."""
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device).index or 0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    torch.distributed.init_process_group(backend, rank=0, world_size=1)
    try:
        yield backend
    finally:
        torch.distributed.destroy_process_group()
        for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
            os.environ.pop(key, None)


def check_fsdp_ws1(ctx: Context) -> str:
    """grpo_update through the FSDP strategy (world size 1) vs the replicate strategy: the same weights."""
    from lemon_core.config import TrainConfig
    from lemon_core.dist import FSDP, Replicate
    from lemon_core.update import grpo_update

    records = sampled_records(tiny_policy(ctx, "float32"), ctx)
    cfg = TrainConfig(device=ctx.device, dtype="float32", grpo={"kl_coef": 0.04}, optim={"micro_batch_size": 3},
                      distributed={"strategy": "fsdp"})

    def update(strategy: Any) -> tuple[dict[str, torch.Tensor], float]:
        load_on = "cpu" if strategy.sharded else ctx.device  # FSDP moves each shard to the device itself
        policy = tiny_policy(ctx, "float32", device=load_on)
        ref = tiny_policy(ctx, "float32", device=load_on).model.eval().requires_grad_(False)
        strategy.prepare(policy, ref)
        optimizer = torch.optim.SGD([p for p in policy.model.parameters() if p.requires_grad], lr=0.05)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        m = grpo_update(policy, ref, records, optimizer, scheduler, cfg, strategy=strategy)
        return weights(policy.model), m["loss"]

    with process_group(ctx.device) as backend:
        replicate, loss_r = update(Replicate())
        sharded, loss_f = update(FSDP(ctx.device, reshard_after_forward=True, gather_for_sampling=True))
    start = weights(tiny_policy(ctx, "float32", device="cpu").model)
    diff = max_change(replicate, sharded)
    moved = max_change(start, replicate)
    if moved == 0:
        raise CheckFailed("the replicate update did not change the weights")
    if diff > 1e-4 * max(1.0, moved):
        raise CheckFailed(f"FSDP weights differ from replicate by {diff:.2e} (update size {moved:.2e})")
    return (f"{backend} world=1 max|w_fsdp - w_replicate|={diff:.2e} (update {moved:.2e}) "
            f"loss {loss_f:.2e} vs {loss_r:.2e}")


def chunked_variants(chunk_tokens: int) -> dict[str, Callable[..., torch.Tensor]]:
    """The chunked ``lemon_core.logprobs.sequence_logprobs`` in both modes when that module exists; else the
    log-probs the trainer used before it (``lemon_core.grpo.sequence_logprobs``), so the check still runs."""
    try:
        from lemon_core.logprobs import sequence_logprobs
    except ImportError:
        from lemon_core.grpo import sequence_logprobs as grpo_logprobs

        return {"grpo(no lemon_core.logprobs)": grpo_logprobs}

    def mode(name: str) -> Callable[..., torch.Tensor]:
        return lambda *args: sequence_logprobs(*args, mode=name, chunk_tokens=chunk_tokens)

    return {"hidden": mode("hidden"), "logits": mode("logits")}


def full_softmax_logprobs(model: Any, ids: torch.Tensor, mask: torch.Tensor, start: int) -> torch.Tensor:
    """The unchunked definition: log_softmax over the whole [B, T, V] float32 logits, then gather."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, start - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, start:].unsqueeze(-1)).squeeze(-1)


def check_logprobs_152k(ctx: Context) -> str:
    """Completion log-probs + backward at V = 151,936 on a tiny-width model: full log_softmax vs chunked."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    s = ctx.sizes
    config = Qwen2Config(vocab_size=QWEN_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(ctx.device)
    prompt = 16
    ids = torch.randint(0, QWEN_VOCAB, (s.lp_batch, prompt + s.lp_tokens), device=ctx.device)
    mask = torch.ones_like(ids)

    def run(fn: Callable[..., torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int]:
        model.zero_grad(set_to_none=True)
        with PeakMemory(ctx.device) as mem:
            lp = fn(model, ids, mask, prompt)
            lp.sum().backward()
        grad = model.lm_head.weight.grad.detach().clone()
        return lp.detach(), grad, mem.peak

    chunked = {name: run(fn) for name, fn in chunked_variants(s.lp_chunk).items()}  # before full: a cold RSS
    lp_f, grad_f, peak_f = run(full_softmax_logprobs)
    diff = max(float((lp - lp_f).abs().max()) for lp, _, _ in chunked.values())
    grad_diff = max(float((g - grad_f).abs().max()) for _, g, _ in chunked.values())
    peaks = " ".join(f"{name} {mib(peak)}" for name, (_, _, peak) in chunked.items())
    bvt = s.lp_batch * s.lp_tokens * QWEN_VOCAB * 4
    figure = (f"B={s.lp_batch} T={s.lp_tokens} V={QWEN_VOCAB} chunk={s.lp_chunk} ([B,T,V] fp32 {mib(bvt)}): "
              f"peak full {mib(peak_f)}, chunked {peaks}; max|dlogp|={diff:.2e} max|dgrad_head|={grad_diff:.2e}")
    if diff > 1e-3 or grad_diff > 1e-3:
        raise CheckFailed(f"chunked and full log-probs disagree: {figure}")
    if ctx.device.startswith("cuda") and "hidden" in chunked and chunked["hidden"][2] >= peak_f / 2:
        raise CheckFailed(f"chunked (hidden) log-probs saved less than half the peak memory: {figure}")
    return figure


def check_sampler_parity(ctx: Context) -> str:
    """Greedy samples: CPU one prompt at a time (the reference) vs a left-padded batch on the device."""
    from lemon_core.pool import load_pool

    pool = load_pool("cpu")
    ref = tiny_policy(ctx, "float32", device="cpu")
    dev = tiny_policy(ctx, "float32")
    prompts = [ref.prompt_ids(q, pool) for q in questions(4)]
    prompts[1] = prompts[1][:-7] + prompts[1][-3:]  # uneven lengths: exercise the left padding
    n_new = ctx.sizes.new_tokens * 2
    alone = [ref.sample([p], 1, max_new_tokens=n_new, temperature=0.0)[0][0].completion_ids for p in prompts]
    batch = [g[0].completion_ids for g in dev.sample(prompts, 1, max_new_tokens=n_new, temperature=0.0)]
    same = sum(a == b for a, b in zip(alone, batch, strict=True))
    ties = []
    for p, a, b in zip(prompts, alone, batch, strict=True):
        if a == b:
            continue
        t = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        with torch.no_grad():
            logits = ref.model(input_ids=torch.tensor([p + a[:t]])).logits[0, -1].float()
        top2 = logits.topk(2).values
        margin = float(top2[0] - top2[1])
        if margin >= NEAR_TIE:
            raise CheckFailed(f"prompt {prompts.index(p)}: tokens differ at position {t} ({a[t:t + 3]} vs "
                              f"{b[t:t + 3]}) where the CPU top-2 logit margin is {margin:.2e}, not a near-tie")
        ties.append(margin)
    tokens = sum(map(len, alone))
    note = f", {len(ties)} flip(s) at near-ties (margins {ties})" if ties else ""
    return f"{same}/{len(prompts)} identical greedy completions ({tokens} tokens) cpu x1 vs {ctx.device} batch{note}"


CHECKS: dict[str, Callable[[Context], str]] = {
    "env": check_env,
    "sft_bf16": check_sft_bf16,
    "grpo_bf16": check_grpo_bf16,
    "fsdp_ws1": check_fsdp_ws1,
    "logprobs_152k": check_logprobs_152k,
    "sampler_parity": check_sampler_parity,
}


def quiet_transformers() -> None:
    """No progress bars or load reports: the output is one line per check."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def run_check(name: str, fn: Callable[[Context], str], ctx: Context, budget_s: int) -> bool:
    """Run one check, print its line; True when it passed. Exceptions become a FAIL line, never a crash."""
    t0 = time.perf_counter()
    try:
        with time_budget(budget_s):
            figure = fn(ctx)
        line, ok = f"ok {figure}", True
    except CheckFailed as e:
        line, ok = f"FAIL {e}", False
    except Exception as e:  # noqa: BLE001 - any error is this check's failure; the next checks still run
        first = (str(e).splitlines() or [""])[0][:300]
        line, ok = f"FAIL {type(e).__name__}: {first}", False
    print(f"check {name}: {line} [{time.perf_counter() - t0:.1f}s]", flush=True)
    if ctx.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--only", nargs="*", choices=sorted(CHECKS), help="run only these checks")
    ap.add_argument("--budget-s", type=int, default=90, help="time budget of each check, seconds")
    args = ap.parse_args(argv)
    if not (args.device == "cpu" or args.device.startswith("cuda")):
        ap.error(f"--device {args.device!r}: use cuda, cuda:N or cpu")
    torch.manual_seed(0)
    quiet_transformers()
    if args.device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from tiny_models import build_tiny_chat_model

    sizes = SIZES["cpu" if args.device == "cpu" else "cuda"]
    names = args.only or list(CHECKS)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lemon-gpu-check-") as tmp:
        model_dir = build_tiny_chat_model(Path(tmp) / "tiny", seed=0, hidden_size=sizes.hidden,
                                          num_layers=sizes.layers)
        ctx = Context(args.device, sizes, model_dir)
        results = [run_check(n, CHECKS[n], ctx, args.budget_s) for n in names]
    failed = results.count(False)
    print(f"gpu_check: {len(results) - failed}/{len(results)} ok on {args.device} in {time.perf_counter() - t0:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
