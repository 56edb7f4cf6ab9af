"""``lemon pipeline compile|run|submit`` and the stage commands ``lemon prepare|rollout|train-step|
publish|report``: the same functions the Kubeflow components call, runnable on a laptop or in a pod.

cli.py registers them: ``app.add_typer(pipeline_app, name="pipeline")`` and ``register(app)``.
The pipeline commands import ``pipelines`` lazily, so ``lemon_core`` itself never needs kfp.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from lemon_core.errors import cli_exit

pipeline_app = typer.Typer(
    help="Compile, run locally (kfp.local) or submit the Kubeflow pipelines.", no_args_is_help=True
)

ConfigOpt = Annotated[
    str, typer.Option("--config", help="Pipeline config YAML (e.g. configs/local-cpu.yaml).")
]
WhichOpt = Annotated[str, typer.Option("--pipeline", help="train (lemon-train) or eval (lemon-eval).")]


_fail = cli_exit  # one error line for every command (lemon_core/errors.py)


def _config(source: str, artifacts: str | None = None):  # noqa: ANN202 - PipelineConfig, imported lazily
    from lemon_core.stages import StageError, load_config

    try:
        cfg = load_config(source)
    except StageError as e:
        raise _fail(str(e)) from None
    if artifacts:
        cfg.artifacts = artifacts
    if "://" not in cfg.artifacts:  # components run as subprocesses: give them an absolute path
        cfg.artifacts = str(Path(cfg.artifacts).resolve())
    return cfg


def _which(which: str) -> str:
    if which not in ("train", "eval"):
        raise _fail(f"--pipeline {which!r}: use train or eval")
    return which


@pipeline_app.command("compile")
def compile_command(
    config: ConfigOpt = "local-cpu",
    out: Annotated[Path, typer.Option(help="Folder for lemon-train.yaml and lemon-eval.yaml.")] = Path(
        "build"
    ),
) -> None:
    """Write the IR YAML of both pipelines (structure from the config: iterations, eval matrix)."""
    from pipelines.run import compile_pipeline

    cfg = _config(config)
    for which in ("train", "eval"):
        typer.echo(compile_pipeline(cfg, which, out / f"lemon-{which}.yaml"))


@pipeline_app.command("run")
def run_command(
    config: ConfigOpt = "local-cpu",
    local: Annotated[bool, typer.Option("--local", help="Run here with kfp.local (the only mode).")] = True,
    which: WhichOpt = "train",
    artifacts: Annotated[str | None, typer.Option(help="Override the config's artifact root.")] = None,
) -> None:
    """Run a pipeline end to end with kfp.local.SubprocessRunner (offline) and print the report path."""
    from lemon_core import storage
    from pipelines.run import run_local

    if not local:
        raise _fail("only --local runs here; use `lemon pipeline submit --host ...` for a cluster")
    from lemon_core.stages import new_run_id

    cfg = _config(config, artifacts)
    cfg.run_id = cfg.run_id or new_run_id()
    result = run_local(cfg, _which(which))
    root = storage.join(cfg.artifacts, cfg.run_id)
    for line in results_table(root):
        typer.echo(line)
    typer.echo(f"wall time: {result['wall_s']:.0f} s")
    typer.echo(f"report: {storage.join(root, 'report', 'report.html')}")


def results_table(root: str) -> list[str]:
    """The run's printed results: one line per (benchmark, method), the SFT-only orchestrator beside the trained one
    with the paired test on the same problems (``p=``), then the comparison over all benchmarks and each method's
    mean training reward (an orchestrator's own call counted)."""
    from lemon_core import storage
    from lemon_core.comparison import paired_test, per_problem, pooled, pooled_cost, trained_versus_sft
    from lemon_core.config import ORCHESTRATOR, SFT_ORCHESTRATOR
    from lemon_core.stages import read_cell_traces, read_summaries

    summaries = [u for u in storage.list(storage.join(root, "eval")) if u.endswith("summary.json")]
    cells = {(row["benchmark"], row["method"]): (row, read_cell_traces(uri) or [])
             for uri, row in zip(summaries, read_summaries(summaries), strict=True)}
    lines = []
    for (benchmark, method), (r, records) in sorted(cells.items()):
        own = r.get("orchestrator_cost_usd")  # an orchestrator also pays its own call: shown, not hidden
        line = (f"{benchmark:>11} {method:>10}  accuracy={r['accuracy']:.3f} "
                f"[{r.get('accuracy_ci_low', 0.0):.2f}, {r.get('accuracy_ci_high', 1.0):.2f}]  n={r['n']}  "
                f"valid_rate={r.get('valid_rate', 1.0):.2f}  cost/ex=${r['mean_cost_usd']:.2e}"
                + (f" + orchestrator ${own:.2e}" if own is not None else "")
                + f"  tokens/ex={r['mean_tokens']:.0f}  truncated_answers={r.get('truncated_answers', 0)}  "
                f"looped_answers={r.get('looped_answers', 0)}")
        if r.get("mean_reward") is not None:
            line += f"  reward={r['mean_reward']:.3f}"
        if r.get("sampled_reward") is not None:
            low, high = r["sampled_reward_ci"]
            line += f"  sampled_reward={r['sampled_reward']:.3f} [{low:.2f}, {high:.2f}] (k={r['sampled_k']})"
        sft = cells.get((benchmark, SFT_ORCHESTRATOR))
        if method == ORCHESTRATOR and sft is not None:
            line += f"  p={paired_test(per_problem(records, 'score'), per_problem(sft[1], 'score')).p:.3g}"
        lines.append(line)
    tests = trained_versus_sft({k: v[1] for k, v in cells.items()}, ORCHESTRATOR, SFT_ORCHESTRATOR)
    for what, t in tests.items():
        low, high = t.difference_ci
        lines.append(f"{ORCHESTRATOR} vs {SFT_ORCHESTRATOR}, all benchmarks, {what}: {t.difference:+.3f} per problem "
                     f"[{low:+.3f}, {high:+.3f}], {t.wins} won / {t.losses} lost of {t.n}, exact sign test p={t.p:.3g}")
    by_method: dict[str, list[dict]] = {}
    for (_, method), (r, _) in cells.items():
        by_method.setdefault(method, []).append(r)
    rewards = {m: pooled(rs, lambda r: float(r["mean_reward"]))[0]
               for m, rs in by_method.items() if all(r.get("mean_reward") is not None for r in rs)}
    if rewards:
        ranked = sorted(rewards.items(), key=lambda x: -x[1])
        lines.append("mean reward (training reward, own call counted), all benchmarks: " + ", ".join(
            f"{m} {v:.3f} (${pooled_cost(by_method[m]):.2e}/ex)" for m, v in ranked))
    return lines


@pipeline_app.command("submit")
def submit_command(
    host: Annotated[str, typer.Option(help="KFP API endpoint, e.g. http://ml-pipeline-ui.kubeflow:80")],
    experiment: Annotated[str, typer.Option(help="Experiment name (created if missing).")] = "lemon",
    config: ConfigOpt = "local-cpu",
    which: WhichOpt = "train",
    artifacts: Annotated[str | None, typer.Option(help="Artifact root, e.g. s3://bucket/runs/x.")] = None,
    namespace: Annotated[str | None, typer.Option(help="Kubeflow profile namespace (multi-user).")] = None,
    token_env: Annotated[str | None, typer.Option(help="Env var holding a bearer token.")] = None,
) -> None:
    """Compile and submit to a Kubeflow Pipelines cluster; prints the run's ids and URL."""
    import os

    from lemon_core.stages import load_config
    from pipelines.run import submit

    cfg = load_config(config)
    if artifacts:
        cfg.artifacts = artifacts
    token = os.environ.get(token_env) if token_env else None
    try:
        out = submit(cfg, _which(which), host=host, experiment=experiment, namespace=namespace, token=token)
    except Exception as e:  # noqa: BLE001 - one readable line instead of a client stack trace
        raise _fail(f"submitting to {host} failed: {e}") from None
    typer.echo(json.dumps(out, indent=2))


# ----------------------------------------------------------------------------- stage commands


def prepare_command(config: ConfigOpt = "local-cpu") -> None:
    """Benchmark files -> seeded task shards + manifest under <artifacts>/<run id>/tasks."""
    from lemon_core.stages import stage_prepare

    manifest, shards = stage_prepare(_config(config))
    typer.echo(json.dumps({"manifest_uri": manifest, "train_shards": shards}, indent=2))


def rollout_command(
    shard: Annotated[int, typer.Option(help="Train shard index (modulo the number of shards).")],
    checkpoint: Annotated[str, typer.Option(help="Policy checkpoint URI.")],
    manifest: Annotated[str, typer.Option(help="Task manifest URI.")],
    iteration: Annotated[int, typer.Option(min=1)] = 1,
    config: ConfigOpt = "local-cpu",
) -> None:
    """One shard -> rollout records with the current policy."""
    from lemon_core.stages import stage_rollout

    typer.echo(stage_rollout(_config(config), manifest, shard, iteration, checkpoint))


def train_step_command(
    records: Annotated[list[str], typer.Option(help="Rollout records URI (repeat).")],
    checkpoint: Annotated[str, typer.Option(help="Current policy checkpoint URI.")],
    reference: Annotated[str, typer.Option(help="Reference (SFT) model URI for the KL term.")],
    iteration: Annotated[int, typer.Option(min=1)] = 1,
    config: ConfigOpt = "local-cpu",
) -> None:
    """One GRPO update on rollout records -> checkpoint (what each TrainJob node runs under torchrun)."""
    from lemon_core.stages import stage_train

    typer.echo(stage_train(_config(config), records, iteration, checkpoint, reference))


def report_command(
    summaries: Annotated[list[str], typer.Argument(help="summary.json URIs.")],
    out: Annotated[Path, typer.Option(help="Local report folder.")] = Path("report"),
    config: ConfigOpt = "local-cpu",
) -> None:
    """HTML + Markdown report (Pareto plot, reward curve, tables) from evaluation summaries."""
    from lemon_core.stages import stage_report

    for kind, path in stage_report(_config(config), summaries, out).items():
        typer.echo(f"{kind}: {path}")


def publish_command(
    checkpoint: Annotated[str, typer.Option(help="Checkpoint URI to serve.")],
    summaries: Annotated[list[str], typer.Argument(help="summary.json URIs (for the model card).")],
    config: ConfigOpt = "local-cpu",
    force: Annotated[bool, typer.Option(help="Publish even if it does not beat the served model.")] = False,
) -> None:
    """Copy the checkpoint to the serving location with a model card, if it beats the served model."""
    from lemon_core.stages import stage_publish

    cfg = _config(config)
    from lemon_core.stages import gate_decision, read_summaries

    decision = gate_decision(cfg, read_summaries(summaries))
    if not (decision.publish or force):
        typer.echo(f"not published: {decision.reason}")
        raise typer.Exit(code=0)
    typer.echo(stage_publish(cfg, checkpoint, summaries))


def register(app: typer.Typer) -> None:
    """Add the stage commands to the main ``lemon`` app."""
    app.command("prepare")(prepare_command)
    app.command("rollout")(rollout_command)
    app.command("train-step")(train_step_command)
    app.command("report")(report_command)
    app.command("publish")(publish_command)
