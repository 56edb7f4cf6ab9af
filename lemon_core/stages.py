"""The pipeline's stages: what a Kubeflow component runs and ``lemon <stage>`` runs.

A stage only adapts URIs, shards and config to the training flow's functions (``train.py``:
``build_state``, ``sft_warmup``, ``rollout_step``, ``update_step``; ``evaluate.py``:
``evaluate_orchestrator``): it downloads its inputs, calls them, and uploads what they wrote. Nothing
here knows about Kubeflow, and nothing here is training logic of its own.

Each run writes under its own root, ``<artifacts>/<run id>`` (the Kubeflow run id, or a fresh one for a
``lemon pipeline run``), so a weekly retrain never reads the previous run's checkpoints. ``prepare``
chooses the root; every later stage finds it from the manifest URI it is handed::

    <run>/tasks/                        prepare: manifest.json + train/val/test shards
    <run>/sft/model/                    SFT warm-up model (also the KL reference) + sft.json
    <run>/iter-001/rollouts/<shard>     one rollout shard per ParallelFor item
    <run>/iter-001/checkpoint/          GRPO checkpoint after iteration 1 (model + optimizer + sampler state)
    <run>/iter-001/train.json           metrics of iteration 1
    <run>/eval/<benchmark>-<method>/    summary.json + traces.jsonl per (method, benchmark) cell
    <run>/report/                       report.html, report.md, pareto.png, reward_curve.png
    <artifacts>/serving/                the published orchestrator (shared by runs; publish.serving_uri)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lemon_core import storage
from lemon_core.config import (  # noqa: F401 - the pipeline's config models are part of this API
    ORCHESTRATOR,
    SFT_ORCHESTRATOR,
    EvalSettings,
    KubernetesSettings,
    PipelineConfig,
    PublishSettings,
    load_settings,
)
from lemon_core.errors import LemonError
from lemon_core.prepare import load_split, prepare_dataset, read_manifest, read_shard

StageError = LemonError  # a stage cannot run with what it was given; the message says what to fix
MANIFEST_TAIL = "/tasks/manifest.json"


def load_config(source: str | Path) -> PipelineConfig:
    """A pipeline config from a YAML path (or a bundled name such as ``local-cpu``) or a JSON string."""
    return load_settings(PipelineConfig, source)


# ------------------------------------------------------------------------------------------ helpers
def new_run_id() -> str:
    """A run id for a run that has none from Kubeflow: sortable time + a random suffix."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def run_root(manifest_uri: str) -> str:
    """The run's artifact root, from the manifest URI ``prepare`` returned (``<run>/tasks/manifest.json``)."""
    if not manifest_uri.endswith(MANIFEST_TAIL):
        raise StageError(f"{manifest_uri!r} is not a prepared manifest URI (…{MANIFEST_TAIL}); run prepare first")
    return manifest_uri[: -len(MANIFEST_TAIL)]


def root_of_summary(summary_uri: str) -> str:
    """The run root of an evaluation summary (``<run>/eval/<cell>/summary.json``)."""
    return summary_uri.rsplit("/", 3)[0]


def local_dir(uri: str) -> Path:
    """A local folder holding the directory at ``uri``: the folder itself for a local URI; for s3:// a
    verified copy in the shared cache, keyed by the content (manifest sha256), never by the URI, so a
    rewritten object at the same URI is never served stale."""
    if not storage.is_s3(uri):
        path = storage.parse_uri(uri).path
        if not path.is_dir():
            raise StageError(f"{uri} is not a folder: did the stage that writes it run?")
        return path
    cache = Path(os.environ.get("LEMON_CACHE_DIR", Path.home() / ".cache" / "lemon")) / "artifacts"
    return storage.cached_download(uri, cache)  # keyed by the manifest's sha256; safe on a shared PVC


def remember_answers(cfg: PipelineConfig, pool: Any, manifest_uri: str) -> None:
    """Let ``pool`` share its agent answers with the run's other stages (``node_cache``), in
    ``<run>/node-cache/<pool identity>``. Only for a run on local disk (kfp.local, `make run`): pods of a
    cluster run have no common folder, and each stage there starts with an empty cache as before."""
    root = run_root(manifest_uri)
    if cfg.node_cache and not storage.is_s3(root):
        pool.remember_answers(local_dir(root) / "node-cache" / pool.identity())


