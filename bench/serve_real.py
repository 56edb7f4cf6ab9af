"""Load and fault test of `lemon serve` on REAL models (no test doubles in the measured service).

`lemon serve --pool cpu` runs as a subprocess on 127.0.0.1 with a real orchestrator checkpoint (the one
`make run` publishes, or any `lemon train` output) and the pool's in-process models. The bench then:

1. sequential: the same MultiArith questions one at a time (the baseline throughput);
2. concurrent: --clients clients for --seconds, half with the official OpenAI SDK against
   /v1/chat/completions, half with plain HTTP against /v1/orchestrate, each looping over the questions;
   every --disconnect-every-th request of a client gives up after --disconnect-after-s (a client that
   disconnects mid-request: its work must stop and its slot come back);
3. SIGTERM with --clients requests in flight: each must get its answer or 503 shutting_down;
4. a dead level: a second `lemon serve` whose `large` level is an OpenAI-compatible server on loopback
   that the bench runs (a base_url with user:password@), answering at first and then no longer; requests
   must get answers or 503 backend_unavailable, never 500.

Printed: requests, errors by status, p50/p95 latency, throughput, peak and grown server RSS, the faults'
outcomes, what the server logs hold (tracebacks, credentials, 500s), and last
`ratio=<concurrent throughput / sequential throughput>`. Agents of concurrent requests share batched
forward passes (the service micro-batches requests; the executor batches each level's agents). Exit
status 1 when anything answered 500, a non-429 error came back, or a log held a traceback or credential.

    python bench/serve_real.py --orchestrator runs/local-cpu/publish/model --clients 8 --seconds 300

The dead level is the one stand-in: its answers are canned (``DeadLevelServer``); the fault under test is
that it stops answering. ``--agent-max-tokens`` caps the levels' answers to bound a run on a laptop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml
from serve_common import (
    DISCONNECTED,
    TOKEN,
    TRANSPORT_ERROR,
    LoadStats,
    free_port,
    proc_status_mb,
    rss_mb,
    token_file,
    wait_ready,
)

DEAD_LEVEL_PASSWORD = "bench-" + "s3cret-pw"  # must never appear in the service log
EXPECTED_STATUSES = frozenset({429})  # the only errors a run under load may show (the limit asks for them)


# --- the service under test ---------------------------------------------------------------------------
@dataclass
class Service:
    """A `lemon serve` subprocess and the file its log goes to."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def write_pool(pool: str, out: Path, agent_max_tokens: int | None, dead_url: str | None = None) -> Path:
    """The pool YAML the service gets: ``pool`` (a built-in name or file) with every level's max_tokens capped
    at ``agent_max_tokens`` and, with ``dead_url``, its last level replaced by an HTTP level at that URL."""
    from lemon_core.pool import load_pool

    levels = [level.model_dump(exclude_none=True) for level in load_pool(pool).levels]
    for level in levels:
        if agent_max_tokens is not None:
            level["max_tokens"] = min(level["max_tokens"], agent_max_tokens)
    if dead_url is not None:
        last = levels[-1]
        levels[-1] = {"name": last["name"], "backend": "openai", "model": "dead-level", "base_url": dead_url,
                      "timeout_s": 3.0, "price_in_per_1m": last["price_in_per_1m"],
                      "price_out_per_1m": last["price_out_per_1m"], "max_tokens": last["max_tokens"],
                      "options": {"max_retries": 0}}
    out.write_text(yaml.safe_dump({"description": "bench/serve_real.py pool", "levels": levels}, sort_keys=False))
    return out


