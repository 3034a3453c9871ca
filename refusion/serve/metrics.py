"""Prometheus metrics of one server, in a registry of its own (two apps in one process never clash).

Counters: requests by endpoint and outcome, prompt and generated tokens,
the engine's forwards, prompt tokens looked up in the prefix cache and found
there (``refusion_prefix_cache_queries_total``/``_hits_total``, in tokens, as
vLLM names them). Gauges: queue depth, live rows, reserved positions,
generated tokens per forward, the prefix cache's pages in use and its
limit, and the pages of keys/values held and the budget's
(``refusion_kv_pages_used``/``_total``). Histograms: request latency and time to the first streamed text.
Plus the process's memory and CPU.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _EngineCollector:
    """Reads the engine's forward count when scraped, and generated tokens per forward."""

    def __init__(self, batcher: Any, tokens: Any):
        self.batcher = batcher
        self.tokens = tokens  # a callable: generated tokens so far

    def collect(self):
        forwards = self.batcher.engine.counters.forwards
        yield CounterMetricFamily(
            "refusion_forwards", "Model forwards run by the engine (prefills included).", value=forwards
        )
        tokens = self.tokens()
        yield GaugeMetricFamily(
            "refusion_tokens_per_forward",
            "Generated tokens per model forward, since start.",
            value=tokens / forwards if forwards else 0.0,
        )
        prefixes = getattr(self.batcher.engine, "prefixes", None)  # made with the engine's first sequence
        stats = prefixes.stats if prefixes is not None else None
        yield CounterMetricFamily(
            "refusion_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            value=stats.queries if stats else 0,
        )
        yield CounterMetricFamily(
            "refusion_prefix_cache_hits",
            "Prompt tokens found in the prefix cache (their keys/values reused, not computed).",
            value=stats.hits if stats else 0,
        )
        pages = self.batcher.engine.kv_pages() or (0, 0)
        yield GaugeMetricFamily(
            "refusion_prefix_cache_pages_used", "Pages the prefix cache holds.", value=len(prefixes or ())
        )
        yield GaugeMetricFamily(
            "refusion_prefix_cache_pages_total",
            "Pages the prefix cache may hold (the key/value budget it shares with live requests).",
            value=pages[1] if prefixes is not None else 0,
        )
        yield GaugeMetricFamily(
            "refusion_kv_pages_used",
            "Pages of keys/values held (live requests' and the prefix cache's).",
            value=pages[0],
        )
        yield GaugeMetricFamily("refusion_kv_pages_total", "Pages of keys/values the budget holds.", value=pages[1])


#: the decoding endpoints' paths and their ``endpoint`` label
ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


class ServerMetrics:
    """The metrics of a server on ``batcher``; :meth:`render` gives the Prometheus text format."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, batcher: Any):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "refusion_requests",
            "Requests by endpoint and outcome (stop, length, cancelled, error, rejected, invalid, not_found).",
            ("endpoint", "outcome"),
            registry=r,
        )
        self.prompt_tokens = Counter("refusion_prompt_tokens", "Prompt tokens of admitted requests.", registry=r)
        self.generated_tokens = Counter("refusion_generated_tokens", "Tokens sent to clients.", registry=r)
        self.latency = Histogram(
            "refusion_request_latency_seconds",
            "Submit to last token.",
            ("endpoint",),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.first_token = Histogram(
            "refusion_time_to_first_token_seconds",
            "Submit to the first text sent.",
            ("endpoint",),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        Gauge("refusion_queue_depth", "Requests waiting for a row.", registry=r).set_function(lambda: batcher.waiting)
        Gauge("refusion_live_rows", "Requests decoding now.", registry=r).set_function(lambda: batcher.live_rows)
        Gauge("refusion_reserved_tokens", "Positions reserved by live requests.", registry=r).set_function(
            lambda: batcher.reserved_tokens
        )
        self.tokens_sent = 0
        r.register(_EngineCollector(batcher, lambda: self.tokens_sent))
        ProcessCollector(registry=r)

    def finished(self, endpoint: str, outcome: str, tokens: int, latency: float) -> None:
        """Record one request's end: its outcome, the tokens sent and its latency."""
        self.requests.labels(endpoint, outcome).inc()
        self.generated_tokens.inc(tokens)
        self.tokens_sent += tokens
        self.latency.labels(endpoint).observe(latency)

    def refused(self, path: str, status: int) -> None:
        """Count a request to a decoding endpoint refused before decoding: 400 or 415 (``invalid``), 404
        (``not_found``)."""
        endpoint = ENDPOINTS.get(path)
        if endpoint is not None and status in (400, 404, 415):
            self.requests.labels(endpoint, "not_found" if status == 404 else "invalid").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