def _metrics_out(metrics: Any, uri: str, job: str, labels: dict[str, str]) -> None:
    from lemon_core.metrics import push_if_configured, write_exposition

    write_exposition(metrics.registry, storage.join(uri, "metrics.prom"))
    push_if_configured(metrics.registry, job=job, grouping_key=labels)


def _upload_model(policy: Any, uri: str, extra: dict[str, str] | None = None) -> str:
    from lemon_core.checkpoint import save_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        save_model_dir(policy, folder)
        for name, text in (extra or {}).items():
            (folder / name).write_text(text)
        storage.upload_dir(folder, uri)
    return uri


def _attach_sampler(policy: Any, checkpoint: Path, tc: Any, pool: Any) -> None:
    """Sample with vLLM when ``train.rollout.sampler: vllm``: an engine on the checkpoint folder itself,
    or on a merged copy for a LoRA checkpoint (vLLM loads plain HF folders; an adapter's base path does
    not carry across pods)."""
    from lemon_core.lora import merge_lora_checkpoint
    from lemon_core.rollout import attach_sampler

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


# ------------------------------------------------------------------------------------------- stages
def stage_prepare(cfg: PipelineConfig, run_id: str = "") -> tuple[str, list[str]]:
    """Task shards under ``<artifacts>/<run id>/tasks`` (``cfg.run_id``, else ``run_id`` from Kubeflow, else a
    fresh one); returns (manifest URI, the train shard URIs)."""
    out = storage.join(cfg.artifacts, cfg.run_id or run_id or new_run_id(), "tasks")
    manifest = prepare_dataset(cfg.prepare, out)
    shards = manifest.shards("train")[: cfg.rollout_shards]
    return storage.join(out, "manifest.json"), shards


def stage_sft(cfg: PipelineConfig, manifest_uri: str) -> str:
    """SFT warm-up (``train.sft_warmup``) on the train split; returns the model URI (also the KL reference)."""
    from lemon_core.metrics import LemonMetrics
    from lemon_core.train import load_policy, load_train_pool, sft_warmup

    tc = cfg.train
    manifest = read_manifest(manifest_uri)
    train = [ex for _, ex in load_split(manifest, "train")]
    held = [ex for _, ex in load_split(manifest, "val")] or train
    pool = load_train_pool(tc)
    remember_answers(cfg, pool, manifest_uri)
    policy = load_policy(tc, tc.model)
    report = sft_warmup(policy, tc, pool, train, [t.question for t in held], tc.progress)
    root = run_root(manifest_uri)
    uri = storage.join(root, "sft", "model")
    info = report.model_dump_json(indent=2)
    _upload_model(policy, uri, {"sft.json": info})
    storage.write_text(storage.join(root, "sft", "sft.json"), info)
    m = LemonMetrics(parts=("rollout",))
    m.spec_valid_ratio.set(report.valid_rate_after or 0.0)
    _metrics_out(m, storage.join(root, "sft"), "lemon-sft", {"run": cfg.name})
    pool.close()
    return uri


