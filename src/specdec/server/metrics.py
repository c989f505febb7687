"""Prometheus metrics of the server, on a registry of its own (one per app)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from specdec.metrics import SpecStats

_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ServerMetrics:
    def __init__(self, replica: str | None = None) -> None:
        self._drafted_total = self._accepted_total = 0  # the acceptance gauge's inputs
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("specdec_requests", "requests by outcome", ["status"], registry=r)
        self.drafted = Counter("specdec_drafted_tokens", "draft tokens proposed", registry=r)
        self.accepted = Counter("specdec_accepted_tokens", "draft tokens accepted", registry=r)
        self.generated = Counter("specdec_generated_tokens", "tokens generated", registry=r)
        self.acceptance_rate = Gauge(
            "specdec_acceptance_rate", "accepted / drafted since start", registry=r
        )
        self.mean_accepted_length = Histogram(
            "specdec_mean_accepted_length",
            "tokens per round per request (incl. the target's own)",
            buckets=(1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10),
            registry=r,
        )
        self.seconds = Counter("specdec_seconds", "time by phase", ["phase"], registry=r)
        self.latency = Histogram(
            "specdec_request_latency_seconds", "request latency", buckets=_SECONDS, registry=r
        )
        self.ttft = Histogram(
            "specdec_time_to_first_token_seconds",
            "time to first token",
            buckets=_SECONDS,
            registry=r,
        )
        self.chunk_gap = Histogram(
            "specdec_chunk_gap_seconds",
            "time between two consecutive chunks of a request (a round's tokens) as its handler "
            "gets them: the pauses a streaming client sees",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.tokens_per_second = Histogram(
            "specdec_tokens_per_second",
            "tokens/s per request",
            buckets=(1, 2, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256),
            registry=r,
        )
        self.queue_length = Gauge("specdec_queue_length", "requests waiting for a slot", registry=r)
        self.active = Gauge("specdec_active_requests", "requests being decoded", registry=r)
        self.batch_requests = Histogram(
            "specdec_batch_requests",
            "requests scored together by one batched target pass",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32),
            registry=r,
        )

        self.prefix_reused = Counter(
            "specdec_prefix_reused_tokens",
            "prompt tokens of the target whose keys and values were copied from another "
            "request's cache (a shared prefix) instead of computed",
            registry=r,
        )

        if replica is not None:
            info = Gauge("specdec_replica_info", "which replica answered", ["replica"], registry=r)
            info.labels(replica).set(1)

    def set_queue(self, waiting: int, active: int) -> None:
        self.queue_length.set(waiting)
        self.active.set(active)

    def record(self, stats: SpecStats, latency: float, ttft: float | None) -> None:
        self.drafted.inc(stats.drafted_tokens)
        self.accepted.inc(stats.accepted_tokens)
        self.generated.inc(stats.generated_tokens)
        self._drafted_total += stats.drafted_tokens
        self._accepted_total += stats.accepted_tokens
        if self._drafted_total:
            self.acceptance_rate.set(self._accepted_total / self._drafted_total)
        if stats.rounds:
            self.mean_accepted_length.observe(stats.mean_accepted_length)
        for phase, value in (
            ("prefill", stats.prefill_seconds),
            ("drafter", stats.drafter_seconds),
            ("target", stats.target_seconds),
            ("overhead", stats.overhead_seconds),
        ):
            self.seconds.labels(phase).inc(value)
        self.latency.observe(latency)
        if ttft is not None:
            self.ttft.observe(ttft)
        if stats.tokens_per_second:
            self.tokens_per_second.observe(stats.tokens_per_second)
