"""The pipeline's stages as plain functions: what a Kubeflow component runs and ``lemon <stage>`` runs.

Each stage reads its inputs from URIs and writes its outputs to URIs under the run's artifact root
(``s3://...`` on a cluster, a local folder on a laptop) through ``lemon_core.storage``, and returns
the URIs it wrote. Nothing here knows about Kubeflow: components in ``components/`` only parse
parameters, call one of these, and hand the returned URIs on. Large things (checkpoints, shards)
therefore never pass through KFP's own artifact store, which is also why ``kfp.local`` with an
``s3://`` artifact root works.

Run layout under ``artifacts``::

    tasks/                       prepare: manifest.json + train/val/test shards
    sft/model/                   SFT warm-up model (also the KL reference) + sft.json
    iter-001/rollouts/<shard>.jsonl   one rollout shard per ParallelFor item
    iter-001/checkpoint/         GRPO checkpoint after iteration 1 (model + optimizer + sampler state)
    iter-001/train.json          update metrics of iteration 1
    eval/<benchmark>-<method>/   summary.json + traces.jsonl per (method, benchmark) cell
    report/                      report.html, report.md, pareto.png, reward_curve.png
    */metrics.prom               Prometheus text exposition beside every stage's outputs
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lemon_core import storage
from lemon_core.prepare import PrepareConfig, load_split, prepare_dataset, read_manifest, read_shard

ORCHESTRATOR = "lemon"  # method name of the trained orchestrator in evaluation rows


class StageError(RuntimeError):
    """A stage cannot run with what it was given; the message says what to fix."""


# ------------------------------------------------------------------------------------------- config


class EvalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    benchmarks: list[str] | None = Field(None, description="default: the prepared benchmarks")
    methods: list[str] = Field(
        default_factory=lambda: [ORCHESTRATOR, "cot"],
        description=f"'{ORCHESTRATOR}' (the trained orchestrator) and/or baselines",
    )
    split: str = Field("test", description="prepared split to evaluate on")
    limit: int | None = Field(None, ge=1, description="examples per benchmark")
    capacity: str | None = Field(None, description="baseline agents' level (default: the most capable)")
    batch_size: int = Field(8, ge=1)
    agent_max_tokens: int | None = Field(
        None, ge=1, description="cap on every agent's answer during evaluation (default: the pool's own "
        "max_tokens; train.agent_max_tokens caps rollouts only, so a short training cap cannot cut "
        "the evaluated answers before their final line)",
    )


class PublishSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    serving_uri: str = Field("", description="where the served model lives; '' = <artifacts>/serving")
    metric: str = Field("accuracy", description="summary field compared with the served model's")
    min_improvement: float = Field(0.0, description="publish when candidate > served + this")


class KubernetesSettings(BaseModel):
    """Cluster placement; only used when compiling/submitting, never by the stage code itself."""

    model_config = ConfigDict(extra="forbid")

    image: str = "ghcr.io/lemon-mlops/lemon:0.1.0"
    gpu_image: str = "ghcr.io/lemon-mlops/lemon-cuda:0.1.0"
    namespace: str = "kubeflow"
    accelerator_type: str = "nvidia.com/gpu"
    gpus_per_pod: int = Field(1, ge=0)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, str]] = Field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    )
    s3_secret: str | None = Field("lemon-s3", description="Secret with S3 credentials, mapped to env")
    s3_secret_keys: dict[str, str] = Field(
        default_factory=lambda: {
            "AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
            "LEMON_S3_ENDPOINT_URL": "LEMON_S3_ENDPOINT_URL",
        }
    )
    cache_pvc: str | None = Field("lemon-model-cache", description="PVC with the model cache")
    cache_mount_path: str = "/cache"
    train_nodes: int = Field(1, ge=1, description="> 1: train through a Kubeflow Trainer TrainJob")
    trainjob_timeout_s: float = Field(24 * 3600, gt=0)
    pipeline_root: str | None = Field(None, description="KFP pipeline_root (e.g. s3://bucket/kfp)")


class PipelineConfig(BaseModel):
    """One YAML file drives a whole pipeline run (``configs/local-cpu.yaml``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = "lemon"
    artifacts: str = Field("runs/lemon", description="run artifact root: a folder, file:// or s3:// URI")
    simulated_pool: bool = Field(False, description="must be true to use the SIMULATED pool (tests only)")
    n_iterations: int = Field(1, ge=0, le=50, description="GRPO iterations, unrolled at compile time")
    rollout_shards: int | None = Field(
        None, ge=1, description="train shards used per iteration (default all)"
    )
    tasks_per_shard: int = Field(2, ge=1, description="tasks each rollout pod takes from its shard")
    rollout_parallelism: int = Field(1, ge=1, description="rollout pods at once")
    prepare: PrepareConfig
    train: dict[str, Any] = Field(default_factory=dict, description="lemon_core.train.TrainConfig fields")
    evaluate: EvalSettings = Field(default_factory=EvalSettings)
    publish: PublishSettings = Field(default_factory=PublishSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)

    @field_validator("train")
    @classmethod
    def _train_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        from lemon_core.train import TrainConfig

        TrainConfig(**value)  # raises a ValidationError naming the bad field
        return value

    def train_config(self) -> Any:
        from lemon_core.train import TrainConfig

        return TrainConfig(**self.train)

    def check_pool(self) -> None:
        pool = self.train_config().pool
        if ("simulated" in str(pool)) != self.simulated_pool:
            raise StageError(
                f"train.pool is {pool!r} but simulated_pool is {self.simulated_pool}: the simulated pool "
                "is a test environment, so a config must say `simulated_pool: true` to use it (and only then)"
            )


def load_config(source: str | Path) -> PipelineConfig:
    """A pipeline config from a YAML path (or a bundled name such as ``local-cpu``) or a JSON string."""
    text = str(source)
    if text.lstrip().startswith("{"):
        data, where = json.loads(text), "config JSON"
    else:
        p = Path(text)
        if not p.exists():
            bundled = Path(__file__).parent / "configs" / (p.name if p.suffix else f"{p.name}.yaml")
            if not bundled.exists():
                raise StageError(
                    f"config {text!r} not found (nor bundled as lemon_core/configs/{bundled.name})"
                )
            p = bundled
        data, where = yaml.safe_load(p.read_text()) or {}, str(p)
    try:
        cfg = PipelineConfig.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        raise StageError(f"{where}: {problems}") from None
    cfg.check_pool()
    return cfg


# ------------------------------------------------------------------------------------------ helpers


def _pool(cfg: PipelineConfig) -> Any:
    from lemon_core.train import load_train_pool

    return load_train_pool(cfg.train_config())


def local_dir(uri: str) -> Path:
    """A local folder holding the directory at ``uri`` (downloaded once per process for s3://)."""
    if not storage.is_s3(uri):
        path = storage.parse_uri(uri).path
        if not path.is_dir():
            raise StageError(f"{uri} is not a folder: did the stage that writes it run?")
        return path
    cache = Path(os.environ.get("LEMON_CACHE_DIR", Path.home() / ".cache" / "lemon")) / "artifacts"
    target = cache / uri.removeprefix("s3://").replace("/", "_")
    if not target.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache))
        storage.download_dir(uri, tmp)
        tmp.rename(target)
    return target