def stage_rollout(
    cfg: PipelineConfig, manifest_uri: str, shard_index: int, iteration: int, checkpoint_uri: str
) -> str:
    """Rollouts (``train.rollout_step``) of this iteration's tasks from train shard ``shard_index`` (modulo
    the number of shards) with the policy at ``checkpoint_uri``; returns the records URI."""
    from lemon_core.checkpoint import sampler_state
    from lemon_core.metrics import LemonMetrics
    from lemon_core.rollout import write_records
    from lemon_core.train import (
        constrain,
        load_policy,
        load_train_pool,
        new_edit_sampler,
        probe_rewards,
        rollout_step,
        step_seed,
        tasks_for_step,
    )

    tc = cfg.train
    manifest = read_manifest(manifest_uri)
    shards = manifest.shards("train")
    shard_uri = shards[shard_index % len(shards)]
    tasks = [ex for _, ex in read_shard(shard_uri, manifest)]
    if not tasks:
        raise StageError(f"shard {shard_uri} has no tasks; lower prepare.shard_size or raise train_limit")
    tasks = tasks_for_step(tasks, iteration, cfg.tasks_per_shard, tc.seed)
    ckpt = local_dir(checkpoint_uri)
    pool = load_train_pool(tc)
    remember_answers(cfg, pool, manifest_uri)
    policy = constrain(load_policy(tc, str(ckpt)), tc, pool.level_names)
    _attach_sampler(policy, ckpt, tc, pool)
    edit_sampler = new_edit_sampler(tc)
    edit_sampler.mean_abs_delta.update(sampler_state(ckpt))
    shard_seed = int.from_bytes(shard_uri.encode()[-8:].rjust(8, b"\0"), "big") % 1_000_003
    records, _ = rollout_step(policy, pool, tc, edit_sampler, tasks, iteration, step_seed(tc, iteration, shard_seed))
    iter_uri = storage.join(run_root(manifest_uri), f"iter-{iteration:03d}")
    if cfg.probe_tasks and shard_index == 0:  # one pod measures the probe set for the whole iteration
        probe = [ex for b in cfg.prepare.benchmarks for _, ex in load_split(manifest, "val", b)[: cfg.probe_tasks]]
        if probe:
            storage.write_text(storage.join(iter_uri, "probe.json"),
                               json.dumps(probe_rewards(policy, pool, tc, probe), indent=2) + "\n")
    _close_sampler(policy)
    name = f"pod-{shard_index:03d}-" + shard_uri.rstrip("/").rsplit("/", 1)[-1]
    uri = storage.join(iter_uri, "rollouts", name)
    write_records(records, uri)
    m = LemonMetrics(parts=("rollout", "calls"))
    m.record_rewards("total", [r.reward.total for r in records])
    m.spec_valid_ratio.set(sum(r.valid for r in records) / len(records))
    for r in records:
        for e in r.edits:
            m.record_deltas(e.family, [e.delta])
    _metrics_out(m, uri + ".metrics", "lemon-rollout",
                 {"run": cfg.name, "iteration": str(iteration), "shard": name})
    pool.close()
    return uri


def stage_train(
    cfg: PipelineConfig, records_uris: Sequence[str], iteration: int, checkpoint_uri: str, reference_uri: str
) -> str:
    """One GRPO update (``train.update_step``) on the iteration's rollout records; returns the checkpoint URI.

    Under torchrun (a TrainJob with numNodes > 1) every rank takes whole GRPO groups (``shard_by_group``)
    and the strategy (replicate or FSDP, ``dist.py``) reduces gradients; rank 0 writes the checkpoint.
    """
    from lemon_core.counterfactual import EditFamily
    from lemon_core.dist import shard_by_group
    from lemon_core.metrics import LemonMetrics
    from lemon_core.rollout import read_records, rollout_metrics
    from lemon_core.train import build_state, checkpoint_state, close_state, update_step

    tc = cfg.train
    records = [r for uri in records_uris for r in read_records(uri)]
    if not records:
        raise StageError(f"iteration {iteration}: no rollout records in {list(records_uris)}")
    reference = str(local_dir(reference_uri))
    state = build_state(tc, local_dir(checkpoint_uri), base_model=reference, reference=reference, restore_rng=False)
    for r in records:  # the edit sampler learns from every shard's contrasts, as in the single-process trainer
        for e in r.edits:
            state.edit_sampler.update(EditFamily(e.family), e.delta)
    t0 = time.perf_counter()
    update = update_step(state, shard_by_group(records, state.rank, state.world_size))
    state.step = iteration
    row = {"step": iteration, **rollout_metrics(records, state.pool.level_names), **update,
           "time/update_s": time.perf_counter() - t0}
    iter_uri = storage.join(root_of_records(records_uris[0]), f"iter-{iteration:03d}")
    probe_uri = storage.join(iter_uri, "probe.json")
    if storage.exists(probe_uri):  # measured by the iteration's rollout stage, with the policy it sampled from
        row.update(json.loads(storage.read_text(probe_uri)))
    uri = storage.join(iter_uri, "checkpoint")
    with tempfile.TemporaryDirectory() as tmp:
        path = checkpoint_state(state, Path(tmp), keep=1)  # every rank calls: gathers are collectives
        if path is not None:
            storage.upload_dir(path, uri)
    if state.rank == 0:
        storage.write_text(storage.join(iter_uri, "train.json"), json.dumps(row, indent=2, default=float))
        print(update_line(iteration, row), file=sys.stderr, flush=True)
        m = LemonMetrics(parts=("train", "rollout"))
        m.record_train_step(float(update.get("loss", 0.0)), float(update.get("kl", 0.0)),
                            float(update.get("clip_ratio", 0.0)))
        m.record_rewards("total", [r.reward.total for r in records])
        _metrics_out(m, iter_uri, "lemon-train", {"run": cfg.name, "iteration": str(iteration)})
    close_state(state)
    return uri


