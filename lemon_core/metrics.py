"""Prometheus metrics: every lemon metric name is defined here, once.

Batch stages (rollout, train, evaluate) fill a ``LemonMetrics`` on their own registry, write the
text exposition next to their outputs (``write_exposition``, through storage so ``s3://`` works)
and push to a Pushgateway when ``LEMON_PUSHGATEWAY`` is set (``push_if_configured``). The serving
app exposes the same registry on ``/metrics``. The example recording rules and Grafana dashboard
under ``charts/monitoring/`` use only these names; a test checks that.

Each process registers only the metric groups it fills (``parts``): the service exposes the agent
call counters and its request metrics (``SERVICE_PARTS``), never training or evaluation gauges that
would sit at 0 and read as real values. The unregistered ones still exist as objects, so a stray
update is a no-op rather than a crash. ``series_names()`` lists every name any process can expose.

Conventions: counters end in ``_total``; money is USD; ``lemon_eval_cost_usd`` is the mean cost of
one evaluated example, so ``lemon_eval_cost_usd / lemon_eval_accuracy`` is the cost per correct
answer (a recording rule). Every accuracy carries its n and 95% Wilson interval
(``lemon_eval_examples``, ``lemon_eval_accuracy_ci_low`` / ``_high``) and the share of examples whose
orchestrator spec was valid (``lemon_eval_valid_rate``).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Collection, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, push_to_gateway
from prometheus_client.metrics import MetricWrapperBase

from lemon_core import storage

log = logging.getLogger(__name__)

EXPOSITION_NAME = "metrics.prom"  # file name batch stages use beside their outputs
REWARD_TERMS = ("total", "correctness", "cost", "format")
TOKEN_KINDS = ("prompt", "completion")
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
PARTS = ("rollout", "calls", "train", "eval", "service")  # metric groups, see LemonMetrics
SERVICE_PARTS = ("calls", "service")
WILSON_Z = 1.959963984540054  # two-sided 95% normal quantile


def new_registry(process_metrics: bool = False) -> CollectorRegistry:
    """A fresh registry (never the global one, so tests and stages do not share state).

    ``process_metrics`` adds process/platform collectors, useful for the long-running service.
    """
    registry = CollectorRegistry(auto_describe=True)
    if process_metrics:
        from prometheus_client import PlatformCollector, ProcessCollector

        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
    return registry


def wilson_interval(successes: float, n: int, z: float = WILSON_Z) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (Wilson 1927; stays inside [0, 1] and is sane at 0 or n)."""
    if n <= 0:
        raise ValueError(f"wilson_interval needs n >= 1 examples, got n={n}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


class LemonMetrics:
    """The lemon metrics of the groups in ``parts`` on one registry; attributes are prometheus_client
    metric objects (those of other groups exist unregistered: updates to them are never exposed).

    Groups: ``rollout`` (rewards, valid-spec ratio, counterfactual contrasts), ``calls`` (agent calls,
    tokens, cost), ``train``, ``eval``, ``service`` (request latency, in flight, invalid specs).
    """

    def __init__(self, registry: CollectorRegistry | None = None, parts: Collection[str] = PARTS) -> None:
        unknown = sorted(set(parts) - set(PARTS))
        if unknown:
            raise ValueError(f"unknown metric part(s) {unknown}; choose from {PARTS}")
        self.registry = registry if registry is not None else new_registry()
        self.parts = frozenset(parts)

        def on(part: str) -> CollectorRegistry | None:
            return self.registry if part in self.parts else None

        # rollout (gauges hold the mean over the latest rollout batch: rewards and contrasts can be
        # negative, and prometheus_client drops a histogram's _sum when it has negative buckets)
        r = on("rollout")
        self.rollout_reward = Gauge(
            "lemon_rollout_reward", "Mean reward of the latest rollout batch, per reward term.",
            ["term"], registry=r)
        self.spec_valid_ratio = Gauge(
            "lemon_spec_valid_ratio", "Share of sampled orchestrator outputs that parse into a valid spec.",
            registry=r)
        self.counterfactual_delta = Gauge(
            "lemon_counterfactual_delta", "Mean contrast r - r_edit of the latest batch's edits, per family.",
            ["family"], registry=r)
        r = on("calls")
        self.agent_calls = Counter(
            "lemon_agent_calls", "Agent (backend) calls executed, per capacity level.",
            ["capacity"], registry=r)
        self.tokens = Counter(
            "lemon_tokens", "Tokens processed by agents, per capacity level and kind (prompt|completion).",
            ["capacity", "kind"], registry=r)
        self.cost_usd = Counter(
            "lemon_cost_usd", "USD spent on agent calls at the pool's prices, per capacity level.",
            ["capacity"], registry=r)
        r = on("train")
        self.train_loss = Gauge("lemon_train_loss", "Latest training loss (SFT or GRPO).", registry=r)
        self.train_kl = Gauge("lemon_train_kl", "Latest KL divergence to the reference policy.", registry=r)
        self.train_clip_ratio = Gauge(
            "lemon_train_clip_ratio", "Fraction of tokens whose probability ratio was clipped.", registry=r)
        r = on("eval")
        labels = ["benchmark", "method"]
        self.eval_accuracy = Gauge(
            "lemon_eval_accuracy", "Accuracy (0-1) of a method on a benchmark.", labels, registry=r)
        self.eval_cost_usd = Gauge(
            "lemon_eval_cost_usd", "Mean USD per evaluated example of a method on a benchmark "
            "(an orchestrator's own call included).", labels, registry=r)
        self.eval_valid_rate = Gauge(
            "lemon_eval_valid_rate", "Share of examples whose orchestrator spec parsed and validated (1 for "
            "baselines); invalid ones score 0.", labels, registry=r)
        self.eval_accuracy_ci_low = Gauge(
            "lemon_eval_accuracy_ci_low", "Lower end of the 95% Wilson interval of lemon_eval_accuracy.",
            labels, registry=r)
        self.eval_accuracy_ci_high = Gauge(
            "lemon_eval_accuracy_ci_high", "Upper end of the 95% Wilson interval of lemon_eval_accuracy.",
            labels, registry=r)
        self.eval_examples = Gauge(
            "lemon_eval_examples", "Examples behind lemon_eval_accuracy (n).", labels, registry=r)
        r = on("service")
        self.request_latency = Histogram(
            "lemon_request_latency_seconds", "End-to-end latency of service requests.",
            buckets=LATENCY_BUCKETS, registry=r)
        self.requests_in_flight = Gauge(
            "lemon_requests_in_flight", "Service requests being handled right now.", registry=r)
        self.spec_invalid = Counter(
            "lemon_spec_invalid", "Orchestrator outputs rejected as invalid specs.", registry=r)

    # Helpers for the common updates; they check label values so a typo cannot create a new series.

    def record_rewards(self, term: str, rewards: Sequence[float]) -> None:
        """Set the batch mean of one reward term (total, correctness, cost or format)."""
        if term not in REWARD_TERMS:
            raise ValueError(f"reward term {term!r} is not one of {REWARD_TERMS}")
        if rewards:
            self.rollout_reward.labels(term=term).set(math.fsum(rewards) / len(rewards))

    def record_deltas(self, family: str, deltas: Sequence[float]) -> None:
        """Set the batch mean contrast of one counterfactual edit family."""
        if deltas:
            self.counterfactual_delta.labels(family=family).set(math.fsum(deltas) / len(deltas))

    def record_call(self, capacity: str, prompt_tokens: int, completion_tokens: int, cost_usd: float) -> None:
        """Count one agent call with its token usage and cost."""
        if min(prompt_tokens, completion_tokens, cost_usd) < 0:
            raise ValueError(
                f"record_call({capacity!r}): tokens and cost must be >= 0, got "
                f"prompt_tokens={prompt_tokens}, completion_tokens={completion_tokens}, cost_usd={cost_usd}")
        self.agent_calls.labels(capacity=capacity).inc()
        self.tokens.labels(capacity=capacity, kind="prompt").inc(prompt_tokens)
        self.tokens.labels(capacity=capacity, kind="completion").inc(completion_tokens)
        self.cost_usd.labels(capacity=capacity).inc(cost_usd)

    def record_eval(self, benchmark: str, method: str, accuracy: float, cost_usd_per_example: float, *,
                    valid_rate: float = 1.0, ci_low: float | None = None, ci_high: float | None = None,
                    n: int | None = None) -> None:
        """Set one method's evaluation on a benchmark.

        With ``n`` and no interval given, the 95% Wilson interval of ``accuracy`` over ``n`` is computed
        here; interval gauges are left unset when neither is known (never a made-up 0).
        """
        where = f"{benchmark}/{method}"
        for name, value in (("accuracy", accuracy), ("valid_rate", valid_rate), ("ci_low", ci_low),
                            ("ci_high", ci_high)):
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} for {where} must be in [0, 1], got {value}")
        if (ci_low is None) != (ci_high is None):
            raise ValueError(f"record_eval({where}): give both ci_low and ci_high, or neither")
        if n is not None and n < 1:
            raise ValueError(f"record_eval({where}): n must be >= 1 examples, got {n}")
        if ci_low is None and n is not None:
            ci_low, ci_high = wilson_interval(accuracy * n, n)
        key = {"benchmark": benchmark, "method": method}
        self.eval_accuracy.labels(**key).set(accuracy)
        self.eval_cost_usd.labels(**key).set(cost_usd_per_example)
        self.eval_valid_rate.labels(**key).set(valid_rate)
        if ci_low is not None and ci_high is not None:
            self.eval_accuracy_ci_low.labels(**key).set(ci_low)
            self.eval_accuracy_ci_high.labels(**key).set(ci_high)
        if n is not None:
            self.eval_examples.labels(**key).set(n)

    def record_train_step(self, loss: float, kl: float, clip_ratio: float) -> None:
        self.train_loss.set(loss)
        self.train_kl.set(kl)
        self.train_clip_ratio.set(clip_ratio)


