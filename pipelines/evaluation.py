"""``lemon-eval``: prepare -> ParallelFor over (method, benchmark) cells -> one report.

Methods are baselines (cot, sc, chain, tree, complete, debate) and, when ``checkpoint_uri`` is given,
the trained orchestrator (``lemon``). The cells are fixed when the pipeline is built (from
``cfg.evaluate``), because a KFP ParallelFor over a static list shows every cell in the UI.
"""

from typing import Any, List  # noqa: UP035 - kfp reads typing.List in component signatures

from kfp import dsl

from components import evaluate, prepare_dataset
from lemon_core.stages import PipelineConfig, eval_matrix
from pipelines.placement import on_gpu, with_storage

PIPELINE_NAME = "lemon-eval"


def eval_cells(cfg: PipelineConfig, local: bool, methods: list[str] | None = None) -> Any:
    """Sub-pipeline: ParallelFor over the (method, benchmark) cells -> their summary URIs.

    The fan-out lives in a sub-pipeline whose *inputs* carry the manifest and checkpoint URIs: inside
    a ParallelFor, kfp.local (2.17) hands a task the loop item in place of an upstream task's output
    (tests/test_pipelines.py runs the pipeline locally); a sub-pipeline input is resolved correctly
    by kfp.local and by the KFP backend alike.
    """
    k8s = cfg.kubernetes
    eval_op = evaluate.make(k8s.gpu_image)
    matrix = eval_matrix(cfg, methods) if methods is not None else eval_matrix(cfg)

    @dsl.pipeline(name="eval-matrix", description="Every (method, benchmark) cell, in parallel.")
    def eval_matrix_pipeline(config_json: str, manifest_uri: str, checkpoint_uri: str, sft_uri: str) -> List[str]:  # noqa: UP006
        with dsl.ParallelFor(matrix, parallelism=cfg.rollout_parallelism, name="cells") as cell:
            ev = on_gpu(
                eval_op(
                    config_json=config_json,
                    manifest_uri=manifest_uri,
                    method=cell.method,
                    benchmark=cell.benchmark,
                    checkpoint_uri=checkpoint_uri,
                    sft_uri=sft_uri,
                ).set_display_name("evaluate"),
                k8s,
                local,
            )
        return dsl.Collected(ev.output)

    return eval_matrix_pipeline


def build(cfg: PipelineConfig, local: bool = False) -> Any:
    k8s = cfg.kubernetes
    prepare_op = prepare_dataset.make(k8s.image)
    report_op = evaluate.make_report(k8s.image)
    cells_pipeline = eval_cells(cfg, local)

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="Evaluate methods x benchmarks on one capacity pool; accuracy-vs-cost report.",
    )
    def lemon_eval(config_json: str = cfg.model_dump_json(), checkpoint_uri: str = "") -> None:
        prep = with_storage(
            prepare_op(config_json=config_json, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER).set_display_name("prepare"),
            k8s,
            local,
        )
        cells = cells_pipeline(
            config_json=config_json, manifest_uri=prep.outputs["manifest_uri"], checkpoint_uri=checkpoint_uri,
            sft_uri="",
        ).set_display_name("eval-matrix")
        with_storage(
            report_op(config_json=config_json, summary_uris=cells.output).set_display_name(
                "report"
            ),
            k8s,
            local,
        )

    return lemon_eval