def update_line(iteration: int, row: Mapping[str, Any]) -> str:
    """The one log line of a pipeline update: what the step saw and what it did, readable in kfp logs."""
    from lemon_core.progress import format_duration, format_figure
    from lemon_core.update import constant_groups_figure

    keys = ("reward/mean", "valid_rate", "success_rate", "loss", "kl", "clip_ratio", "grad_norm")
    figures = " ".join(f"{k}={format_figure(row[k])}" for k in keys if k in row)
    if constant := constant_groups_figure(row):
        figures += f" {constant}"
    return f"update iteration {iteration} done in {format_duration(row['time/update_s'])}: {figures}"


def root_of_records(records_uri: str) -> str:
    """The run root of a rollout shard (``<run>/iter-NNN/rollouts/<name>``)."""
    return records_uri.rsplit("/", 3)[0]


def stage_evaluate(
    cfg: PipelineConfig, manifest_uri: str, method: str, benchmark: str, checkpoint_uri: str = ""
) -> str:
    """One (method, benchmark) cell on the prepared eval split; returns the summary.json URI.

    The orchestrator (``lemon`` with the trained checkpoint, ``lemon-sft`` with the SFT model) goes
    through ``evaluate_orchestrator``: an output that is not a valid spec scores 0 and is counted.
    """
    from lemon_core.baselines import baseline_spec
    from lemon_core.benchmarks import get as get_benchmark
    from lemon_core.comparison import total_cost
    from lemon_core.evaluate import evaluate, evaluate_orchestrator, sampled_spec_rewards, with_sampled_rewards
    from lemon_core.metrics import LemonMetrics
    from lemon_core.train import capped_pool, constrain, load_policy

    tc = cfg.train
    manifest = read_manifest(manifest_uri)
    examples = [ex for _, ex in load_split(manifest, cfg.evaluate.split, benchmark)][: cfg.evaluate.limit]
    if not examples:
        raise StageError(
            f"no {benchmark!r} examples in split {cfg.evaluate.split!r} of {manifest_uri}; "
            "add the benchmark to prepare.benchmarks or raise prepare.test_limit"
        )
    pool = capped_pool(tc.pool, cfg.evaluate.agent_max_tokens)  # evaluation: the pool's caps unless set
    remember_answers(cfg, pool, manifest_uri)
    bench = get_benchmark(benchmark)
    common = dict(method=method, split=cfg.evaluate.split, batch_size=cfg.evaluate.batch_size, seed=tc.seed,
                  progress=tc.progress, sandbox_mode=_sandbox_mode(benchmark))
    policy = None
    with tempfile.TemporaryDirectory() as tmp:
        if method in (ORCHESTRATOR, SFT_ORCHESTRATOR):
            if not checkpoint_uri:
                raise StageError(f"method {method!r} needs a checkpoint URI (the orchestrator to evaluate)")
            ckpt = local_dir(checkpoint_uri)
            policy = constrain(load_policy(tc, str(ckpt)), tc, pool.level_names)
            _attach_sampler(policy, ckpt, tc, pool)
            summary, records = evaluate_orchestrator(
                policy, pool, examples, benchmark=bench, out_dir=Path(tmp), max_new_tokens=tc.rollout.max_new_tokens,
                orchestrator_model=tc.model, reward_cfg=tc.reward, **common)
            k = cfg.evaluate.samples_per_problem
            if k:
                per_problem = sampled_spec_rewards(
                    policy, pool, examples, k=k, temperature=tc.rollout.temperature,
                    max_new_tokens=tc.rollout.max_new_tokens, seed=tc.seed, benchmark=bench,
                    orchestrator_model=tc.model, reward_cfg=tc.reward, batch_size=cfg.evaluate.batch_size,
                    sandbox_mode=common["sandbox_mode"], progress=tc.progress)
                summary = with_sampled_rewards(summary, records, per_problem, k, Path(tmp))
            _close_sampler(policy)
        else:
            spec = baseline_spec(*baseline_method(method, cfg.evaluate.capacity or pool.level_names[-1]),
                                 cheapest=pool.level_names[0])
            summary, _ = evaluate(bench, examples, spec, pool, out_dir=Path(tmp), reward_cfg=tc.reward, **common)
        data = {**summary.model_dump(), "pool": pool.description}
        out = storage.join(run_root(manifest_uri), "eval", f"{benchmark}-{method}")
        storage.put_file(Path(tmp) / "traces.jsonl", storage.join(out, "traces.jsonl"))
        storage.write_text(storage.join(out, "summary.json"), json.dumps(data, indent=2) + "\n")
    m = LemonMetrics(parts=("eval", "calls"))
    # the metric's cost is the method's whole cost: an orchestrator pays its own call too
    m.record_eval(benchmark, method, summary.accuracy, total_cost(data), valid_rate=summary.valid_rate,
                  ci_low=summary.accuracy_ci_low, ci_high=summary.accuracy_ci_high, n=summary.n)
    _metrics_out(m, out, "lemon-eval", {"run": cfg.name, "benchmark": benchmark, "method": method})
    pool.close()
    return storage.join(out, "summary.json")


