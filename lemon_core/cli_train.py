"""``lemon train``: SFT warm-up then GRPO with localized counterfactual credit, from one YAML config.

Registered on the main CLI as ``lemon train``; also runnable alone: ``python -m lemon_core.cli_train``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError


def train_command(
    config: Annotated[
        Path,
        typer.Option(
            help="Training config YAML (e.g. lemon_core/configs/train-cpu.yaml, or a bundled name: "
            "train-cpu, train-cpu-format-sft, "
            "train-gpu, train-tiny). Any field can be overridden by LEMON_* env, nested with '__': "
            "LEMON_OPTIM__LR=1e-5, LEMON_ITERATIONS=10."
        ),
    ],
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue from OUT/checkpoints/latest: same step, optimizer, RNG and data order. "
            "Starts fresh when no checkpoint exists yet."
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Output folder (checkpoints/, metrics.jsonl, rollouts/, reward_curve.png); overrides `out:`."
        ),
    ] = None,
    iterations: Annotated[
        int | None, typer.Option(min=0, help="GRPO steps; overrides `iterations:`.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Orchestrator model (local path, `lemon models` alias or HF id); overrides `model:`."
        ),
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option(help="Capacity pool YAML or built-in name (cpu, gpu, simulated); overrides `pool:`."),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
) -> None:
    """Train an orchestrator: SFT warm-up, then N GRPO iterations (rollout -> counterfactuals -> update).

    Writes checkpoints atomically (kill it any time; --resume continues exactly), per-step metrics
    to OUT/metrics.jsonl and the reward curve to OUT/reward_curve.png. Multi-GPU/multi-node: launch
    `torchrun --nproc-per-node N -m lemon_core.cli_train --config ...` (each rank rolls out its share of
    the step's tasks, gradients are all-reduced, rank 0 writes; `distributed.strategy: fsdp` shards the
    model instead). On GPU, `rollout.sampler: vllm` samples specs with vLLM (weights reloaded after every
    update; `spec_format: json` + `rollout.vllm.guided_json: true` for schema-guided specs). See
    docs/training.md.
    """
    from lemon_core.train import TrainConfig, train

    overrides = {
        k: v
        for k, v in {
            "out": str(out) if out else None,
            "iterations": iterations,
            "model": model,
            "pool": pool,
        }.items()
        if v is not None
    }
    overrides["progress"] = progress
    try:
        cfg = TrainConfig.from_yaml(config, **overrides)
    except (FileNotFoundError, ValueError, ValidationError) as e:
        typer.secho(f"error: {e}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=2) from None
    try:
        result = train(cfg, resume=resume)
    finally:
        _leave_process_group()
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun only rank 0 reports
        typer.echo(json.dumps(result.model_dump(exclude={"metrics"}), indent=2))


def _leave_process_group() -> None:
    """Tear down torch.distributed (if torchrun started it) so ranks exit cleanly, not at interpreter exit."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main() -> None:
    typer.run(train_command)


if __name__ == "__main__":
    main()
