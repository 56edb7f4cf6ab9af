"""Compile, run locally (kfp.local) and submit (kfp.Client) the lemon pipelines.

Submit talks to the KFP v2 REST API through ``kfp.Client``; the calls it makes are
``POST /apis/v2beta1/pipelines/upload`` (multipart IR YAML, query ``name``) - or
``/apis/v2beta1/pipelines/upload_version`` when the pipeline exists - then
``GET/POST /apis/v2beta1/experiments`` (find or create the experiment by display name) and
``POST /apis/v2beta1/runs`` (a run of that pipeline version with ``config_json`` as its parameter).
"""

import json
import time
from pathlib import Path
from typing import Any

from lemon_core.stages import PipelineConfig

PIPELINES = ("train", "eval")


def _build(cfg: PipelineConfig, which: str, local: bool = False) -> Any:
    if which == "train":
        from pipelines.training import build
    elif which == "eval":
        from pipelines.evaluation import build
    else:
        raise ValueError(f"pipeline {which!r}: choose one of {PIPELINES}")
    return build(cfg, local=local)


def compile_pipeline(cfg: PipelineConfig, which: str, out: Path) -> Path:
    """Write the IR YAML of ``lemon-<which>`` for this config's structure."""
    from kfp import compiler

    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(
        _build(cfg, which), package_path=str(out), pipeline_parameters={"config_json": cfg.model_dump_json()}
    )
    return out


def run_local(cfg: PipelineConfig, which: str = "train", pipeline_root: Path | None = None) -> dict[str, Any]:
    """Run the pipeline in this Python environment with kfp.local's SubprocessRunner (offline: the
    components install nothing). Returns task outputs of interest and the wall time."""
    from kfp import local

    root = pipeline_root or Path(cfg.artifacts if "://" not in cfg.artifacts else "runs/kfp-local") / "kfp"
    local.init(
        runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root.resolve()), raise_on_error=True
    )
    start = time.perf_counter()
    pipeline = _build(cfg, which, local=True)
    task = pipeline(config_json=cfg.model_dump_json())
    return {"wall_s": time.perf_counter() - start, "task": task}


def submit(
    cfg: PipelineConfig,
    which: str,
    *,
    host: str,
    experiment: str,
    run_name: str | None = None,
    namespace: str | None = None,
    token: str | None = None,
    work_dir: Path | None = None,
) -> dict[str, str]:
    """Upload the compiled pipeline (a new version if it exists), then start a run in ``experiment``.
    The compiled package goes to ``work_dir`` (default: a fresh temporary folder, not the cwd)."""
    import tempfile

    import kfp

    folder = work_dir if work_dir is not None else Path(tempfile.mkdtemp(prefix="lemon-submit-"))
    package = compile_pipeline(cfg, which, folder / f"lemon-{which}.yaml")
    client = kfp.Client(host=host, namespace=namespace, existing_token=token)
    name = f"lemon-{which}"
    version = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    pipeline_id = client.get_pipeline_id(name)
    if pipeline_id is None:
        pipeline = client.upload_pipeline(str(package), pipeline_name=name)
        pipeline_id = pipeline.pipeline_id
        version_id = client.list_pipeline_versions(pipeline_id).pipeline_versions[0].pipeline_version_id
    else:
        version_id = client.upload_pipeline_version(
            str(package), pipeline_version_name=version, pipeline_id=pipeline_id
        ).pipeline_version_id
    exp = client.create_experiment(experiment, namespace=namespace)
    run = client.run_pipeline(
        experiment_id=exp.experiment_id,
        job_name=run_name or f"{cfg.name}-{version}",
        params={"config_json": cfg.model_dump_json()},
        pipeline_id=pipeline_id,
        version_id=version_id,
    )
    return {
        "pipeline_id": pipeline_id,
        "version_id": version_id,
        "experiment_id": exp.experiment_id,
        "run_id": run.run_id,
        "url": f"{host.rstrip('/')}/#/runs/details/{run.run_id}",
    }


def dumps(obj: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in obj.items() if k != "task"}, indent=2, default=str)
