"""The training flow: SFT warm-up, then GRPO iterations (rollout -> counterfactuals -> update).

``lemon train`` and the Kubeflow stages call the same few functions; a stage only turns URIs and
config into their arguments (``stages.py``):

    build_state(cfg, checkpoint)        policy, KL reference, optimizer, scheduler, edit sampler, RNG, step
    sft_warmup(policy, ...)             SFT on valid teacher specs; reports the valid-spec rate
    rollout_step(policy, pool, ...)     G specs per task, executed, scored, counterfactually probed
    update_step(state, records)         one GRPO update on those records
    run_iteration(state, tasks)         rollout_step + update_step, with metrics
    evaluate_orchestrator(...)          the one evaluation (lemon_core.evaluate): invalid output scores 0

``train(cfg)`` is ``lemon train --config configs/train-cpu.yaml``: load tasks, warm up, then loop over
``run_iteration`` with checkpoints and periodic evaluation, and plot the reward curve.

Exact resume. The data order is a pure function of (seed, step) and every sampling call is seeded
with (seed, step), so a run resumed from checkpoint k replays steps k+1.. exactly as an uninterrupted
run would (``checkpoint.py`` saves optimizer, scheduler, RNG states and the edit sampler).

Multi-GPU/multi-node (torchrun): every rank takes its share of the step's tasks, so every GRPO group
lives on one rank; the strategy object (``dist.py``: replicate or FSDP) reduces gradients, so the step
equals the single-process step. See docs/training.md. LoRA (``lora.py``): only adapters train; the
adapter-disabled base is the KL reference. vLLM sampling on GPU (``rollout.sampler: vllm``): an engine
per rank on the current weights, refreshed after every update (``policy.sync_sampler``).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from lemon_core.checkpoint import latest_checkpoint, restore_training_state, save_checkpoint, save_model_dir
from lemon_core.config import TrainConfig, resolve_dtype
from lemon_core.counterfactual import EditFamily, EditFamilySampler
from lemon_core.dist import Replicate, Strategy, all_gather, barrier, make_strategy, world
from lemon_core.errors import ConfigError
from lemon_core.evaluate import evaluate, write_specs
from lemon_core.lora import apply_lora
from lemon_core.models import resolve_model
from lemon_core.policy import OrchestratorPolicy
from lemon_core.pool import CapacityPool, load_pool
from lemon_core.prompts import PromptSettings, settings_for_model
from lemon_core.rollout import (
    RolloutRecord,
    RolloutStats,
    Scorer,
    attach_sampler,
    benchmark_scorer,
    collect_rollouts,
    rollout_metrics,
    write_records,
)
from lemon_core.sft import SFTReport, sft_valid_rate, sft_warmup  # noqa: F401 - the flow's SFT step
from lemon_core.storage import write_atomic
from lemon_core.update import grpo_update


# --- data order -----------------------------------------------------------------------------------
def load_tasks(cfg: Any, seed: int) -> tuple[list[Any], list[Any]]:
    """(train, held-out eval) tasks of ``cfg.data``, shuffled once with ``seed``."""
    from lemon_core.benchmarks import Example, get

    if cfg.tasks_jsonl:
        rows = [json.loads(line) for line in Path(cfg.tasks_jsonl).read_text().splitlines() if line.strip()]
        tasks = [Example.model_validate(r) for r in rows]
    else:
        tasks = [ex for name in cfg.benchmarks for ex in get(name).load(cfg.split, cfg.limit, cfg.data_dir)]
    random.Random(seed).shuffle(tasks)
    if len(tasks) <= cfg.eval_tasks:
        raise ValueError(
            f"data: {len(tasks)} tasks but eval_tasks={cfg.eval_tasks}; raise data.limit "
            "or lower data.eval_tasks"
        )
    return tasks[cfg.eval_tasks :], tasks[: cfg.eval_tasks]


def tasks_for_step(tasks: Sequence[Any], step: int, n: int, seed: int) -> list[Any]:
    """The n tasks of GRPO step ``step`` (1-based): epochs of seeded permutations, a pure function."""
    out = []
    for k in range((step - 1) * n, step * n):
        epoch, pos = divmod(k, len(tasks))
        order = list(range(len(tasks)))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        out.append(tasks[order[pos]])
    return out


def step_seed(cfg: TrainConfig, step: int, salt: int = 0) -> int:
    """The sampling seed of GRPO step ``step`` on one rank or shard (``salt``): what makes resume exact."""
    return cfg.seed * 1_000_003 + step * 7919 + salt


# --- loading --------------------------------------------------------------------------------------
def load_policy(cfg: TrainConfig, name_or_path: str, device: str | None = None,
                explicit: Collection[str] | None = None) -> OrchestratorPolicy:
    """The policy at ``name_or_path`` and its prompt settings (roles, format, spec_format), with ``cfg``'s
    dtype: every stage loads it this way, so all of them prompt it exactly as it was trained. A saved model's
    own record (``prompts.PROMPT_SETTINGS_FILE``) wins over ``cfg``'s defaults, and a setting ``cfg`` names
    that contradicts it is an error (``explicit``: the settings ``cfg`` names, default its fields set); a base
    model gets ``cfg``'s settings."""
    asked = PromptSettings.of(cfg)
    named = cfg.model_fields_set if explicit is None else explicit
    try:
        prompt = settings_for_model(resolve_model(name_or_path), asked, named, "the train config")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    policy = OrchestratorPolicy.load(
        name_or_path, device or cfg.device, resolve_dtype(cfg), prompt.include_roles, prompt.include_format,
        prompt.spec_format,
    )  # fmt: skip
    policy.logprob_mode, policy.logprob_chunk_tokens = cfg.optim.logprob_mode, cfg.optim.logprob_chunk_tokens
    return policy