def start_service(args: argparse.Namespace, pool_file: Path, log_path: Path, name: str) -> Service:
    port = free_port()
    env = {**os.environ, "LEMON_SHUTDOWN_GRACE_S": str(args.grace_s), "LEMON_LOG_LEVEL": "info"}
    cmd = [sys.executable, "-c", "from lemon_core.cli import main; main()", "serve", "--host=127.0.0.1",
           f"--port={port}", f"--pool={pool_file}", f"--orchestrator={args.orchestrator}",
           f"--auth-token-file={token_file()}", f"--max-concurrent-requests={args.max_concurrent}",
           f"--batch-max-size={args.batch_max_size}", f"--batch-wait-ms={args.batch_wait_ms}"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    print(f"[{name}] lemon serve pid {proc.pid} on {url}, log {log_path}", flush=True)
    wait_ready(url, timeout_s=600, alive=lambda: proc.poll() is None)
    return Service(proc, url, log_path)


def stop(service: Service, timeout_s: float = 60) -> float:
    """SIGTERM, then the seconds until the process exited (SIGKILL after ``timeout_s``)."""
    t0 = time.monotonic()
    if service.proc.poll() is None:
        service.proc.send_signal(signal.SIGTERM)
        try:
            service.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            service.proc.kill()
            service.proc.wait()
    return time.monotonic() - t0


def scan_log(text: str, secrets: tuple[str, ...] = (DEAD_LEVEL_PASSWORD,)) -> dict[str, int]:
    """What a service log must not hold: tracebacks, credentials, 500 answers (uvicorn's access log)."""
    return {"tracebacks": text.count("Traceback (most recent call last)") + text.count("Exception in ASGI"),
            "credentials": sum(text.count(s) for s in secrets),
            "status_500": len(re.findall(r'HTTP/1\.1" 500\b', text))}


# --- clients ------------------------------------------------------------------------------------------
def questions(n: int) -> list[str]:
    """The first ``n`` MultiArith test questions (LEMON_DATA_DIR or the shared datasets)."""
    from lemon_core.benchmarks import get

    return [example.question for example in get("multiarith").load(limit=n)]


async def ask(url: str, question: str, sdk: bool, timeout_s: float) -> int:
    """One request: the OpenAI SDK on /v1/chat/completions or plain HTTP on /v1/orchestrate; its status,
    DISCONNECTED when the client gave up after ``timeout_s``, TRANSPORT_ERROR without an HTTP answer."""
    import openai

    if sdk:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0, timeout=timeout_s)
        try:
            await client.chat.completions.create(model="lemon", messages=[{"role": "user", "content": question}],
                                                 extra_body={"benchmark": "multiarith"})
            return 200
        except openai.APITimeoutError:
            return DISCONNECTED
        except openai.APIStatusError as e:
            return e.status_code
        except openai.APIConnectionError:
            return TRANSPORT_ERROR
        finally:
            await client.close()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as http:
            resp = await http.post(f"{url}/v1/orchestrate", headers=headers,
                                   json={"task": question, "benchmark": "multiarith"})
        return resp.status_code
    except httpx.TimeoutException:
        return DISCONNECTED
    except httpx.HTTPError:
        return TRANSPORT_ERROR


async def timed(stats: LoadStats, url: str, question: str, sdk: bool, timeout_s: float) -> int:
    t0 = time.perf_counter()
    status = await ask(url, question, sdk, timeout_s)
    stats.statuses[status] += 1
    if status == 200:
        stats.latencies.append(time.perf_counter() - t0)
    return status


async def sequential(url: str, qs: list[str], timeout_s: float) -> LoadStats:
    stats = LoadStats()
    t0 = time.perf_counter()
    for k, q in enumerate(qs):
        await timed(stats, url, q, sdk=k % 2 == 0, timeout_s=timeout_s)
    stats.elapsed_s = time.perf_counter() - t0
    return stats


