"""``GET /metrics``: the server's Prometheus metrics (text exposition, or
OpenMetrics when the scraper asks for it), on the Prometheus client library.

Names are vLLM's where vLLM has the metric (``vllm:`` prefix, a
``model_name`` label), so dashboards and alerts written for vLLM read
intdet unchanged; what vLLM lacks has the ``intdet:`` prefix.

* Gauges, read from the scheduler at scrape time: ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (KV cache
  reserved by running requests / the budget, 0-1), ``intdet:prefix_cache_bytes``
  (KV held by retired prefix-cache entries, given back on demand).
* Counters read at scrape time from the engine's own totals:
  ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (in prompt
  tokens looked up / reused), ``vllm:spec_decode_num_draft_tokens`` /
  ``vllm:spec_decode_num_accepted_tokens``.
* Counted when a request (one choice of one prompt: a sequence) finishes:
  ``vllm:request_success{finished_reason}`` (the response's
  finish_reason: stop, length, abort, error), ``vllm:prompt_tokens`` (a
  request with n choices counts its prompt n times; usage counts it once),
  ``vllm:prompt_tokens_by_source{source}`` (``local_compute`` or
  ``local_cache_hit``), ``vllm:prompt_tokens_cached``,
  ``vllm:generation_tokens``, and the histograms
  ``vllm:time_to_first_token_seconds`` (from submission),
  ``vllm:request_time_per_output_token_seconds`` (per request: the time
  after the first token over the tokens after it),
  ``vllm:e2e_request_latency_seconds``, ``vllm:request_queue_time_seconds``,
  ``vllm:request_inference_time_seconds``, ``vllm:request_prefill_time_seconds``,
  ``vllm:request_decode_time_seconds``, ``vllm:request_prompt_tokens``,
  ``vllm:request_generation_tokens``.

Each app has its own ``CollectorRegistry`` (several apps may live in one
process, as in the tests). ``Metrics.finished`` runs in the engine thread
before the request's last event is posted, so a response the client holds is
already counted.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest

TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"  # vllm:-style names are legal there

# vLLM's buckets (vllm/v1/metrics/loggers.py), so histograms compare across servers
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)


def token_buckets(max_len: int) -> list:
    """1, 2, 5, 10, 20, 50, ... up to max_len (vLLM's build_1_2_5_buckets)."""
    out, base = [], 1
    while True:
        for m in (1, 2, 5):
            if m * base > max_len:
                return out
            out.append(m * base)
        base *= 10


class Metrics:
    """The metrics of one server: ``scheduler`` (scheduler.Scheduler) read
    at scrape time, ``model_name`` the label value, ``max_model_len`` the
    context length (the token histograms' top bucket), ``finish``: the
    scheduler's finish reasons to the responses' (common.FINISH)."""

    def __init__(self, scheduler, model_name: str, max_model_len: int, finish: dict):
        self.scheduler = scheduler
        self.model_name = model_name
        self.finish = finish
        self.registry = CollectorRegistry()
        r, m = self.registry, ["model_name"]

        def counter(name, doc, labels=()):
            return Counter(name, doc, m + list(labels), registry=r)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, m, buckets=buckets, registry=r).labels(model_name)

        self._success = counter("vllm:request_success", "Requests finished, by the response's finish_reason.",
                                ["finished_reason"])
        for reason in sorted(set(finish.values())):  # every series from the start, as vLLM (rate() sees the first)
            self._success.labels(model_name, reason)
        self._prompt = counter("vllm:prompt_tokens", "Prompt tokens of finished requests (computed or cached).").labels(
            model_name)
        by_source = counter("vllm:prompt_tokens_by_source", "Prompt tokens of finished requests by source.",
                            ["source"])
        self._computed, self._hit = by_source.labels(model_name, "local_compute"), by_source.labels(
            model_name, "local_cache_hit")
        self._cached = counter("vllm:prompt_tokens_cached", "Prompt tokens taken from the prefix cache.").labels(
            model_name)
        self._generated = counter("vllm:generation_tokens", "Tokens generated by finished requests.").labels(model_name)
        self._ttft = histogram("vllm:time_to_first_token_seconds", "Time from submission to the first token.",
                               TTFT_BUCKETS)
        self._tpot = histogram("vllm:request_time_per_output_token_seconds",
                               "Per request: seconds after the first token per token after it.", TPOT_BUCKETS)
        self._e2e = histogram("vllm:e2e_request_latency_seconds", "Time from submission to the end.", LATENCY_BUCKETS)
        self._queue = histogram("vllm:request_queue_time_seconds", "Time waiting before admission.", LATENCY_BUCKETS)
        self._inference = histogram("vllm:request_inference_time_seconds", "Time from admission to the end.",
                                    LATENCY_BUCKETS)
        self._prefill = histogram("vllm:request_prefill_time_seconds", "Time from admission to the first token.",
                                  LATENCY_BUCKETS)
        self._decode = histogram("vllm:request_decode_time_seconds", "Time from the first token to the end.",
                                 LATENCY_BUCKETS)
        tb = token_buckets(max_model_len)
        self._n_prompt = histogram("vllm:request_prompt_tokens", "Prompt tokens per request.", tb)
        self._n_generated = histogram("vllm:request_generation_tokens", "Generated tokens per request.", tb)
        self.registry.register(_SchedulerCollector(scheduler, model_name))

    def finished(self, req) -> None:
        """Count a request (scheduler.Request) that has finished, whatever
        the reason; called once per request, from any thread."""
        n_prompt, cached, n_out = len(req.prompt_ids), min(req.cached_tokens, len(req.prompt_ids)), len(req.tokens)
        self._success.labels(self.model_name, self.finish.get(req.finish_reason, "error")).inc()
        self._prompt.inc(n_prompt)
        self._computed.inc(n_prompt - cached)
        self._hit.inc(cached)
        self._cached.inc(cached)
        self._generated.inc(n_out)
        self._n_prompt.observe(n_prompt)
        self._n_generated.observe(n_out)
        t0, t_start, t_first, t_done = req.t_submit, req.t_start, req.t_first, req.t_done
        self._e2e.observe(max(t_done - t0, 0.0))
        if t_start:  # admitted (a request cancelled while waiting never was)
            self._queue.observe(t_start - t0)
            self._inference.observe(max(t_done - t_start, 0.0))
        if t_first:
            self._ttft.observe(t_first - t0)
            self._prefill.observe(t_first - t_start)
            self._decode.observe(max(t_done - t_first, 0.0))
            if n_out > 1:
                self._tpot.observe(max(t_done - t_first, 0.0) / (n_out - 1))

    def render(self, accept: str | None) -> tuple:
        """(body bytes, content type): the classic text format (0.0.4)
        whatever the scrape's ``Accept`` asks. prometheus_client's
        OpenMetrics encoder writes vLLM's ``vllm:`` names in the TYPE lines
        and escaped ones in the samples under Prometheus 2.x's Accept header,
        which its own parser refuses ("Clashing name"); every Prometheus
        reads the text format."""
        return generate_latest(self.registry), TEXT_0_0_4


