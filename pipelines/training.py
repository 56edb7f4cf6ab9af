"""``lemon-train``: prepare -> SFT -> N x [ParallelFor rollout shards -> GRPO train] -> evaluate -> report
-> publish (only if the orchestrator beats the served model on ``publish.metric``).

KFP pipelines are static DAGs: a loop cannot run a data-dependent number of times, and a
sub-pipeline cannot call itself. So the N GRPO iterations are *unrolled when the pipeline is
built*: ``build(cfg)`` reads ``cfg.n_iterations`` and emits N (rollout ParallelFor, train) pairs,
each train consuming the previous checkpoint. Changing N means recompiling
(``lemon pipeline compile --config ...``); everything else (data, model, pool, hyper-parameters,
placement) stays a run-time parameter inside ``config_json``. The rollout ParallelFor runs over the
static indices ``range(rollout_shards)`` and each pod resolves its shard from the manifest: kfp.local
cannot iterate over a list produced by an upstream task; a static list works in both places.
The (method, benchmark) evaluation matrix is likewise fixed at build time from ``cfg.evaluate``.
"""

from typing import Any, List  # noqa: UP035 - kfp reads typing.List in component signatures

from kfp import dsl

from components import evaluate, prepare_dataset, publish, rollout, sft, train
from lemon_core.stages import ORCHESTRATOR, PipelineConfig
from pipelines.evaluation import eval_cells
from pipelines.placement import on_gpu, with_storage

PIPELINE_NAME = "lemon-train"


def build(cfg: PipelineConfig, local: bool = False) -> Any:
    """The lemon-train pipeline function for this config's structure (iterations, eval matrix)."""
    k8s = cfg.kubernetes
    cpu, gpu = k8s.image, k8s.gpu_image
    prepare_op, rollout_op, train_op = prepare_dataset.make(cpu), rollout.make(gpu), train.make(gpu)
    sft_op = sft.make(gpu)
    report_op, publish_op = evaluate.make_report(cpu), publish.make(cpu)
    methods = list(dict.fromkeys([ORCHESTRATOR, *cfg.evaluate.methods]))
    cells_pipeline = eval_cells(cfg, local, methods)

    @dsl.pipeline(name="rollout-shards", description="One rollout pod per train shard, in parallel.")
    def rollout_shards(config_json: str, manifest_uri: str, iteration: int, checkpoint_uri: str) -> List[str]:  # noqa: UP006
        # A sub-pipeline, so the manifest/checkpoint URIs arrive as its inputs: see eval_cells for why.
        with dsl.ParallelFor(
            list(range(cfg.rollout_shards)), parallelism=cfg.rollout_parallelism, name="shards"
        ) as shard:
            ro = on_gpu(
                rollout_op(
                    config_json=config_json,
                    manifest_uri=manifest_uri,
                    shard_index=shard,
                    iteration=iteration,
                    checkpoint_uri=checkpoint_uri,
                ).set_display_name("rollout"),
                k8s,
                local,
            )
        return dsl.Collected(ro.output)

    @dsl.pipeline(name="publish-gate", description="Publish only if the report says the candidate wins.")
    def publish_gate(config_json: str, publish: bool, checkpoint_uri: str, summary_uris: List[str]) -> None:  # noqa: UP006
        # The condition reads a sub-pipeline input: kfp.local cannot resolve a dsl.If on an upstream
        # task's output in the same DAG, while both it and the KFP backend resolve this form.
        with dsl.If(publish == True, name="beats-served-model"):  # noqa: E712 - kfp condition
            with_storage(
                publish_op(
                    config_json=config_json, checkpoint_uri=checkpoint_uri, summary_uris=summary_uris
                ).set_display_name("publish"),
                k8s,
                local,
            )

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="Train a LEMON orchestrator: SFT, GRPO with localized "
        "counterfactual credit, evaluation against baselines, gated publish.",
    )
    def lemon_train(config_json: str = cfg.model_dump_json()) -> None:
        prep = with_storage(
            prepare_op(config_json=config_json, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER).set_display_name("prepare"),
            k8s,
            local,
        )
        manifest = prep.outputs["manifest_uri"]
        sft = on_gpu(
            sft_op(config_json=config_json, manifest_uri=manifest).set_display_name("sft"),
            k8s,
            local,
        )
        checkpoint = sft.output
        for i in range(1, cfg.n_iterations + 1):
            shards = rollout_shards(
                config_json=config_json, manifest_uri=manifest, iteration=i, checkpoint_uri=checkpoint
            ).set_display_name(f"rollout-shards-{i}")
            step = on_gpu(
                train_op(
                    config_json=config_json,
                    records_uris=shards.output,
                    iteration=i,
                    checkpoint_uri=checkpoint,
                    reference_uri=sft.output,
                    run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                ).set_display_name(f"grpo-{i}"),
                k8s,
                local,
            )
            checkpoint = step.output
        cells = cells_pipeline(
            config_json=config_json, manifest_uri=manifest, checkpoint_uri=checkpoint, sft_uri=sft.output
        ).set_display_name("eval-matrix")
        rep = with_storage(
            report_op(config_json=config_json, summary_uris=cells.output).set_display_name(
                "report"
            ),
            k8s,
            local,
        )
        publish_gate(
            config_json=config_json, publish=rep.outputs["publish"], checkpoint_uri=checkpoint,
            summary_uris=cells.output,
        ).set_display_name("publish-gate")

    return lemon_train
