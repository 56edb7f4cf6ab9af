"""GitHub Actions workflows (.github/workflows): structure, commands and secret handling.

GitHub is not reachable from here, so the workflows are checked as data: triggers, jobs, the commands
they run (they must be the project's real entry points), and that secrets only enter through `env:`
or `with:` (never pasted into a shell line, never literal). actionlint runs too where it is installed.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
DATASETS = ROOT.parent / "shared" / "datasets"
SECRET_REF = re.compile(r"\$\{\{\s*secrets\.([A-Za-z0-9_]+)\s*\}\}")
LITERAL_SECRET = re.compile(r"(ghp_[A-Za-z0-9]{20,}|github_pat_|AKIA[0-9A-Z]{16}|"
                            r"-----BEGIN [A-Z ]*PRIVATE KEY|xox[abp]-|eyJ[A-Za-z0-9_-]{20,}\.)")


def _load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the bare key `on` as the boolean True.
    data["on"] = data.pop(True, data.get("on"))
    return data


def _steps(workflow: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for job in workflow["jobs"].values():
        yield from job.get("steps", [])


def _runs(workflow: dict[str, Any]) -> str:
    return "\n".join(step.get("run", "") for step in _steps(workflow))


def _uses(workflow: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {step["uses"].split("@")[0]: step for step in _steps(workflow) if "uses" in step}


def _walk(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every string in a workflow with the key path leading to it."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, (*path, str(key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, (*path, str(i)))
    elif isinstance(node, str):
        yield path, node


ALL = sorted(p.name for p in WORKFLOWS.glob("*.yml"))


def test_the_three_workflows_exist() -> None:
    assert ALL == ["images.yml", "retrain.yml", "test.yml"]


# --- every workflow -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_least_privilege_and_pinned_actions(name: str) -> None:
    workflow = _load(name)
    assert workflow["permissions"].get("contents") == "read", f"{name}: set top-level permissions"
    assert not any(v == "write-all" for v in workflow["permissions"].values())
    for job_name, job in workflow["jobs"].items():
        assert job.get("timeout-minutes"), f"{name}/{job_name}: a hung job would burn 6 hours"
        assert job["runs-on"] != "ubuntu-latest", f"{name}/{job_name}: pin the runner image"
    for step in _steps(workflow):
        if "uses" in step:
            ref = step["uses"].partition("@")[2]
            pinned = re.fullmatch(r"v\d+(\.\d+){0,2}|[0-9a-f]{40}", ref)
            assert pinned, f"{name}: {step['uses']} is not pinned"


@pytest.mark.parametrize("name", ALL)
def test_secrets_enter_only_through_env_or_with(name: str) -> None:
    workflow = _load(name)
    text = (WORKFLOWS / name).read_text()
    assert not LITERAL_SECRET.search(text), f"{name}: a literal credential"
    for path, value in _walk(workflow):
        if SECRET_REF.search(value):
            assert "env" in path or "with" in path, f"{name}: secret used at {'.'.join(path)}"
            assert path[-1] != "run"


def test_secret_rules_fire_on_offenders() -> None:
    bad = {"jobs": {"j": {"steps": [{"run": "curl -H 'Authorization: ${{ secrets.KFP_TOKEN }}' x"}]}}}
    offending = [p for p, v in _walk(bad) if SECRET_REF.search(v)]
    assert offending == [("jobs", "j", "steps", "0", "run")]
    assert LITERAL_SECRET.search("token: ghp_" + "a" * 36) and LITERAL_SECRET.search("AKIAABCDEFGHIJKLMNOP")


# --- test.yml -----------------------------------------------------------------------------------
def test_test_workflow_runs_the_readme_test_command() -> None:
    workflow = _load("test.yml")
    assert "pull_request" in workflow["on"] and workflow["on"]["push"]["branches"] == ["main"]
    runs = [step.get("run", "").strip() for step in _steps(workflow)]
    assert "bash .ci/run" in runs
    # .ci/run is the CI entry point; it must run the README's test command.
    readme = (ROOT / "README.md").read_text()
    ci_run = (ROOT / ".ci" / "run").read_text()
    command = r"^(make test|bash \.ci/run|\S*pytest\S*.*?)\s*(?:#.*)?$"
    test_commands = re.findall(command, readme, re.MULTILINE)
    assert test_commands, "README names no test command"
    assert test_commands[0] in ci_run or test_commands[0] == "bash .ci/run"
    assert workflow["env"]["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


def _dataset_manifest() -> list[tuple[str, str, str]]:
    run = next(s["run"] for s in _steps(_load("test.yml")) if "MANIFEST" in s.get("run", ""))
    gh_raw = re.search(r"^gh_raw=(\S+)$", run, re.MULTILINE)
    assert gh_raw, "the step defines gh_raw"
    body = run.split("<<MANIFEST", 1)[1].split("\nMANIFEST", 1)[0].replace("$gh_raw", gh_raw.group(1))
    return [tuple(line.split()) for line in body.strip().splitlines()]  # type: ignore[misc]


def test_dataset_manifest_matches_the_shared_copy() -> None:
    """The files CI downloads must be the ones tests use here: same paths, same sha256."""
    manifest = _dataset_manifest()
    assert {path.split("/")[0] for path, _, _ in manifest} == {
        "aqua", "gsm8k", "humaneval", "multiarith", "svamp", "mmlu"}
    for _, url, sha in manifest:
        assert url.startswith("https://raw.githubusercontent.com/") and re.search(r"/[0-9a-f]{40}/", url), url
        assert re.fullmatch(r"[0-9a-f]{64}", sha)
    readme = DATASETS / "README.md"
    if not readme.exists():
        pytest.skip(f"{DATASETS} not beside the checkout; URL and hash shapes checked only")
    listed = dict(re.findall(r"^\| (\S+) \| \d+ \| `([0-9a-f]{64})` \|$", readme.read_text(), re.MULTILINE))
    for path, _, sha in manifest:
        assert listed[path] == sha, path
        local = DATASETS / path
        if local.exists():
            assert hashlib.sha256(local.read_bytes()).hexdigest() == sha, path


# --- images.yml ---------------------------------------------------------------------------------
def test_images_workflow_builds_and_pushes_the_three_images() -> None:
    workflow = _load("images.yml")
    assert workflow["on"]["push"]["tags"] == ["v*"] and workflow["on"]["push"]["branches"] == ["main"]
    assert workflow["permissions"]["packages"] == "write"
    (job,) = workflow["jobs"].values()
    matrix = {m["image"]: m["dockerfile"] for m in job["strategy"]["matrix"]["include"]}
    assert matrix == {"lemon-cpu": "images/Dockerfile.cpu", "lemon-gpu": "images/Dockerfile.gpu",
                      "lemon-serve": "images/Dockerfile.serve"}
    assert all((ROOT / f).is_file() for f in matrix.values())
    uses = _uses(workflow)
    build = uses["docker/build-push-action"]["with"]
    assert build["context"] == "." and build["file"] == "${{ matrix.dockerfile }}"
    assert build["push"] == "${{ github.event_name != 'pull_request' }}"
    assert build["tags"] == "${{ steps.meta.outputs.tags }}"
    login = uses["docker/login-action"]
    assert login["if"] == "github.event_name != 'pull_request'"
    assert login["with"]["password"] == "${{ secrets.GITHUB_TOKEN }}"
    assert "type=semver,pattern={{version}}" in uses["docker/metadata-action"]["with"]["tags"]
    # The chart's default images are the ones this workflow publishes.
    values = yaml.safe_load((ROOT / "charts" / "lemon" / "values.yaml").read_text())
    published = {values["image"]["repository"].rsplit("/", 1)[1],
                 values["vllm"]["image"]["repository"].rsplit("/", 1)[1]}
    assert published <= set(matrix)


# --- retrain.yml --------------------------------------------------------------------------------
def test_retrain_triggers() -> None:
    on = _load("retrain.yml")["on"]
    (schedule,) = on["schedule"]
    fields = schedule["cron"].split()
    assert len(fields) == 5 and fields[0].isdigit() and fields[1].isdigit(), schedule
    inputs = on["workflow_dispatch"]["inputs"]
    assert inputs["config"]["required"] is True and inputs["config"]["type"] == "string"
    assert inputs["pipeline"]["options"] == ["train", "eval"]
    assert on["push"]["branches"] == ["main"]
    assert "configs/**" in on["push"]["paths"] and any("manifest" in p for p in on["push"]["paths"])


def test_retrain_compiles_then_submits_with_cluster_secrets() -> None:
    workflow = _load("retrain.yml")
    (job,) = workflow["jobs"].values()
    steps = job["steps"]
    names = [s.get("name", s.get("uses", "")) for s in steps]
    compile_at = next(i for i, s in enumerate(steps) if "lemon pipeline compile" in s.get("run", ""))
    submit_at = next(i for i, s in enumerate(steps) if "lemon pipeline submit" in s.get("run", ""))
    install_at = next(i for i, s in enumerate(steps) if "pip install" in s.get("run", ""))
    assert install_at < compile_at < submit_at, names
    assert steps[compile_at]["run"].strip() == 'lemon pipeline compile --config "$LEMON_CONFIG" --out build'
    submit = steps[submit_at]
    cmd = " ".join(submit["run"].replace("\\\n", " ").split())
    assert 'lemon pipeline submit --host "$KFP_HOST" --experiment "$LEMON_EXPERIMENT"' in cmd
    assert '--config "$LEMON_CONFIG" --pipeline "$LEMON_PIPELINE" --token-env LEMON_KFP_TOKEN' in cmd
    assert submit["env"]["KFP_HOST"] == "${{ secrets.KFP_HOST }}"
    assert submit["env"]["LEMON_KFP_TOKEN"] == "${{ secrets.KFP_TOKEN }}"
    # The token never appears on a command line (it would show in process listings).
    assert "$LEMON_KFP_TOKEN" not in cmd and "${LEMON_KFP_TOKEN" not in cmd
    assert job["environment"] == "kubeflow" and "fork" in job["if"]
    assert workflow["concurrency"]["cancel-in-progress"] is False
    # CPU torch for compile/submit: never the multi-GB CUDA wheel.
    assert workflow["env"]["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert "torch==2.13.0" in steps[install_at]["run"]


def test_retrain_uses_only_flags_the_cli_has() -> None:
    """Every `lemon pipeline <cmd> --flag` in the workflow must exist in the real Typer app."""
    from typer.testing import CliRunner

    from lemon_core.cli_pipeline import pipeline_app

    runs = _runs(_load("retrain.yml")).replace("\\\n", " ")
    used = re.findall(r"lemon pipeline (\w+)([^\n|]*)", runs)
    assert {cmd for cmd, _ in used} == {"compile", "submit"}
    for cmd, rest in used:
        result = CliRunner().invoke(pipeline_app, [cmd, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
        assert result.exit_code == 0, result.output
        for flag in re.findall(r"(--[a-z][a-z-]*)", rest):
            assert flag in result.output, f"`lemon pipeline {cmd}` has no {flag}"


def test_retrain_default_config_is_a_pipeline_config() -> None:
    workflow = _load("retrain.yml")
    default = workflow["on"]["workflow_dispatch"]["inputs"]["config"]["default"]
    assert default in workflow["env"]["LEMON_CONFIG"]
    path = ROOT / default
    if not path.exists():
        pytest.skip(f"{default} (retrain.yml's default cluster config) is not in the repository yet")
    from lemon_core.stages import PipelineConfig

    PipelineConfig.model_validate(yaml.safe_load(path.read_text()))


# --- actionlint ---------------------------------------------------------------------------------
def test_actionlint_is_clean() -> None:
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint not installed; the structural checks above still ran")
    result = subprocess.run([actionlint, "-no-color", *map(str, sorted(WORKFLOWS.glob("*.yml")))],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
