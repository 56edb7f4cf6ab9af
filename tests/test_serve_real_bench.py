"""bench/serve_real.py without real models: its argument checks, the pool it writes, the stand-in level that
stops answering, the log scan, and its client loop (SDK + HTTP, deliberate disconnects) against the app over
test doubles on a real uvicorn. The measurement itself is the bench's to run (docs/serving.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import yaml
from bench_modules import load_bench  # tests/ is on sys.path
from test_serve_uvicorn import doubles_app, serve_in_thread

bench = load_bench("serve_real.py", "serve_real_bench")
common = load_bench("serve_common.py", "serve_common")


def test_arguments_name_the_flag_and_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEMON_BENCH_ORCHESTRATOR", raising=False)
    for argv, says in (([], "--orchestrator: give a trained orchestrator"),
                       (["--orchestrator", str(tmp_path / "nope")], "does not exist; run `make run`"),
                       (["--orchestrator", str(tmp_path), "--clients", "0"], "--clients=0: must be in 1..256"),
                       (["--orchestrator", str(tmp_path), "--seconds", "0"], "--seconds=0: must be in")):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert says in capsys.readouterr().err
    args = bench.parse_args(["--orchestrator", str(tmp_path), "--clients", "3"])
    assert args.max_concurrent == 3  # the limit defaults to the clients: no 429 from the bench's own load


def test_written_pool_caps_tokens_and_swaps_the_last_level_for_the_dead_one(tmp_path: Path) -> None:
    from lemon_core.pool import load_pool

    capped = load_pool(str(bench.write_pool("cpu", tmp_path / "a.yaml", 48)))
    assert [lv.max_tokens for lv in capped.levels] == [min(48, lv.max_tokens) for lv in load_pool("cpu").levels]
    dead = yaml.safe_load(bench.write_pool("cpu", tmp_path / "b.yaml", None, dead_url="http://u:p@127.0.0.1:9/v1")
                          .read_text())["levels"]
    assert dead[0]["backend"] == "transformers" and dead[-1]["backend"] == "openai"
    assert dead[-1]["name"] == load_pool("cpu").levels[-1].name and dead[-1]["base_url"].startswith("http://u:p@")


def test_dead_level_answers_then_hangs() -> None:
    with bench.dead_level_server() as level:
        url = level.base_url.replace(f"bench:{bench.DEAD_LEVEL_PASSWORD}@", "")
        body = {"model": "dead-level", "messages": [{"role": "user", "content": "hi"}]}
        ok = httpx.post(f"{url}/chat/completions", json=body, auth=("bench", bench.DEAD_LEVEL_PASSWORD))
        assert ok.json()["choices"][0]["message"]["content"] == "The answer is 42."
        level.dead.set()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/chat/completions", json=body, timeout=0.5)
        assert level.calls == {"answered": 1, "hung": 1}


def test_log_scan_finds_tracebacks_credentials_and_500s() -> None:
    clean = 'INFO: 127.0.0.1:1 - "POST /v1/orchestrate HTTP/1.1" 200 OK\nHTTP Request: POST http://***@h/v1\n'
    assert bench.scan_log(clean) == {"tracebacks": 0, "credentials": 0, "status_500": 0}
    dirty = (f'Traceback (most recent call last):\nHTTP Request: POST http://bench:{bench.DEAD_LEVEL_PASSWORD}@h\n'
             'INFO: 127.0.0.1:1 - "POST /v1/orchestrate HTTP/1.1" 500 Internal Server Error\n')
    assert bench.scan_log(dirty) == {"tracebacks": 1, "credentials": 1, "status_500": 1}


def test_clients_count_answers_disconnects_and_the_report_judges_them(tmp_path: Path) -> None:
    app = doubles_app(tmp_path, max_concurrent_requests=4)
    (tmp_path / "tokens").write_text(common.TOKEN + "\n")  # the bench's token (the file is re-read on change)
    with serve_in_thread(app) as url:
        seq = asyncio.run(bench.sequential(url, ["What is 40 + 2?", "And 1 + 1?"], timeout_s=30))
        load = asyncio.run(bench.concurrent(url, ["q1", "q2", "q3"], clients=4, seconds=1.0, timeout_s=30,
                                            disconnect_every=3, disconnect_after_s=1e-4))
    assert seq.statuses == {200: 2} and len(seq.latencies) == 2
    assert load.ok > 0 and load.statuses[common.DISCONNECTED] > 0  # both kinds of client ran
    assert set(load.statuses) <= {200, common.DISCONNECTED} and load.errors() == 0
    report = bench.Report(seq, load, common.LoadStats(), 0.0, common.LoadStats(), {}, 100.0, 100.5, 101.0, 120.0,
                          logs={"tracebacks": 0, "credentials": 0, "status_500": 0})
    assert report.failures() == []
    lines = report.lines(bench.parse_args(["--orchestrator", str(tmp_path)]))
    assert lines[-1] == f"ratio={load.throughput / seq.throughput:.2f}" and "rss_growth_mb=1.0" in "\n".join(lines)
    assert "rss_growth_after_warmup_mb=0.5" in "\n".join(lines)
    report.load.statuses[500] += 1
    report.logs["credentials"] = 1
    assert report.failures() == ["a request was answered 500", "errors other than the 429s the limit asks for",
                                 "the server log holds a credential"]