def _metrics_out(metrics: Any, uri: str, job: str, labels: dict[str, str]) -> None:
    from lemon_core.metrics import push_if_configured, write_exposition

    write_exposition(metrics.registry, storage.join(uri, "metrics.prom"))
    push_if_configured(metrics.registry, job=job, grouping_key=labels)


def _save_policy(policy: Any, uri: str, extra: dict[str, str] | None = None) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        policy.model.save_pretrained(tmp, safe_serialization=True)
        policy.tokenizer.save_pretrained(tmp)
        for name, text in (extra or {}).items():
            Path(tmp, name).write_text(text)
        storage.upload_dir(tmp, uri)
    return uri


# ------------------------------------------------------------------------------------------- stages


def stage_prepare(cfg: PipelineConfig) -> tuple[str, list[str]]:
    """Task shards; returns (manifest URI, the train shard URIs one rollout pod each takes)."""
    out = storage.join(cfg.artifacts, "tasks")
    manifest = prepare_dataset(cfg.prepare, out)
    shards = manifest.shards("train")[: cfg.rollout_shards]
    return storage.join(out, "manifest.json"), shards


def stage_sft(cfg: PipelineConfig, manifest_uri: str) -> str:
    """SFT warm-up on templated valid specs; returns the model URI (also the KL reference)."""
    from lemon_core.metrics import LemonMetrics
    from lemon_core.sft import sft_pairs, sft_train
    from lemon_core.train import load_policy, sft_valid_rate

    tc = cfg.train_config()
    manifest = read_manifest(manifest_uri)
    train = [ex for _, ex in load_split(manifest, "train")]
    held = [ex for _, ex in load_split(manifest, "val")] or train
    pool = _pool(cfg)
    policy = load_policy(tc, tc.model)
    questions = [t.question for t in held[: tc.sft.eval_tasks]]

    def rate() -> float:
        return sft_valid_rate(policy, questions, pool, tc) if questions else 0.0

    before = rate()
    losses = (
        sft_train(
            policy,
            sft_pairs([t.question for t in train], pool, tc.sft, tc.seed, tc.spec_format),
            pool,
            tc.sft,
            seed=tc.seed,
            progress=tc.progress,
        )
        if tc.sft.enabled
        else []
    )
    after = rate()
    uri = storage.join(cfg.artifacts, "sft", "model")
    info = {
        "valid_rate_before": before,
        "valid_rate_after": after,
        "steps": tc.sft.steps,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
    }
    _save_policy(policy, uri, {"sft.json": json.dumps(info, indent=2)})
    storage.write_text(storage.join(cfg.artifacts, "sft", "sft.json"), json.dumps(info, indent=2))
    m = LemonMetrics()
    m.spec_valid_ratio.set(after)
    _metrics_out(m, storage.join(cfg.artifacts, "sft"), "lemon-sft", {"run": cfg.name})
    pool.close()
    return uri