def baseline_method(method: str, default_level: str) -> tuple[str, str]:
    """(baseline, level) of an evaluation method name: ``cot@small`` runs CoT at `small`, ``cot`` at the default."""
    name, _, level = method.partition("@")
    return name, level or default_level


def _sandbox_mode(benchmark: str) -> str | None:
    """The code sandbox's mode, recorded in summaries of benchmarks that run code (HumanEval)."""
    if benchmark != "humaneval":
        return None
    from lemon_core.benchmarks import sandbox

    mode = getattr(sandbox, "sandbox_mode", None)
    return str(mode()) if callable(mode) else None


def read_summaries(uris: Sequence[str]) -> list[dict[str, Any]]:
    return [json.loads(storage.read_text(u)) for u in uris]


def read_cell_traces(summary_uri: str) -> list[dict[str, Any]] | None:
    """The records of the evaluation cell whose ``summary.json`` is ``summary_uri`` (its ``traces.jsonl`` beside it);
    None when the cell wrote no traces."""
    uri = storage.join(summary_uri.rsplit("/", 1)[0], "traces.jsonl")
    if not storage.exists(uri):
        return None
    return [json.loads(x) for x in storage.read_text(uri).splitlines() if x.strip()]


def stage_report(cfg: PipelineConfig, summary_uris: Sequence[str], out_dir: Path) -> dict[str, Path]:
    """HTML + Markdown report with the Pareto plot and (when training ran) the reward curve; written
    locally to ``out_dir`` and copied to ``<run>/report``. It also says whether the gate publishes."""
    from lemon_core.report import sft_rows, write_report

    rows = read_summaries(summary_uris)
    root = root_of_summary(summary_uris[0]) if summary_uris else cfg.artifacts
    train_rows = []
    for i in range(1, cfg.n_iterations + 1):
        uri = storage.join(root, f"iter-{i:03d}", "train.json")
        if storage.exists(uri):
            train_rows.append(json.loads(storage.read_text(uri)))
    images: dict[str, Path | bytes] = {}
    if train_rows:
        from lemon_core.plots import plot_choices, plot_reward_curve

        images["What moved in training"] = plot_choices(train_rows, out_dir / "choices.png")
        images["Reward curve"] = plot_reward_curve(train_rows, out_dir / "reward_curve.png")
    tc = cfg.train
    from lemon_core.train import load_train_pool

    pool = load_train_pool(tc)
    notes = [
        f"run {cfg.name}; artifacts {root}",
        f"pool: {pool.description}",
        f"orchestrator base model: {tc.model}; GRPO iterations: {cfg.n_iterations}",
        "accuracy is shown with its 95% Wilson interval and n; an orchestrator output that is not a valid spec "
        "scores 0 and is counted in valid_rate (nothing is substituted)",
    ]
    if cfg.simulated_pool:
        notes.insert(
            0,
            "SIMULATED POOL: agent answers come from a seeded simulator, not language models; "
            "these numbers test the pipeline, they are not model accuracy.",
        )
    if any(r["method"] == ORCHESTRATOR for r in rows):
        decision = gate_decision(cfg, rows)
        notes.append(f"publish gate: {'PUBLISH' if decision.publish else 'NOT PUBLISHED'}: {decision.reason}")
    keep = ("step", "reward/mean", "valid_rate", "score", "cost", "loss", "kl")
    tables = (
        {"Training iterations": [{k: r[k] for k in keep if k in r} for r in train_rows]} if train_rows else {}
    )
    sft_uri = storage.join(root, "sft", "sft.json")
    if storage.exists(sft_uri):
        tables = {"SFT warm-up": sft_rows(json.loads(storage.read_text(sft_uri))), **tables}
    traces = {}  # every cell's: the orchestrators' choices, and the baselines' specs to name a copy by
    for uri, row in zip(summary_uris, rows, strict=True):
        if (records := read_cell_traces(uri)) is not None:
            traces[row["benchmark"], row["method"]] = records
    paths = write_report(rows, out_dir, title=f"lemon report: {cfg.name}", notes=notes, extra_images=images,
                         tables=tables, traces=traces, levels=pool.level_names)
    for p in out_dir.iterdir():
        if p.is_file():
            storage.put_file(p, storage.join(root, "report", p.name))
    return paths


