"""What a careless user sees: every fixable mistake is one `error: ...` line and exit code 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _lemon(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "lemon_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, Path]:
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("iterations: [1, 2\n")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)))
    folder = tmp_path / "folder"
    folder.mkdir()
    return {"malformed": malformed, "binary": binary, "folder": folder}


def _one_clear_line(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "error:" in result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr[-2000:])


@pytest.mark.parametrize(("kind", "needle"), [("malformed", "not valid YAML"), ("binary", "not a text file"),
                                              ("folder", "is a folder")])
def test_train_and_pipeline_configs(bad_files: dict[str, Path], kind: str, needle: str) -> None:
    _one_clear_line(_lemon("train", "--config", str(bad_files[kind])), needle)
    _one_clear_line(_lemon("pipeline", "run", "--local", "--config", str(bad_files[kind])), needle)


def test_unknown_pool_missing_model_and_binary_pool(bad_files: dict[str, Path], tmp_path: Path) -> None:
    out = str(tmp_path / "run")
    _one_clear_line(_lemon("train", "--config", "train-tiny", "--out", out, "--pool", "nosuchpool"), "nosuchpool")
    _one_clear_line(_lemon("train", "--config", "train-tiny", "--out", out, "--model", str(tmp_path / "no-model")),
                    "cannot load the orchestrator model")
    _one_clear_line(_lemon("eval", "--benchmark", "multiarith", "--pool", str(bad_files["binary"])), "not a text file")
