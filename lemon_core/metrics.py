"""Prometheus metrics: every lemon metric name is defined here, once.

Batch stages (rollout, train, evaluate) fill a ``LemonMetrics`` on their own registry, write the
text exposition next to their outputs (``write_exposition``, through storage so ``s3://`` works)
and push to a Pushgateway when ``LEMON_PUSHGATEWAY`` is set (``push_if_configured``). The serving
app exposes the same registry on ``/metrics``. The example recording rules and Grafana dashboard
under ``charts/monitoring/`` use only these names; a test checks that.

Conventions: counters end in ``_total``; money is USD; ``lemon_eval_cost_usd`` is the mean cost of
one evaluated example, so ``lemon_eval_cost_usd / lemon_eval_accuracy`` is the cost per correct
answer (a recording rule).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, push_to_gateway
from prometheus_client.metrics import MetricWrapperBase

from lemon_core import storage

log = logging.getLogger(__name__)

EXPOSITION_NAME = "metrics.prom"  # file name batch stages use beside their outputs
REWARD_TERMS = ("total", "correctness", "cost", "format")
TOKEN_KINDS = ("prompt", "completion")
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


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


class LemonMetrics:
    """All lemon metrics on one registry; attributes are prometheus_client metric objects."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else new_registry()
        r = self.registry
        # rollout (gauges hold the mean over the latest rollout batch: rewards and contrasts can be
        # negative, and prometheus_client drops a histogram's _sum when it has negative buckets)
        self.rollout_reward = Gauge(
            "lemon_rollout_reward", "Mean reward of the latest rollout batch, per reward term.",
            ["term"], registry=r)
        self.spec_valid_ratio = Gauge(
            "lemon_spec_valid_ratio", "Share of sampled orchestrator outputs that parse into a valid spec.",
            registry=r)
        self.agent_calls = Counter(
            "lemon_agent_calls", "Agent (backend) calls executed, per capacity level.",
            ["capacity"], registry=r)
        self.tokens = Counter(
            "lemon_tokens", "Tokens processed by agents, per capacity level and kind (prompt|completion).",
            ["capacity", "kind"], registry=r)
        self.cost_usd = Counter(
            "lemon_cost_usd", "USD spent on agent calls at the pool's prices, per capacity level.",
            ["capacity"], registry=r)
        self.counterfactual_delta = Gauge(
            "lemon_counterfactual_delta", "Mean contrast r - r_edit of the latest batch's edits, per family.",
            ["family"], registry=r)
        # training
        self.train_loss = Gauge("lemon_train_loss", "Latest training loss (SFT or GRPO).", registry=r)
        self.train_kl = Gauge("lemon_train_kl", "Latest KL divergence to the reference policy.", registry=r)
        self.train_clip_ratio = Gauge(
            "lemon_train_clip_ratio", "Fraction of tokens whose probability ratio was clipped.", registry=r)
        # evaluation
        self.eval_accuracy = Gauge(
            "lemon_eval_accuracy", "Accuracy (0-1) of a method on a benchmark.",
            ["benchmark", "method"], registry=r)
        self.eval_cost_usd = Gauge(
            "lemon_eval_cost_usd", "Mean USD per evaluated example of a method on a benchmark.",
            ["benchmark", "method"], registry=r)
        # service
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

    def record_eval(self, benchmark: str, method: str, accuracy: float, cost_usd_per_example: float) -> None:
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"accuracy for {benchmark}/{method} must be in [0, 1], got {accuracy}")
        self.eval_accuracy.labels(benchmark=benchmark, method=method).set(accuracy)
        self.eval_cost_usd.labels(benchmark=benchmark, method=method).set(cost_usd_per_example)

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
