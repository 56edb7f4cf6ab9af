"""bench/decode_ceiling.py on a tiny model: the product table, the step's split and the last line agree.

Its timings mean nothing at this size (a 64-wide model is all overhead); the test keeps the script from going
stale against the backend it measures (the fused decoder, its packed weights and the shared-prefix layout)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import build_tiny_chat_model  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "decode_ceiling.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_the_step_splits_into_products_and_the_rest_and_the_ratio_is_theirs(tmp_path: Path) -> None:
    model = build_tiny_chat_model(tmp_path / "tiny", seed=0)
    done = _run("--model", str(model), "--steps", "3", "--rounds", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    table = [line for line in lines if re.match(r"(qkv|o|gate_up|down|head) ", line)]
    assert [line.split()[0] for line in table] == ["qkv", "o", "gate_up", "down", "head"]
    assert all(len(re.findall(r"GFLOP/s", line)) == 4 for line in table)  # 1, 32, 128 and 1024 rows
    aggregate = re.search(r"a step's products: (.*)", done.stdout)
    assert aggregate, done.stdout
    by_rows = {int(r): float(g) for r, g in re.findall(r"(\d+) rows ([\d.]+) GFLOP/s", aggregate[1])}
    assert list(by_rows) == [1, 32, 128, 1024]

    step = re.search(r"batch 32: ([\d.]+) ms = products ([\d.]+) ms .* the rest (-?[\d.]+) ms", done.stdout)
    assert step, done.stdout
    assert float(step[2]) + float(step[3]) == pytest.approx(float(step[1]), abs=0.11)  # printed to 0.1 ms
    rates = re.search(r"products at 32 rows: ([\d.]+) GFLOP/s; at their best \((\d+) rows\): ([\d.]+) GFLOP/s",
                      done.stdout)
    assert rates, done.stdout
    assert float(rates[1]) == by_rows[32] and float(rates[3]) == max(by_rows.values()) == by_rows[int(rates[2])]
    assert lines[-1].startswith("ratio=")  # from the unrounded figures; the printed ones carry 0.05 of rounding
    assert float(lines[-1].removeprefix("ratio=")) == pytest.approx(by_rows[32] / by_rows[int(rates[2])], rel=0.02)


def test_bad_arguments_name_the_flag() -> None:
    done = _run("--steps", "0")
    assert done.returncode == 2 and "--steps and --rounds must be >= 1" in done.stderr
    missing = _run("--model", "/nonexistent/model", "--steps", "1")
    assert missing.returncode == 1 and "--model /nonexistent/model: " in missing.stderr
    assert "Traceback" not in missing.stderr
