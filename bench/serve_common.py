"""What the service benches share: the bearer token, free loopback ports, readiness, server memory, and one
summary of a load run (statuses, latency quantiles, throughput). Used by bench/serve_load.py (test doubles)
and bench/serve_real.py (real models), so both report the same figures the same way."""

from __future__ import annotations

import socket
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

TOKEN = "bench-token-0123456789abcdef"
DISCONNECTED = -1  # the client gave up on purpose (its timeout): a fault it injected, not an error
TRANSPORT_ERROR = -2  # no HTTP answer at all (connection refused or reset)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def token_file() -> str:
    """A file holding TOKEN, as ``--auth-token-file`` wants it."""
    with tempfile.NamedTemporaryFile("w", suffix=".tokens", delete=False) as fh:
        fh.write(TOKEN + "\n")
    return fh.name


def wait_ready(url: str, timeout_s: float = 60, alive: object = None) -> None:
    """Until ``url``/readyz answers 200; SystemExit after ``timeout_s`` or once ``alive()`` is false."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if callable(alive) and not alive():
            raise SystemExit(f"the service at {url} exited before it was ready")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"service at {url} did not become ready in {timeout_s} s")


def proc_status_mb(pid: int, field_name: str = "VmRSS") -> float:
    """A memory field of process ``pid`` in MB (Linux /proc): VmRSS now, VmHWM the peak so far."""
    with open(f"/proc/{pid}/status") as fh:
        kb = next(int(line.split()[1]) for line in fh if line.startswith(f"{field_name}:"))
    return kb / 1024


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MB."""
    return proc_status_mb(pid, "VmRSS")


@dataclass
class LoadStats:
    """What the clients of one load run saw."""

    statuses: Counter[int] = field(default_factory=Counter)  # HTTP status, or DISCONNECTED / TRANSPORT_ERROR
    latencies: list[float] = field(default_factory=list)  # of the 200s, in seconds
    elapsed_s: float = 0.0

    @property
    def ok(self) -> int:
        return self.statuses.get(200, 0)

    def errors(self, allowed: frozenset[int] = frozenset()) -> int:
        """Answers that are neither 200, a deliberate disconnect, nor one of ``allowed``."""
        return sum(n for code, n in self.statuses.items() if code not in {200, DISCONNECTED, *allowed})

    def quantile_ms(self, q: int) -> float:
        """The q-th percentile latency of the 200s in ms (nan with fewer than two)."""
        if len(self.latencies) < 2:
            return self.latencies[0] * 1000 if self.latencies else float("nan")
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[q - 1] * 1000

    @property
    def throughput(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s else 0.0

    def status_line(self) -> str:
        names = {DISCONNECTED: "disconnected", TRANSPORT_ERROR: "no_answer"}
        by_status = {names.get(code, code): n for code, n in sorted(self.statuses.items())}
        return f"requests={sum(self.statuses.values())} ok={self.ok} by_status={by_status}"
