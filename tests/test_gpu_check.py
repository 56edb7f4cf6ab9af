"""bench/gpu_check.sh and bench/gpu_check.py: the GPU check runs end to end on the CPU (so it is not stale when
a GPU slot comes), prints one ``ok`` line per check, and a failing or hanging check is reported without
hiding the others."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
from bench_modules import load_bench  # tests/ is on sys.path
from tiny_models import build_tiny_chat_model

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_check.sh"


def _gpu_check() -> ModuleType:
    return load_bench("gpu_check.py", "gpu_check")


def _run(*args: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_every_check_passes_on_the_cpu() -> None:
    proc = _run("--device", "cpu")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("check ")]
    names = [line.split(":")[0].removeprefix("check ") for line in lines]
    assert names == list(_gpu_check().CHECKS), proc.stdout + proc.stderr
    failed = [line for line in lines if not line.split(": ", 1)[1].startswith("ok ")]
    assert not failed, "\n".join(failed) + proc.stderr
    assert proc.returncode == 0, proc.stderr
    figures = dict(line.split(": ", 1) for line in lines)
    assert "max|w_fsdp - w_replicate|=" in figures["check fsdp_ws1"]
    assert "V=151936" in figures["check logprobs_152k"]
    assert "4/4 identical" in figures["check sampler_parity"]


def test_a_failing_or_hanging_check_is_one_fail_line(capsys: pytest.CaptureFixture[str]) -> None:
    gc = _gpu_check()
    ctx = gc.Context("cpu", gc.SIZES["cpu"], Path("unused"))

    def wrong(ctx: object) -> str:
        raise gc.CheckFailed("weights differ by 1.0")

    def broken(ctx: object) -> str:
        raise RuntimeError("CUDA error: out of memory\nmore detail")

    def hangs(ctx: object) -> str:
        while True:
            time.sleep(0.01)

    assert gc.run_check("wrong", wrong, ctx, budget_s=5) is False
    assert gc.run_check("broken", broken, ctx, budget_s=5) is False
    assert gc.run_check("hangs", hangs, ctx, budget_s=1) is False
    assert gc.run_check("fine", lambda ctx: "3 tok/s", ctx, budget_s=5) is True
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("check wrong: FAIL weights differ by 1.0 [")
    assert out[1].startswith("check broken: FAIL RuntimeError: CUDA error: out of memory [")
    assert out[2].startswith("check hangs: FAIL TimeoutError: over its 1 s budget [")
    assert out[3].startswith("check fine: ok 3 tok/s [")


def test_sampler_parity_fails_on_a_real_token_difference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device that samples different tokens (not at a near-tie) is a FAIL, not a silent pass."""

    gc = _gpu_check()
    ctx = gc.Context("cpu", gc.SIZES["cpu"], build_tiny_chat_model(tmp_path / "tiny", seed=0))
    real = gc.tiny_policy

    def device_policy_with_other_weights(ctx: object, dtype: str = "float32", device: str | None = None) -> object:
        policy = real(ctx, dtype, device)
        if device is None:  # the "device" side: perturb it so its greedy tokens change
            import torch

            with torch.no_grad():
                policy.model.lm_head.weight.mul_(-1.0)
        return policy

    monkeypatch.setattr(gc, "tiny_policy", device_policy_with_other_weights)
    with pytest.raises(gc.CheckFailed, match="not a near-tie"):
        gc.check_sampler_parity(ctx)


def test_bad_device_is_refused_with_the_fix() -> None:
    proc = _run("--device", "tpu", timeout=30)
    assert proc.returncode == 2
    assert "--device tpu: use cuda or cpu" in proc.stderr


# --- bench/engines.py -------------------------------------------------------------------------------
def _engines() -> ModuleType:
    return load_bench("engines.py", "engines_bench")