def _attach_sampler(policy: Any, checkpoint: Path, tc: Any, pool: Any) -> None:
    """Sample with vLLM when ``train.rollout.sampler: vllm``: an engine on the checkpoint folder itself,
    or on a merged copy for a LoRA checkpoint (vLLM loads plain HF folders)."""
    from lemon_core.rollout import attach_sampler
    from lemon_core.train import merge_lora_checkpoint

    if tc.rollout.sampler == "transformers":
        return
    model_dir = checkpoint
    if (checkpoint / "adapter_config.json").exists():
        model_dir = merge_lora_checkpoint(checkpoint, checkpoint.with_name(checkpoint.name + "-merged"))
    attach_sampler(policy, str(model_dir), tc.rollout, pool, seed=tc.seed)


def _close_sampler(policy: Any) -> None:
    if policy.sampler is not None:
        policy.sampler.close()
        policy.sampler = None


def _sampler_state(checkpoint: Path) -> dict[str, float]:
    state = checkpoint / "trainer_state.json"
    return json.loads(state.read_text()).get("sampler", {}) if state.exists() else {}


def stage_rollout(
    cfg: PipelineConfig, manifest_uri: str, shard_index: int, iteration: int, checkpoint_uri: str
) -> str:
    """Rollouts of this iteration's tasks from train shard ``shard_index`` (modulo the number of
    shards) with the current policy; returns the records URI."""
    from lemon_core.counterfactual import EditFamily, EditFamilySampler
    from lemon_core.metrics import LemonMetrics
    from lemon_core.rollout import collect_rollouts, write_records
    from lemon_core.train import load_policy, tasks_for_step

    tc = cfg.train_config()
    manifest = read_manifest(manifest_uri)
    shards = manifest.shards("train")
    shard_uri = shards[shard_index % len(shards)]
    tasks = [ex for _, ex in read_shard(shard_uri, manifest)]
    if not tasks:
        raise StageError(f"shard {shard_uri} has no tasks; lower prepare.shard_size or raise train_limit")
    tasks = tasks_for_step(tasks, iteration, cfg.tasks_per_shard, tc.seed)
    ckpt = local_dir(checkpoint_uri)
    pool = _pool(cfg)
    policy = load_policy(tc, str(ckpt))
    _attach_sampler(policy, ckpt, tc, pool)
    sampler = EditFamilySampler(floor=tc.rollout.edit_floor, decay=tc.rollout.edit_decay)
    sampler.mean_abs_delta.update({EditFamily(k): float(v) for k, v in _sampler_state(ckpt).items()})
    shard_seed = int.from_bytes(shard_uri.encode()[-8:].rjust(8, b"\0"), "big") % 1_000_003
    records, stats = collect_rollouts(
        policy,
        tasks,
        pool,
        tc.rollout,
        tc.reward,
        sampler,
        step=iteration,
        seed=tc.seed * 1_000_003 + iteration * 7919 + shard_seed,
    )
    _close_sampler(policy)
    name = f"pod-{shard_index:03d}-" + shard_uri.rstrip("/").rsplit("/", 1)[-1]
    uri = storage.join(cfg.artifacts, f"iter-{iteration:03d}", "rollouts", name)
    write_records(records, uri)
    m = LemonMetrics()
    m.record_rewards("total", [r.reward.total for r in records])
    m.spec_valid_ratio.set(sum(r.valid for r in records) / len(records))
    for r in records:
        for e in r.edits:
            m.record_deltas(e.family, [e.delta])
    _metrics_out(
        m,
        storage.join(cfg.artifacts, f"iter-{iteration:03d}", "rollouts", name + ".metrics"),
        "lemon-rollout",
        {"run": cfg.name, "iteration": str(iteration), "shard": name},
    )
    pool.close()
    return uri