async def concurrent(url: str, qs: list[str], clients: int, seconds: float, timeout_s: float,
                     disconnect_every: int, disconnect_after_s: float,
                     after_first_wave: Any = None) -> LoadStats:
    """``clients`` loops until ``seconds`` are over (the requests then in flight finish);
    ``after_first_wave()`` is called once the first ``clients`` requests are done (the warm-up)."""
    stats = LoadStats()
    start = time.perf_counter()
    waves = [after_first_wave] if after_first_wave is not None else []

    async def client(cid: int) -> None:
        k = 0
        while time.perf_counter() - start < seconds:
            gives_up = disconnect_every > 0 and k % disconnect_every == disconnect_every - 1
            status = await timed(stats, url, qs[(cid + k * clients) % len(qs)], sdk=cid % 2 == 0,
                                 timeout_s=disconnect_after_s if gives_up else timeout_s)
            if waves and sum(stats.statuses.values()) >= clients:
                waves.pop()()
            if status == 429:
                await asyncio.sleep(1.0)  # Retry-After, as a polite client does
            k += 1

    await asyncio.gather(*(client(c) for c in range(clients)))
    stats.elapsed_s = time.perf_counter() - start
    return stats


async def wave_with_sigterm(service: Service, qs: list[str], n: int, after_s: float, timeout_s: float,
                            ) -> tuple[LoadStats, float]:
    """``n`` requests at once, SIGTERM ``after_s`` later; their statuses and the seconds the drain took."""
    stats = LoadStats()
    t0 = time.perf_counter()
    requests = [asyncio.ensure_future(timed(stats, service.url, qs[k % len(qs)], k % 2 == 0, timeout_s))
                for k in range(n)]
    await asyncio.sleep(after_s)
    drained = await asyncio.to_thread(stop, service)
    await asyncio.gather(*requests)
    stats.elapsed_s = time.perf_counter() - t0
    return stats, drained


# --- the level that stops answering -------------------------------------------------------------------
class DeadLevelServer(ThreadingHTTPServer):
    """A loopback OpenAI-compatible server for one level: canned answers until ``dead`` is set, then it
    accepts requests and never answers them (a hung model server)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _DeadLevelHandler)
        self.dead = threading.Event()
        self.closing = threading.Event()
        self.calls: Counter[str] = Counter()  # "answered" / "hung"
        self.auth_seen: set[str] = set()

    @property
    def base_url(self) -> str:
        return f"http://bench:{DEAD_LEVEL_PASSWORD}@127.0.0.1:{self.server_address[1]}/v1"


class _DeadLevelHandler(BaseHTTPRequestHandler):
    server: DeadLevelServer

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # /v1/models for /readyz
        self._send({"object": "list", "data": [{"id": "dead-level", "object": "model"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.auth_seen.add(self.headers.get("Authorization", ""))
        if self.server.dead.is_set():
            self.server.calls["hung"] += 1
            self.server.closing.wait(120)
            return
        self.server.calls["answered"] += 1
        self._send({"id": "x", "object": "chat.completion", "created": 0, "model": "dead-level",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "The answer is 42."},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}})

    def _send(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)


@contextlib.contextmanager
def dead_level_server() -> Iterator[DeadLevelServer]:
    server = DeadLevelServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.closing.set()
        server.shutdown()
        server.server_close()


# --- the run ------------------------------------------------------------------------------------------
@dataclass
class Report:
    seq: LoadStats
    load: LoadStats
    sigterm: LoadStats
    drained_s: float
    dead: LoadStats
    dead_calls: Counter[str]
    rss_start_mb: float
    rss_warm_mb: float  # after the first wave of concurrent requests: batch-sized buffers exist by then
    rss_end_mb: float
    peak_rss_mb: float
    logs: dict[str, int] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.load.throughput / self.seq.throughput if self.seq.throughput else float("nan")

    def failures(self) -> list[str]:
        """What breaks the issue's rules (empty: the run passed)."""
        found = []
        everything = [self.seq, self.load, self.sigterm, self.dead]
        if any(s.statuses.get(500, 0) for s in everything) or self.logs.get("status_500"):
            found.append("a request was answered 500")
        if self.seq.errors() or self.load.errors(EXPECTED_STATUSES):
            found.append("errors other than the 429s the limit asks for")
        if self.sigterm.errors(frozenset({503})) or self.dead.errors(frozenset({503})):
            found.append("a request under a fault got neither an answer nor a 4xx/503")
        if self.logs.get("tracebacks"):
            found.append("the server log holds a traceback")
        if self.logs.get("credentials"):
            found.append("the server log holds a credential")
        return found

    def lines(self, args: argparse.Namespace) -> list[str]:
        requests = sum(self.load.statuses.values())
        return [
            f"orchestrator={args.orchestrator} pool={args.pool} agent_max_tokens={args.agent_max_tokens} "
            f"clients={args.clients} limit={args.max_concurrent} batch_wait_ms={args.batch_wait_ms:g}",
            f"sequential: {self.seq.status_line()} seconds={self.seq.elapsed_s:.1f} "
            f"throughput_rps={self.seq.throughput:.4f}",
            f"concurrent: {self.load.status_line()} seconds={self.load.elapsed_s:.1f} "
            f"errors_other_than_429={self.load.errors(EXPECTED_STATUSES)}",
            f"latency_p50_ms={self.load.quantile_ms(50):.0f} latency_p95_ms={self.load.quantile_ms(95):.0f} "
            f"throughput_rps={self.load.throughput:.4f}",
            f"rss_start_mb={self.rss_start_mb:.1f} rss_warm_mb={self.rss_warm_mb:.1f} "
            f"rss_end_mb={self.rss_end_mb:.1f} rss_growth_mb={self.rss_end_mb - self.rss_start_mb:.1f} "
            f"rss_growth_after_warmup_mb={self.rss_end_mb - self.rss_warm_mb:.1f} (over {requests} requests) "
            f"peak_rss_mb={self.peak_rss_mb:.1f}",
            f"sigterm: {self.sigterm.status_line()} drained_s={self.drained_s:.1f}",
            f"dead level: {self.dead.status_line()} level_calls={dict(self.dead_calls)}",
            f"logs: {' '.join(f'{k}={v}' for k, v in self.logs.items())}",
            f"result: {'PASS' if not self.failures() else 'FAIL: ' + '; '.join(self.failures())}",
            f"ratio={self.ratio:.2f}",
        ]