def capped_pool(source: str, agent_max_tokens: int | None) -> CapacityPool:
    """The pool at ``source``, each level's answer cap lowered to ``agent_max_tokens`` (None: the pool's own)."""
    pool = load_pool(source)
    if agent_max_tokens is not None:
        pool.levels = [lv.model_copy(update={"max_tokens": min(lv.max_tokens, agent_max_tokens)})
                       for lv in pool.levels]
    return pool


def load_train_pool(cfg: TrainConfig) -> CapacityPool:
    """The training pool: ``cfg.pool`` with rollout answers capped at ``cfg.agent_max_tokens``."""
    return capped_pool(cfg.pool, cfg.agent_max_tokens)


def constrain(policy: OrchestratorPolicy, cfg: TrainConfig, levels: Sequence[str]) -> OrchestratorPolicy:
    """With ``rollout.grammar``, the policy's own sampling writes only specs over ``levels`` (grammar.py);
    SFT's valid-spec rate is measured before this, unconstrained."""
    if cfg.rollout.grammar:
        from lemon_core.grammar import spec_grammar
        from lemon_core.spec import SpecLimits

        limits = SpecLimits(max_agents=cfg.rollout.grammar_max_agents, max_role_chars=80,
                            max_duty_chars=cfg.rollout.grammar_max_duty_chars)
        policy.grammar = spec_grammar(levels, policy.spec_format, limits, sequential_ids=True)  # as it writes
    return policy


def new_edit_sampler(cfg: TrainConfig) -> EditFamilySampler:
    return EditFamilySampler(floor=cfg.rollout.edit_floor, decay=cfg.rollout.edit_decay,
                             families=cfg.rollout.edit_families)


# --- the state ------------------------------------------------------------------------------------
@dataclass
class TrainState:
    """Everything one GRPO step reads and changes."""

    cfg: TrainConfig
    policy: OrchestratorPolicy
    ref_model: Any  # None: no KL term, or LoRA (the adapter-disabled base is the reference)
    optimizer: torch.optim.Optimizer
    scheduler: Any
    edit_sampler: EditFamilySampler
    strategy: Strategy
    pool: CapacityPool
    step: int = 0
    rank: int = 0
    world_size: int = 1
    sampler_weights: Path | None = None  # where the vLLM sampler's weights are written