def stage_train(
    cfg: PipelineConfig, records_uris: Sequence[str], iteration: int, checkpoint_uri: str, reference_uri: str
) -> str:
    """One GRPO update on the iteration's rollout records; returns the new checkpoint URI.

    Under torchrun (a TrainJob with numNodes > 1) every rank takes whole GRPO groups (shard_by_group) and
    ``grpo_update`` all-reduces gradients; rank 0 writes the checkpoint. With ``train.distributed.strategy:
    fsdp`` the policy and reference are sharded over the ranks (lemon_core/fsdp.py) and the full weights
    and optimizer state are gathered to rank 0 for the checkpoint, which stays a plain HF folder.
    """
    import torch

    from lemon_core.counterfactual import EditFamily, EditFamilySampler
    from lemon_core.fsdp import full_state
    from lemon_core.metrics import LemonMetrics
    from lemon_core.policy import OrchestratorPolicy
    from lemon_core.rollout import read_records
    from lemon_core.train import (
        grpo_update,
        load_optimizer_state,
        load_policy,
        resolve_dtype,
        rollout_metrics,
        save_checkpoint,
        shard_by_group,
        shard_for_training,
        uses_fsdp,
        world,
    )

    tc = cfg.train_config()
    rank, world_size = world(tc.device)
    records = [r for uri in records_uris for r in read_records(uri)]
    if not records:
        raise StageError(f"iteration {iteration}: no rollout records in {list(records_uris)}")
    mine = shard_by_group(records, rank, world_size)
    ckpt = local_dir(checkpoint_uri)
    dtype = resolve_dtype(tc)
    sharded = uses_fsdp(tc, world_size)
    load_device = "cpu" if sharded else tc.device  # FSDP: only each rank's shard goes to tc.device
    policy = load_policy(tc, str(ckpt), load_device)
    ref = None
    if tc.grpo.kl_coef > 0:
        ref = OrchestratorPolicy.load(str(local_dir(reference_uri)), load_device, dtype).model.eval()
        ref.requires_grad_(False)
    if sharded:
        shard_for_training(policy, ref, tc)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=tc.optim.lr, weight_decay=tc.optim.weight_decay)
    warm = tc.optim.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (warm + 1)))
    if (ckpt / "training_state.pt").exists():
        state = torch.load(ckpt / "training_state.pt", weights_only=False)
        load_optimizer_state(policy.model, optimizer, state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    sampler = EditFamilySampler(floor=tc.rollout.edit_floor, decay=tc.rollout.edit_decay)
    sampler.mean_abs_delta.update({EditFamily(k): float(v) for k, v in _sampler_state(ckpt).items()})
    for r in records:  # the sampler learns from every shard's contrasts, as in the single-process trainer
        for e in r.edits:
            sampler.update(EditFamily(e.family), e.delta)
    t0 = time.perf_counter()
    update = grpo_update(policy, ref, mine, optimizer, scheduler, tc)
    row = {
        "step": iteration,
        **rollout_metrics(records, _pool(cfg).level_names),
        **update,
        "time/update_s": time.perf_counter() - t0,
    }
    iter_uri = storage.join(cfg.artifacts, f"iter-{iteration:03d}")
    uri = storage.join(iter_uri, "checkpoint")
    full = full_state(policy.model, optimizer) if sharded else None  # a collective: every rank gathers
    if rank == 0:
        with tempfile.TemporaryDirectory() as tmp:
            path = save_checkpoint(
                Path(tmp), iteration, policy, optimizer, scheduler, sampler, keep=1, full_state=full
            )
            storage.upload_dir(path, uri)
        storage.write_text(storage.join(iter_uri, "train.json"), json.dumps(row, indent=2, default=float))
        m = LemonMetrics()
        m.record_train_step(
            float(update.get("loss", 0.0)), float(update.get("kl", 0.0)), float(update.get("clip_ratio", 0.0))
        )
        m.record_rewards("total", [r.reward.total for r in records])
        _metrics_out(m, iter_uri, "lemon-train", {"run": cfg.name, "iteration": str(iteration)})
    return uri


def orchestrator_specs(
    policy: Any, pool: Any, max_new_tokens: int, seed: int, counter: dict[str, int]
) -> Any:
    """Greedy spec per example. An output that does not parse falls back to one agent at the cheapest
    level (a weak, cheap answer) and is counted in ``counter['invalid']``, so the summary shows it."""
    from lemon_core.baselines import cot
    from lemon_core.spec import SpecError, parse_spec

    def specs(batch: Sequence[Any]) -> list[Any]:
        prompts = [policy.prompt_ids(ex.question, pool) for ex in batch]
        samples = [
            g[0] for g in policy.sample(prompts, 1, max_new_tokens=max_new_tokens, temperature=0.0, seed=seed)
        ]
        out = []
        for s in samples:
            try:
                out.append(parse_spec(s.text, pool).spec)
            except SpecError:
                counter["invalid"] += 1
                out.append(cot(pool.level_names[0]))
            counter["total"] += 1
        return out

    return specs


def stage_evaluate(
    cfg: PipelineConfig, manifest_uri: str, method: str, benchmark: str, checkpoint_uri: str = ""
) -> str:
    """One (method, benchmark) cell on the prepared eval split; returns the summary.json URI."""
    from lemon_core.baselines import baseline_spec
    from lemon_core.benchmarks import get as get_benchmark
    from lemon_core.evaluate import evaluate
    from lemon_core.metrics import LemonMetrics

    tc = cfg.train_config()
    manifest = read_manifest(manifest_uri)
    examples = [ex for _, ex in load_split(manifest, cfg.evaluate.split, benchmark)][: cfg.evaluate.limit]
    if not examples:
        raise StageError(
            f"no {benchmark!r} examples in split {cfg.evaluate.split!r} of {manifest_uri}; "
            "add the benchmark to prepare.benchmarks or raise prepare.test_limit"
        )
    from lemon_core.train import load_train_pool

    pool = load_train_pool(tc.model_copy(update={"agent_max_tokens": cfg.evaluate.agent_max_tokens}))
    counter = {"invalid": 0, "total": 0}
    if method == ORCHESTRATOR:
        from lemon_core.train import load_policy

        if not checkpoint_uri:
            raise StageError(f"method {ORCHESTRATOR!r} needs a checkpoint URI (the trained orchestrator)")
        policy = load_policy(tc, str(local_dir(checkpoint_uri)))
        _attach_sampler(policy, local_dir(checkpoint_uri), tc, pool)
        specs: Any = orchestrator_specs(policy, pool, tc.rollout.max_new_tokens, tc.seed, counter)
    else:
        level = cfg.evaluate.capacity or pool.level_names[-1]
        specs = baseline_spec(method, level, cheapest=pool.level_names[0])
    bench = get_benchmark(benchmark)
    with tempfile.TemporaryDirectory() as tmp:
        summary, _ = evaluate(
            bench,
            examples,
            specs,
            pool,
            method=method,
            split=cfg.evaluate.split,
            out_dir=Path(tmp),
            batch_size=cfg.evaluate.batch_size,
            seed=tc.seed,
            progress=tc.progress,
        )
        data = summary.model_dump()
        data["invalid_specs"] = counter["invalid"]
        data["pool"] = pool.description
        out = storage.join(cfg.artifacts, "eval", f"{benchmark}-{method}")
        storage.put_file(Path(tmp) / "traces.jsonl", storage.join(out, "traces.jsonl"))
        storage.write_text(storage.join(out, "summary.json"), json.dumps(data, indent=2) + "\n")
    m = LemonMetrics()
    m.record_eval(benchmark, method, summary.accuracy, summary.mean_cost_usd)
    _metrics_out(m, out, "lemon-eval", {"run": cfg.name, "benchmark": benchmark, "method": method})
    if method == ORCHESTRATOR:
        _close_sampler(policy)
    pool.close()
    return storage.join(out, "summary.json")


def read_summaries(uris: Sequence[str]) -> list[dict[str, Any]]:
    return [json.loads(storage.read_text(u)) for u in uris]


def stage_report(cfg: PipelineConfig, summary_uris: Sequence[str], out_dir: Path) -> dict[str, Path]:
    """HTML + Markdown report with the Pareto plot and (when training ran) the reward curve;
    written locally to ``out_dir`` and copied to ``<artifacts>/report``."""
    from lemon_core.report import write_report

    rows = read_summaries(summary_uris)
    train_rows = []
    for i in range(1, cfg.n_iterations + 1):
        uri = storage.join(cfg.artifacts, f"iter-{i:03d}", "train.json")
        if storage.exists(uri):
            train_rows.append(json.loads(storage.read_text(uri)))
    images: dict[str, Path | bytes] = {}
    if train_rows:
        from lemon_core.plots import plot_reward_curve

        images["Reward curve"] = plot_reward_curve(train_rows, out_dir / "reward_curve.png")
    tc = cfg.train_config()
    notes = [
        f"run {cfg.name}; artifacts {cfg.artifacts}",
        f"pool: {_pool(cfg).description}",
        f"orchestrator base model: {tc.model}; GRPO iterations: {cfg.n_iterations}",
    ]
    if cfg.simulated_pool:
        notes.insert(
            0,
            "SIMULATED POOL: agent answers come from a seeded simulator, not language models; "
            "these numbers test the pipeline, they are not model accuracy.",
        )
    invalid = {
        f"{r['benchmark']}/{r['method']}": r.get("invalid_specs", 0) for r in rows if r.get("invalid_specs")
    }
    if invalid:
        notes.append(f"orchestrator outputs that did not parse (fell back to one cheapest agent): {invalid}")
    keep = ("step", "reward/mean", "valid_rate", "score", "cost", "loss", "kl")
    tables = (
        {"Training iterations": [{k: r[k] for k in keep if k in r} for r in train_rows]} if train_rows else {}
    )
    paths = write_report(
        rows, out_dir, title=f"lemon report: {cfg.name}", notes=notes, extra_images=images, tables=tables
    )
    for p in out_dir.iterdir():
        if p.is_file():
            storage.put_file(p, storage.join(cfg.artifacts, "report", p.name))
    return paths


def candidate_metric(rows: Sequence[dict[str, Any]], metric: str, method: str = ORCHESTRATOR) -> float:
    values = [float(r[metric]) for r in rows if r["method"] == method and metric in r]
    if not values:
        raise StageError(f"no {method!r} rows with field {metric!r} to compare; check publish.metric")
    return statistics.fmean(values)


def served_metric(serving_uri: str, metric: str) -> float | None:
    """The metric recorded in the served model's card, or None when nothing is served yet."""
    card = storage.join(serving_uri, "model_card.json")
    if not storage.exists(card):
        return None
    return json.loads(storage.read_text(card)).get("metrics", {}).get(metric)


def should_publish(cfg: PipelineConfig, summary_uris: Sequence[str]) -> tuple[bool, float, float | None]:
    """(publish?, candidate value, served value): the gate before ``stage_publish``."""
    serving = cfg.publish.serving_uri or storage.join(cfg.artifacts, "serving")
    cand = candidate_metric(read_summaries(summary_uris), cfg.publish.metric)
    served = served_metric(serving, cfg.publish.metric)
    return served is None or cand > served + cfg.publish.min_improvement, cand, served


def stage_publish(cfg: PipelineConfig, checkpoint_uri: str, summary_uris: Sequence[str]) -> str:
    """Copy the checkpoint's model files to the serving location and write the model card last."""
    serving = cfg.publish.serving_uri or storage.join(cfg.artifacts, "serving")
    rows = read_summaries(summary_uris)
    src = local_dir(checkpoint_uri)
    model_files = [p for p in src.iterdir() if p.is_file() and p.name not in ("training_state.pt",)]
    with tempfile.TemporaryDirectory() as tmp:
        for p in model_files:
            if not p.name.startswith("_lemon_manifest"):
                Path(tmp, p.name).write_bytes(p.read_bytes())
        storage.upload_dir(tmp, storage.join(serving, "model"))
    card = {
        "name": cfg.name,
        "source_checkpoint": checkpoint_uri,
        "published_at": time.time(),
        "base_model": cfg.train_config().model,
        "pool": _pool(cfg).description,
        "metrics": {cfg.publish.metric: candidate_metric(rows, cfg.publish.metric)},
        "evaluation": [r for r in rows if r["method"] == ORCHESTRATOR],
        "baselines": [r for r in rows if r["method"] != ORCHESTRATOR],
    }
    storage.write_text(storage.join(serving, "model_card.json"), json.dumps(card, indent=2) + "\n")
    storage.write_text(storage.join(serving, "MODEL_CARD.md"), _card_markdown(card))
    return serving


def _card_markdown(card: dict[str, Any]) -> str:
    from lemon_core.report import render_markdown

    rows = card["evaluation"] + card["baselines"]
    return (
        f"# {card['name']}\n\nLEMON orchestrator fine-tuned from `{card['base_model']}` with GRPO and "
        f"localized counterfactual credit (arXiv 2605.14483).\n\n- source checkpoint: "
        f"`{card['source_checkpoint']}`\n- capacity pool: {card['pool']}\n\n"
        + (render_markdown(rows, title="Evaluation") if rows else "")
    )


def eval_matrix(cfg: PipelineConfig, methods: Sequence[str] | None = None) -> list[dict[str, str]]:
    """The (method, benchmark) cells, as the list of dicts a ParallelFor iterates over."""
    benches = cfg.evaluate.benchmarks or cfg.prepare.benchmarks
    return [{"method": m, "benchmark": b} for m in (methods or cfg.evaluate.methods) for b in benches]