async def run(args: argparse.Namespace, work: Path) -> Report:
    qs = questions(args.questions)
    pool_file = write_pool(args.pool, work / "pool.yaml", args.agent_max_tokens)
    main = start_service(args, pool_file, work / "serve.log", "main")
    try:
        seq = await sequential(main.url, qs, args.timeout_s)
        print(f"[main] sequential done: {seq.status_line()} in {seq.elapsed_s:.1f} s", flush=True)
        rss_start = rss_mb(main.proc.pid)
        warm: list[float] = []
        load = await concurrent(main.url, qs, args.clients, args.seconds, args.timeout_s, args.disconnect_every,
                                args.disconnect_after_s, lambda: warm.append(rss_mb(main.proc.pid)))
        print(f"[main] concurrent done: {load.status_line()} in {load.elapsed_s:.1f} s", flush=True)
        await asyncio.sleep(args.disconnect_after_s)  # abandoned work ends; what stays is growth
        rss_end, peak = rss_mb(main.proc.pid), proc_status_mb(main.proc.pid, "VmHWM")
        sigterm, drained = await wave_with_sigterm(main, qs, args.clients, args.sigterm_after_s, args.timeout_s)
        print(f"[main] sigterm done: {sigterm.status_line()}, drained in {drained:.1f} s", flush=True)
    finally:
        stop(main)
    with dead_level_server() as level:
        dead_pool = write_pool(args.pool, work / "pool-dead.yaml", args.agent_max_tokens, dead_url=level.base_url)
        second = start_service(args, dead_pool, work / "serve-dead.log", "dead level")
        try:
            dead = LoadStats()
            t0 = time.perf_counter()
            for _ in range(2):  # a wave while the level answers, then one after it stopped
                await asyncio.gather(*(timed(dead, second.url, qs[k % len(qs)], k % 2 == 0, args.timeout_s)
                                       for k in range(args.dead_level_requests)))
                level.dead.set()
            dead.elapsed_s = time.perf_counter() - t0
            print(f"[dead level] done: {dead.status_line()} level calls {dict(level.calls)}", flush=True)
        finally:
            stop(second)
        calls = Counter(level.calls)
    report = Report(seq, load, sigterm, drained, dead, calls, rss_start, (warm or [rss_start])[0], rss_end, peak)
    logs = [main.log(), second.log()]
    report.logs = {k: sum(scan_log(text)[k] for text in logs) for k in ("tracebacks", "credentials", "status_500")}
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orchestrator", default=os.environ.get("LEMON_BENCH_ORCHESTRATOR"),
                    help="a trained orchestrator: checkpoint, model folder or `lemon train` output folder "
                         "(env LEMON_BENCH_ORCHESTRATOR)")
    ap.add_argument("--pool", default="cpu", help="pool of real models (built-in name or YAML)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients")
    ap.add_argument("--seconds", type=float, default=300.0, help="length of the concurrent phase")
    ap.add_argument("--questions", type=int, default=8, help="MultiArith questions (the sequential baseline)")
    ap.add_argument("--max-concurrent", type=int, default=None, help="the service's limit (default: clients)")
    ap.add_argument("--batch-max-size", type=int, default=16)
    ap.add_argument("--batch-wait-ms", type=float, default=200.0,
                    help="how long a batch waits for more requests (requests arriving together batch)")
    ap.add_argument("--agent-max-tokens", type=int, default=None, help="cap the levels' max_tokens")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="a patient client's timeout")
    ap.add_argument("--disconnect-every", type=int, default=6,
                    help="every k-th request of a client gives up early (0: none)")
    ap.add_argument("--disconnect-after-s", type=float, default=3.0, help="when such a client gives up")
    ap.add_argument("--sigterm-after-s", type=float, default=3.0, help="SIGTERM this long into the last wave")
    ap.add_argument("--grace-s", type=float, default=5.0, help="the service's shutdown_grace_s")
    ap.add_argument("--dead-level-requests", type=int, default=4, help="requests per wave of the dead-level phase")
    args = ap.parse_args(argv)
    problems = []
    if not args.orchestrator:
        problems.append("--orchestrator: give a trained orchestrator (a checkpoint folder, or the `lemon train` "
                        "output folder), e.g. the model `make run` publishes")
    elif not Path(args.orchestrator).exists():
        problems.append(f"--orchestrator: {args.orchestrator!r} does not exist; run `make run` or `lemon train` "
                        "first, or pass an existing checkpoint folder")
    for name, low, high in (("clients", 1, 256), ("questions", 1, 1000), ("dead_level_requests", 1, 64)):
        value = getattr(args, name)
        if not low <= value <= high:
            problems.append(f"--{name.replace('_', '-')}={value}: must be in {low}..{high}")
    if not 0 < args.seconds <= 3600:
        problems.append(f"--seconds={args.seconds:g}: must be in (0, 3600]")
    if args.disconnect_every < 0 or args.disconnect_after_s <= 0:
        problems.append("--disconnect-every must be >= 0 and --disconnect-after-s > 0")
    if args.agent_max_tokens is not None and args.agent_max_tokens < 1:
        problems.append(f"--agent-max-tokens={args.agent_max_tokens}: must be >= 1 (or left out)")
    if problems:
        ap.error("; ".join(problems))
    args.max_concurrent = args.max_concurrent or args.clients
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lemon-serve-real-") as tmp:
        report = asyncio.run(run(args, Path(tmp)))
        for line in report.lines(args):
            print(line)
        if report.failures():
            for name in ("serve.log", "serve-dead.log"):  # the evidence, before the folder goes
                text = (Path(tmp) / name).read_text(errors="replace")
                print(f"--- tail of {name} ---\n" + "\n".join(text.splitlines()[-40:]), file=sys.stderr)
    return 1 if report.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