def build_state(
    cfg: TrainConfig, checkpoint: Path | None = None, *, base_model: str | None = None,
    reference: str | None = None, pool: CapacityPool | None = None, restore_rng: bool = True,
) -> TrainState:
    """The training state at ``checkpoint`` (or fresh at ``base_model``, default ``cfg.model``).

    ``base_model`` is where training started (the SFT model): a LoRA policy puts its adapters on it, and
    it is the KL reference unless ``reference`` says otherwise. A checkpoint holding training state
    restores optimizer, scheduler, edit sampler, step (and with ``restore_rng`` the RNG states).
    """
    rank, world_size = world(cfg.device)
    strategy = make_strategy(cfg, world_size)
    base = base_model or cfg.model
    load_device = "cpu" if strategy.sharded else cfg.device  # FSDP: only each rank's shard goes to the device
    ref_model = None
    if cfg.lora.enabled:
        policy = load_policy(cfg, base)
        adapter = checkpoint if checkpoint and (checkpoint / "adapter_config.json").exists() else None
        apply_lora(policy, cfg.lora, base=base, adapter=adapter)
    else:
        policy = load_policy(cfg, str(checkpoint) if checkpoint else base, load_device)
        if cfg.grpo.kl_coef > 0:
            ref_model = OrchestratorPolicy.load(reference or base, load_device, resolve_dtype(cfg)).model.eval()
            ref_model.requires_grad_(False)
    strategy.prepare(policy, ref_model)
    pool = pool or load_train_pool(cfg)
    constrain(policy, cfg, pool.level_names)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    warm = cfg.optim.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (warm + 1)))
    edit_sampler = new_edit_sampler(cfg)
    step = 0
    if checkpoint is not None:
        step = restore_training_state(checkpoint, policy.model, optimizer, scheduler, edit_sampler,
                                      rank=rank, world_size=world_size, rng=restore_rng)
    return TrainState(cfg, policy, ref_model, optimizer, scheduler, edit_sampler, strategy, pool, step, rank,
                      world_size)


def attach_vllm_sampler(state: TrainState, base_model: str, out: Path) -> None:
    """Sample with vLLM (``rollout.sampler: vllm``): an engine per rank on the current weights, refreshed
    after every update. A LoRA policy keeps the frozen base in vLLM and hands over only its adapter."""
    cfg, policy = state.cfg, state.policy
    if cfg.rollout.sampler == "transformers":
        return
    state.sampler_weights = out / f"sampler-weights-rank{state.rank}"
    if cfg.lora.enabled and cfg.rollout.vllm.lora_adapters:
        attach_sampler(policy, resolve_model(base_model), cfg.rollout, state.pool, cfg.seed + state.rank, cfg.lora.r)
        policy.sync_sampler(state.sampler_weights)  # the adapter as it is now (fresh, or the resumed one)
    else:
        weights = str(policy.export_weights(state.sampler_weights))
        attach_sampler(policy, weights, cfg.rollout, state.pool, seed=cfg.seed + state.rank)


def close_state(state: TrainState) -> None:
    if state.policy.sampler is not None:
        state.policy.sampler.close()
        state.policy.sampler = None
    state.pool.close()


# --- SFT ------------------------------------------------------------------------------------------
# --- one iteration --------------------------------------------------------------------------------
@dataclass
class IterationStats:
    """One GRPO step: its records (all ranks) and the metrics row written to metrics.jsonl."""

    records: list[RolloutRecord]
    stats: RolloutStats
    row: dict[str, Any] = field(default_factory=dict)


def rollout_step(policy: OrchestratorPolicy, pool: CapacityPool, cfg: TrainConfig, edit_sampler: EditFamilySampler,
                 tasks: Sequence[Any], step: int, seed: int, scorer: Scorer = benchmark_scorer, *,
                 strategy: Strategy | None = None, show_progress: bool = True,
                 ) -> tuple[list[RolloutRecord], RolloutStats]:
    """G specs per task from ``policy``, executed, scored and counterfactually probed (a rollout pod needs
    no optimizer or reference: only what sampling and the edits read)."""
    with (strategy or Replicate()).sampling(policy.model):
        return collect_rollouts(policy, tasks, pool, cfg.rollout, cfg.reward, edit_sampler, step=step, seed=seed,
                                scorer=scorer, progress=cfg.progress and show_progress)