def serving_uri(cfg: PipelineConfig) -> str:
    return cfg.publish.serving_uri or storage.join(cfg.artifacts, "serving")


def gate_decision(cfg: PipelineConfig, rows: Sequence[dict[str, Any]]) -> Any:
    """``gate.publish_decision`` for this run's summary rows against the served model's card (none yet: None)."""
    from lemon_core.gate import publish_decision

    card = storage.join(serving_uri(cfg), "model_card.json")
    served = json.loads(storage.read_text(card)) if storage.exists(card) else None
    return publish_decision(cfg, rows, served)


def should_publish(cfg: PipelineConfig, summary_uris: Sequence[str]) -> tuple[bool, float, float | None]:
    """(publish?, candidate value, served value): the gate before ``stage_publish`` (``gate.py``)."""
    decision = gate_decision(cfg, read_summaries(summary_uris))
    return decision.publish, decision.candidate, decision.served


def stage_publish(cfg: PipelineConfig, checkpoint_uri: str, summary_uris: Sequence[str]) -> str:
    """Copy the checkpoint's model files to the serving location and write the model card last."""
    from lemon_core.gate import candidate_metric

    serving = serving_uri(cfg)
    rows = read_summaries(summary_uris)
    src = local_dir(checkpoint_uri)
    model_files = [p for p in src.iterdir() if p.is_file() and p.name not in ("training_state.pt",)]
    with tempfile.TemporaryDirectory() as tmp:
        for p in model_files:
            if not p.name.startswith("_lemon_manifest"):
                Path(tmp, p.name).write_bytes(p.read_bytes())
        storage.upload_dir(tmp, storage.join(serving, "model"))
    from lemon_core.train import load_train_pool

    card = {
        "name": cfg.name,
        "source_checkpoint": checkpoint_uri,
        "published_at": time.time(),
        "base_model": cfg.train.model,
        "pool": load_train_pool(cfg.train).description,
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
