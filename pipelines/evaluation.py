"""``lemon-eval``: prepare -> ParallelFor over (method, benchmark) cells -> one report.

Methods are baselines (cot, sc, chain, tree, complete, debate) and, when ``checkpoint_uri`` is given,
the trained orchestrator (``lemon``). The cells are fixed when the pipeline is built (from
``cfg.evaluate``), because a KFP ParallelFor over a static list shows every cell in the UI.
"""

from typing import Any

from kfp import dsl

from components import evaluate, prepare_dataset
from lemon_core.stages import PipelineConfig, eval_matrix
from pipelines.placement import on_gpu, with_storage

PIPELINE_NAME = "lemon-eval"


def build(cfg: PipelineConfig, local: bool = False) -> Any:
    k8s = cfg.kubernetes
    prepare_op, eval_op = prepare_dataset.make(k8s.image), evaluate.make(k8s.gpu_image)
    report_op = evaluate.make_report(k8s.image)
    matrix = eval_matrix(cfg)

    @dsl.pipeline(
        name=PIPELINE_NAME,
        description="Evaluate methods x benchmarks on one capacity pool; accuracy-vs-cost report.",
    )
    def lemon_eval(config_json: str = cfg.model_dump_json(), checkpoint_uri: str = "") -> None:
        prep = with_storage(prepare_op(config_json=config_json).set_display_name("prepare"), k8s, local)
        with dsl.ParallelFor(matrix, parallelism=cfg.rollout_parallelism, name="eval-matrix") as cell:
            ev = on_gpu(
                eval_op(
                    config_json=config_json,
                    manifest_uri=prep.outputs["manifest_uri"],
                    method=cell.method,
                    benchmark=cell.benchmark,
                    checkpoint_uri=checkpoint_uri,
                ).set_display_name("evaluate"),
                k8s,
                local,
            )
        with_storage(
            report_op(config_json=config_json, summary_uris=dsl.Collected(ev.output)).set_display_name(
                "report"
            ),
            k8s,
            local,
        )

    return lemon_eval
