"""Loopback load test of the inference service: N concurrent clients for T seconds.

The service runs in a separate process on 127.0.0.1 (real uvicorn, real FastAPI app, auth, limits,
micro-batcher and executor) over TEST DOUBLES, not models: a scripted orchestrator that always writes
the same valid 2-agent spec (solver at `small` -> verifier at `large`), and echo capacity levels that
sleep --agent-latency-ms per *batched* call, like one batched forward pass on a GPU. So the figures
measure the service's own overhead and its batching, not model quality or model speed.

Each client loops POST /v1/orchestrate until T seconds are over. Printed: requests, errors by status,
p50/p99 latency, throughput, and the throughput an unbatched server could reach at most
(1 / (2 levels x agent latency)). With clients <= --max-concurrent, errors must be 0 (the exit status
is 1 otherwise); --clients above the limit shows the 429 path.

    python bench/serve_load.py --clients 16 --seconds 10

``--unauth-conns N`` measures the issue #11 attack instead: N connections without a token each send
headers and 64 KB - 1 of a 64 KB body, then stall. Printed: how many got 401 at once, how many the
server closed, and the server's resident memory (RSS) growth while they hang on.

    python bench/serve_load.py --unauth-conns 800
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import time

import httpx
from serve_common import TOKEN, TRANSPORT_ERROR, LoadStats, free_port, rss_mb, token_file, wait_ready


def run_server(port: int, args: argparse.Namespace, token_file: str) -> None:
    """Child process: the service over test doubles (see the module docstring), on `lemon serve`'s server."""
    from lemon_core.cli_serve import run_server as serve
    from lemon_core.pool import CapacityLevel, CapacityPool
    from lemon_core.serve import ServeSettings, create_app
    from lemon_core.serve.doubles import EchoAgent, ScriptedOrchestrator, two_agent_spec

    pool = CapacityPool(description="TEST DOUBLE levels (echo agents)", levels=[
        CapacityLevel(name=n, backend="simulated", model=f"echo-{n}", price_in_per_1m=p, price_out_per_1m=p)
        for n, p in (("small", 0.2), ("large", 0.9))])
    for name in pool.level_names:
        pool.set_backend(name, EchoAgent(name, delay_s=args.agent_latency_ms / 1000))
    settings = ServeSettings(auth_token_file=token_file, max_concurrent_requests=args.max_concurrent,
                             batch_max_size=args.batch_max_size, batch_wait_ms=args.batch_wait_ms,
                             log_level="warning", host="127.0.0.1", port=port)
    app = create_app(settings, pool=pool, orchestrator_backend=ScriptedOrchestrator([two_agent_spec()]))
    serve(app, settings)


async def unauth_attack(port: int, conns: int, pid: int) -> dict[str, float]:
    """``conns`` unauthenticated clients each send headers + 64 KB - 1 of body and stall."""
    body_len = 65536
    head = (f"POST /v1/orchestrate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {body_len}\r\n\r\n").encode()
    before = rss_mb(pid)
    streams = []
    for _ in range(conns):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head + b"x" * (body_len - 1))
        streams.append((reader, writer))
    await asyncio.gather(*(w.drain() for _, w in streams))
    await asyncio.sleep(2.0)
    peak = rss_mb(pid)

    async def outcome(reader: asyncio.StreamReader) -> tuple[bool, bool]:
        try:
            first = await asyncio.wait_for(reader.read(12), 1.0)
            rest = await asyncio.wait_for(reader.read(), 1.0)
        except TimeoutError:
            return False, False
        return first.startswith(b"HTTP/1.1 401"), bool(first) and rest is not None

    results = await asyncio.gather(*(outcome(r) for r, _ in streams))
    for _, writer in streams:
        writer.close()
    return {"refused_401": sum(a for a, _ in results), "closed_by_server": sum(b for _, b in results),
            "rss_before_mb": before, "rss_with_conns_mb": peak}


async def client(url: str, deadline: float, stats: LoadStats, cid: int) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
        k = 0
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                task = f"client {cid} task {k}: what is 40 + 2?"
                resp = await http.post("/v1/orchestrate", json={"task": task})
                stats.statuses[resp.status_code] += 1
                if resp.status_code == 200:
                    stats.latencies.append(time.perf_counter() - t0)
                elif resp.status_code == 429:  # honour Retry-After, as a polite client would
                    await asyncio.sleep(min(float(resp.headers.get("retry-after", "1")), 1.0))
            except httpx.HTTPError:
                stats.statuses[TRANSPORT_ERROR] += 1
            k += 1


async def load(url: str, clients: int, seconds: float) -> LoadStats:
    stats = LoadStats()
    start = time.perf_counter()
    await asyncio.gather(*(client(url, start + seconds, stats, i) for i in range(clients)))
    stats.elapsed_s = time.perf_counter() - start
    return stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients")
    ap.add_argument("--seconds", type=float, default=10.0, help="test length (at most 120)")
    ap.add_argument("--max-concurrent", type=int, default=32,
                    help="the service's concurrency limit (429 above)")
    ap.add_argument("--agent-latency-ms", type=float, default=20.0,
                    help="echo agents' sleep per batched call")
    ap.add_argument("--batch-max-size", type=int, default=16)
    ap.add_argument("--batch-wait-ms", type=float, default=5.0)
    ap.add_argument("--unauth-conns", type=int, default=0,
                    help="instead of the load test: this many stalled unauthenticated 64 KB uploads")
    args = ap.parse_args()
    if not 1 <= args.clients <= 512 or not 0 < args.seconds <= 120:
        ap.error("--clients must be in 1..512 and --seconds in (0, 120]")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = multiprocessing.get_context("spawn").Process(
        target=run_server, args=(port, args, token_file()), daemon=True)
    server.start()
    try:
        wait_ready(url)
        if args.unauth_conns:
            found = asyncio.run(unauth_attack(port, args.unauth_conns, server.pid))
            print(f"unauthenticated connections={args.unauth_conns} (64 KB - 1 of a 64 KB body each, then stall)")
            print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in found.items()))
            return 0
        stats = asyncio.run(load(url, args.clients, args.seconds))
    finally:
        server.terminate()
        server.join(timeout=10)

    errors = stats.errors()
    print("backends: TEST DOUBLES (scripted orchestrator + echo agents), not models; loopback uvicorn")
    print(f"clients={args.clients} seconds={stats.elapsed_s:.1f} limit={args.max_concurrent} "
          f"agent_latency_ms={args.agent_latency_ms:g} batch_max_size={args.batch_max_size} "
          f"batch_wait_ms={args.batch_wait_ms:g}")
    print(f"{stats.status_line()} errors={errors}")
    print(f"latency_p50_ms={stats.quantile_ms(50):.1f} latency_p99_ms={stats.quantile_ms(99):.1f}")
    unbatched = 1000 / (2 * args.agent_latency_ms) if args.agent_latency_ms else float("inf")
    print(f"throughput_rps={stats.throughput:.1f} (an unbatched server: at most {unbatched:.1f})")
    if args.clients <= args.max_concurrent and errors:
        print(f"FAIL: {errors} errors below the concurrency limit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