class _SchedulerCollector:
    """The scheduler's state at scrape time. Each value is one attribute
    read (atomic under the GIL), as ``/stats`` reads them; a scrape needs no
    consistency across them, so the engine's lock is not taken."""

    def __init__(self, scheduler, model_name: str):
        self.s, self.model_name = scheduler, model_name

    def collect(self):
        s, labels = self.s, [self.model_name]

        def gauge(name, doc, value):
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(labels, value)
            return g

        def counter(name, doc, value):
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric(labels, value)
            return c

        cache = s.cache
        yield gauge("vllm:num_requests_running", "Requests admitted and running.", len(s.running))
        yield gauge("vllm:num_requests_waiting", "Requests queued for admission.", len(s.waiting))
        yield gauge("vllm:kv_cache_usage_perc", "KV cache reserved by running requests, a fraction of the budget.",
                    min(max(s.kv_used / s.kv_bytes, 0.0), 1.0))
        yield gauge("intdet:prefix_cache_bytes", "KV cache held by retired prefix-cache entries (evicted on demand).",
                    cache.bytes if cache is not None else 0)
        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      cache.query_tokens if cache is not None else 0)
        yield counter("vllm:prefix_cache_hits", "Prompt tokens reused from the prefix cache.",
                      cache.hit_tokens if cache is not None else 0)
        yield counter("vllm:spec_decode_num_draft_tokens", "Speculative draft tokens proposed.", s.spec_drafted)
        yield counter("vllm:spec_decode_num_accepted_tokens", "Speculative draft tokens accepted.", s.spec_accepted)