def probe_rewards(policy: OrchestratorPolicy, pool: CapacityPool, cfg: TrainConfig, tasks: Sequence[Any],
                  scorer: Scorer = benchmark_scorer) -> dict[str, float]:
    """The mean reward of G specs sampled for each of a fixed set of probe tasks, overall and per benchmark: the
    same tasks and the same seed every step, no edits and no update, so the curve follows the policy and not the
    difficulty of the step's tasks (``probe/reward``, ``probe/reward/<benchmark>``)."""
    probe_cfg = cfg.rollout.model_copy(update={"edits_per_spec": 0})
    records, _ = collect_rollouts(policy, tasks, pool, probe_cfg, cfg.reward, new_edit_sampler(cfg), step=0,
                                  seed=cfg.seed, scorer=scorer, progress=False)
    out = {"probe/reward": statistics.fmean(r.reward.total for r in records)}
    for benchmark in sorted({r.benchmark for r in records}):
        out[f"probe/reward/{benchmark}"] = statistics.fmean(r.reward.total for r in records if r.benchmark == benchmark)
    return out


def update_step(state: TrainState, records: Sequence[RolloutRecord]) -> dict[str, float]:
    """One GRPO update on ``records`` (this rank's whole groups); the sampler then gets the new weights."""
    metrics = grpo_update(state.policy, state.ref_model, records, state.optimizer, state.scheduler, state.cfg,
                          state.strategy, progress=state.cfg.progress and state.rank == 0)
    if state.sampler_weights is not None:
        state.policy.sync_sampler(state.sampler_weights)  # the next rollouts sample from the updated weights
    return metrics


def merge_ranks(records: list[RolloutRecord], stats: RolloutStats, sampler: EditFamilySampler,
                sampler_before: dict[EditFamily, float]) -> tuple[list[RolloutRecord], RolloutStats]:
    """All ranks' records and summed stats of this step; every rank's sampler replays every |Delta|.

    Each rank's sampler only saw its own counterfactual contrasts; replaying all of them in rank order
    from the pre-rollout state leaves the same sampler on every rank (what rank 0 checkpoints is then
    what every rank resumes with), and the step's metrics cover the whole batch, not rank 0's slice.
    """
    gathered = all_gather((records, stats.model_dump()))
    sampler.mean_abs_delta = dict(sampler_before)
    merged: list[RolloutRecord] = [r for recs, _ in gathered for r in recs]
    for r in merged:
        for e in r.edits:
            sampler.update(EditFamily(e.family), e.delta)
    total = RolloutStats()
    for _, st in gathered:
        for k, v in st.items():
            setattr(total, k, getattr(total, k) + v)
    return merged, total


def run_iteration(state: TrainState, tasks: Sequence[Any], scorer: Scorer = benchmark_scorer,
                  save_to: Path | None = None) -> IterationStats:
    """One GRPO step from ``state``: rollout -> counterfactuals -> update; ``state.step`` advances."""
    state.step += 1
    t0 = time.perf_counter()
    before = dict(state.edit_sampler.mean_abs_delta)
    records, stats = rollout_step(state.policy, state.pool, state.cfg, state.edit_sampler, tasks, state.step,
                                  step_seed(state.cfg, state.step, state.rank), scorer, strategy=state.strategy,
                                  show_progress=state.rank == 0)
    t_rollout = time.perf_counter() - t0
    if save_to is not None:
        write_records(records, str(save_to / f"step-{state.step:06d}-rank{state.rank}.jsonl"))
    update = update_step(state, records)
    if state.world_size > 1:
        records, stats = merge_ranks(records, stats, state.edit_sampler, before)
    row: dict[str, Any] = {
        "step": state.step,
        **rollout_metrics(records, state.pool.level_names),
        **update,
        "agent_calls": stats.agent_calls,
        "edit_agent_calls": stats.edit_agent_calls,
        "cache_hits": stats.cache_hits,
        "time/rollout_s": t_rollout,
        "time/step_s": time.perf_counter() - t0,
    }
    return IterationStats(records, stats, row)