_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created")}


def series_names() -> frozenset[str]:
    """Every time-series name LemonMetrics can expose (``lemon_tokens_total``, ``..._bucket`` ...).

    What PromQL in rules and dashboards may reference; derived from the definitions above.
    """
    names: set[str] = set()
    for metric in vars(LemonMetrics(new_registry())).values():
        if isinstance(metric, MetricWrapperBase):
            for family in metric.describe():
                names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
    return frozenset(names)


def exposition(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition of a registry."""
    return generate_latest(registry)


def write_exposition(registry: CollectorRegistry, uri: str) -> str:
    """Write the text exposition to ``uri`` (file path, file:// or s3://, atomically); returns ``uri``."""
    storage.put_bytes(uri, exposition(registry))
    return uri


def push_if_configured(
    registry: CollectorRegistry,
    job: str,
    grouping_key: Mapping[str, str] | None = None,
    gateway: str | None = None,
    timeout_s: float = 5.0,
) -> bool:
    """Push to the Pushgateway at ``gateway`` or ``$LEMON_PUSHGATEWAY``; True when pushed.

    A batch job's metrics are a by-product: an unset gateway is a no-op and a failing one only logs
    a warning, so monitoring trouble never fails a training or evaluation run.
    """
    target = gateway or os.environ.get("LEMON_PUSHGATEWAY", "").strip()
    if not target:
        return False
    try:
        push_to_gateway(target, job=job, registry=registry, grouping_key=dict(grouping_key or {}),
                        timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - any failure is reported, never raised
        log.warning("could not push metrics for job %r to Pushgateway %s: %s (check LEMON_PUSHGATEWAY)",
                    job, target, exc)
        return False
    return True
