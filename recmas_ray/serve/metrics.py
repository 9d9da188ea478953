"""Prometheus metrics of one replica (`GET /metrics`, text exposition format; prometheus_client comes with ray[default]).

Each replica keeps its own registry: with several replicas a scrape of `/metrics` reaches one of them
(scrape each replica, or use Ray's own metrics export for the cluster-wide view).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class ServerMetrics:
    """Requests, latency, tokens, batches and queue depth."""

    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("recmas_requests", "HTTP requests answered", ["route", "status"], registry=r)
        self.latency = Histogram("recmas_request_latency_seconds", "Time from request to last byte", ["route"],
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300), registry=r)
        self.prompt_tokens = Counter("recmas_prompt_tokens", "Prompt tokens read by every agent", registry=r)
        self.completion_tokens = Counter("recmas_completion_tokens", "Tokens of the final agent's answers",
                                         registry=r)
        self.latent_steps = Counter("recmas_latent_steps", "Latent steps of every agent", registry=r)
        self.batch_rows = Histogram("recmas_batch_rows", "Rows (questions x n) per batch run through the agents",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.queue_depth = Gauge("recmas_queue_depth", "Rows waiting for a batch", registry=r)
        self.batches_running = Gauge("recmas_batches_running", "Batches running through the agents", registry=r)

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route=route, status=str(status)).inc()
        self.latency.labels(route=route).observe(seconds)

    def observe_usage(self, usage: dict, side: dict) -> None:
        self.prompt_tokens.inc(usage["prompt_tokens"])
        self.completion_tokens.inc(usage["completion_tokens"])
        self.latent_steps.inc(side["latent_steps"])

    def exposition(self, queued_rows: int, running: int) -> bytes:
        self.queue_depth.set(queued_rows)
        self.batches_running.set(running)
        return generate_latest(self.registry)