# --- periodic evaluation --------------------------------------------------------------------------
def evaluate_policy(state: TrainState, tasks: Sequence[Any], scorer: Scorer, seed: int) -> dict[str, float]:
    """Greedy spec per held-out task, executed and scored by ``evaluate`` (invalid specs score 0).

    Returns eval/valid_rate, eval/score, eval/reward and eval/cost. Under torchrun every rank must call
    it (a sharded policy samples collectively): the tasks are split over ranks, each rank samples the same
    number of prompts (a short share is padded with a task whose spec is dropped unexecuted), and the
    records are gathered, so every rank returns the metrics of all tasks.
    """
    if not tasks:
        return {}
    # a replicated policy is evaluated by rank 0 alone; a sharded one samples collectively, split over ranks
    rank, world_size = (state.rank, state.world_size) if state.strategy.sharded else (0, 1)
    share = list(tasks[rank::world_size])
    padded = share + [tasks[0]] * (-(-len(tasks) // world_size) - len(share))
    with state.strategy.sampling(state.policy.model):
        attempts = write_specs(state.policy, padded, state.pool, max_new_tokens=state.cfg.rollout.max_new_tokens,
                               seed=seed)[: len(share)]
    _, records = evaluate(None, share, attempts, state.pool, method="lemon", seed=seed, progress=False,
                          scorer=scorer, reward_cfg=state.cfg.reward)
    records = [r for part in all_gather(records) for r in part] if world_size > 1 else records
    costs = [r["cost"] for r in records if r["valid"]]
    return {
        "eval/valid_rate": sum(r["valid"] for r in records) / len(records),
        "eval/score": statistics.fmean(r["score"] for r in records),
        "eval/reward": statistics.fmean(r["reward"] for r in records),
        "eval/cost": statistics.fmean(costs) if costs else 0.0,
    }


# --- the run --------------------------------------------------------------------------------------
class TrainResult(BaseModel):
    out: str
    steps: int
    metrics: list[dict[str, Any]]
    valid_rate_before_sft: float | None = None
    valid_rate_after_sft: float | None = None
    seconds_per_iteration: float | None = None
    reward_curve: str | None = None


class MetricsLog:
    """metrics.jsonl writer (rank 0 only); on resume, rows past the checkpoint are dropped."""

    def __init__(self, path: Path, keep_until: int | None, enabled: bool) -> None:
        self.path, self.enabled = path, enabled
        self.rows: list[dict[str, Any]] = []
        if enabled and path.exists() and keep_until is not None:
            self.rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            self.rows = [r for r in self.rows if r.get("step", 0) <= keep_until]
            write_atomic(path, "".join(json.dumps(r) + "\n" for r in self.rows))
        elif enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.enabled:
            with self.path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")


def warm_up(cfg: TrainConfig, out: Path, train_tasks: Sequence[Any], eval_tasks: Sequence[Any],
            pool: CapacityPool, is_main: bool, resume: bool, scorer: Scorer) -> tuple[str, SFTReport | None]:
    """SFT warm-up into ``out/sft-model`` (skipped when resuming past it); returns the model GRPO starts
    from (also the KL reference) and the SFT report."""
    sft_dir = out / "sft-model"
    if not cfg.sft.enabled:
        return cfg.model, None
    if not (resume and sft_dir.exists()):
        policy = load_policy(cfg, cfg.model)
        held = [t.question for t in (eval_tasks or train_tasks)]
        report = sft_warmup(policy, cfg, pool, train_tasks, held, cfg.progress and is_main, scorer)
        if is_main:
            save_model_dir(policy, sft_dir)
            write_atomic(out / "sft.json", report.model_dump_json(indent=2))
        barrier()
        del policy
    sft_json = out / "sft.json"
    report = SFTReport.model_validate_json(sft_json.read_text()) if sft_json.exists() else None
    return str(sft_dir), report


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    examples: tuple[list[Any], list[Any]] | None = None,
    scorer: Scorer = benchmark_scorer,
    on_step: Callable[[TrainState, dict[str, Any]], None] | None = None,
) -> TrainResult:
    """SFT warm-up then ``cfg.iterations`` GRPO steps (module docstring). ``examples`` = (train, eval)
    tasks overrides ``cfg.data``; ``scorer`` overrides benchmark scoring (tests).

    ``on_step(state, row)`` runs on every rank after each GRPO step, before its metrics row is logged: what it
    adds to ``row`` is logged with the step's own figures. A research bench measures the updated policy there
    (bench/credit.py: the probability that it writes the optimal spec); the CLI and the stages pass nothing."""
    from lemon_core.backends.simulated import register_examples
    from lemon_core.progress import progress

    rank, world_size = world(cfg.device)
    is_main = rank == 0
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if is_main:
        (out / "config.json").write_text(cfg.model_dump_json(indent=2))
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    train_tasks, eval_tasks = examples if examples is not None else load_tasks(cfg.data, cfg.seed)
    pool = load_train_pool(cfg)
    if any(lv.backend == "simulated" for lv in pool.levels):
        register_examples([*train_tasks, *eval_tasks])

    start_model, sft_report = warm_up(cfg, out, train_tasks, eval_tasks, pool, is_main, resume, scorer)
    ckpt = latest_checkpoint(out) if resume else None
    state = build_state(cfg, ckpt, base_model=start_model, pool=pool)
    attach_vllm_sampler(state, start_model, out)

    log = MetricsLog(out / "metrics.jsonl", keep_until=state.step if ckpt else None, enabled=is_main)
    bar = progress(cfg.iterations - state.step, f"grpo steps {state.step + 1}-{cfg.iterations}",
                   mode=None if cfg.progress and is_main else "off")
    times = []
    while state.step < cfg.iterations:
        step_tasks = tasks_for_step(train_tasks, state.step + 1, cfg.tasks_per_iteration * world_size, cfg.seed)
        it = run_iteration(state, step_tasks[rank::world_size], scorer,
                           out / "rollouts" if cfg.save_rollouts else None)
        it.row["task_ids"] = [t.id for t in step_tasks]
        times.append(it.row["time/step_s"])
        step = state.step
        due = (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.iterations
        if due and (state.strategy.sharded or is_main):  # a sharded policy samples collectively
            it.row.update(evaluate_policy(state, eval_tasks, scorer, cfg.seed))
        if on_step is not None:
            on_step(state, it.row)
        log.write(it.row)
        bar.update(1, reward=it.row["reward/mean"], valid=it.row["valid_rate"], loss=it.row.get("loss", 0.0),
                   step_s=it.row["time/step_s"])
        if step % cfg.checkpoint_every == 0 or step == cfg.iterations:
            checkpoint_state(state, out, cfg.keep_checkpoints)
        barrier()
    bar.close()
    result = TrainResult(out=str(out), steps=state.step, metrics=log.rows,
                         seconds_per_iteration=statistics.fmean(times) if times else None)
    if sft_report is not None:
        result.valid_rate_before_sft = sft_report.valid_rate_before
        result.valid_rate_after_sft = sft_report.valid_rate_after
    if is_main and log.rows:
        from lemon_core.plots import plot_reward_curve

        result.reward_curve = str(plot_reward_curve(log.rows, out / "reward_curve.png"))
        write_atomic(out / "result.json", result.model_dump_json(indent=2, exclude={"metrics"}))
    close_state(state)
    return result


def checkpoint_state(state: TrainState, out: Path, keep: int) -> Path | None:
    """Write ``ckpt-<step>`` under ``out`` (rank 0; every rank must call: the RNG/FSDP gathers are collectives)."""
    rngs = all_gather((torch.get_rng_state(), random.getstate())) if state.world_size > 1 else None
    full = state.strategy.full_state(state.policy.model, state.optimizer)
    if state.rank != 0:
        return None
    return save_checkpoint(out, state.step, state.policy, state.optimizer, state.scheduler, state.edit_sampler,
                           keep, rngs, full)