@pytest.mark.slow
def test_engine_bench_quick_run_on_a_tiny_model(tmp_path: Path) -> None:
    """--quick on a tiny model: every prompt gets exactly 32 tokens (end-of-turn suppressed, so engines do the
    same work), one row per batch size with its figures, a missing vLLM is skipped, and the ratio line ends it."""

    model = build_tiny_chat_model(tmp_path / "tiny", seed=0)
    out = tmp_path / "engines.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "engines.py"), "--quick", "--model", str(model), "--engines",
         "transformers", "transformers-unfused", "transformers-dense", "transformers-fp32-head", "vllm",
         "--vllm-python", str(tmp_path / "no-python"), "--json", str(out)],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("vllm: not installed, skipped") for line in lines)
    assert lines[-1].startswith("ratio=nan (no other engine ran")
    for engine in ("transformers", "transformers-unfused", "transformers-dense", "transformers-fp32-head"):
        rows = json.loads(out.read_text())[engine]["rows"]
        assert [(r["batch"], r["tokens"]) for r in rows] == [(1, 32), (8, 8 * 32)]
        assert all(r["tok_s"] > 0 and r["prefill_s"] > 0 for r in rows)
        assert json.loads(out.read_text())[engine]["peak_rss_mib"] > 50
    for engine in ("transformers-dense", "transformers-fp32-head"):  # the same work in each, printed by name
        assert any(re.match(rf"{engine} +threads=default batch= 8 tokens=  256", line) for line in lines)


def test_ratio_is_the_default_engine_over_the_best_other(capsys: pytest.CaptureFixture[str]) -> None:
    def rows(*rates: float) -> dict:
        return {"rows": [{"batch": b, "tok_s": r} for b, r in zip((8, 32), rates, strict=True)]}

    results = {"transformers": rows(30.0, 36.0), "transformers-dense": rows(50.0, 90.0), "vllm": rows(50.0, 60.0),
               "llamacpp": rows(40.0, 45.0)}
    assert _engines().print_ratio(results, 32) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "best other engine at batch 32: vllm 60.00 tok/s"  # lemon's other variants are not rivals
    assert out[-1] == "ratio=0.600"
    assert _engines().baseline_ratio(results, 32) == pytest.approx(0.6)
    assert _engines().baseline_ratio({"transformers": rows(30.0, 36.0)}, 32) is None


def test_rounds_report_each_figures_median_and_the_largest_peak() -> None:
    def run(tok_s: float, prefill_s: float, rss: float) -> dict:
        row = {"batch": 32, "tokens": 4096, "seconds": 4096 / tok_s, "tok_s": tok_s, "prefill_s": prefill_s,
               "decode_tok_s": tok_s * 1.2}
        return {"rows": [row], "peak_rss_mib": rss}

    median = _engines().median_result([run(130.0, 5.1, 4600), run(136.0, 4.6, 4700), run(131.0, 4.7, 4650)])
    [row] = median["rows"]
    assert (row["tok_s"], row["prefill_s"], row["decode_tok_s"]) == (131.0, 4.7, pytest.approx(157.2))
    assert row["tokens"] == 4096 and row["batch"] == 32 and median["peak_rss_mib"] == 4700


@pytest.mark.slow
def test_engine_bench_rounds_on_a_tiny_model(tmp_path: Path) -> None:
    """--rounds 2: every engine runs once per round, in turn; the medians and each round's ratio are printed."""

    model = build_tiny_chat_model(tmp_path / "tiny", seed=0)
    out = tmp_path / "engines.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "engines.py"), "--quick", "--model", str(model),
         "--engines", "transformers", "vllm", "--vllm-python", str(tmp_path / "no-python"), "--rounds", "2",
         "--json", str(out)],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for label in ("round 1/2 transformers", "round 2/2 transformers", "median of 2 transformers"):
        assert sum(line.startswith(label) for line in lines) == 2, label  # one row per batch size (1 and 8)
    assert "ratio per round: nan nan" in lines and lines[-1].startswith("ratio=nan (no other engine ran")
    saved = json.loads(out.read_text())
    assert len(saved["rounds"]["transformers"]) == 2
    tok_s = sorted(r["rows"][0]["tok_s"] for r in saved["rounds"]["transformers"])
    assert saved["transformers"]["rows"][0]["tok_s"] == pytest.approx(sum(tok_s) / 2)  # median of two
