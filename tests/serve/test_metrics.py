"""`GET /metrics` of `intdet serve`: scraped and parsed by the Prometheus
client's own parser, its counters and histograms equal to what the requests
did (their usage blocks and finish reasons), its gauges the scheduler's."""

import http.client
import json
import signal
import socket
import time

from prometheus_client.parser import text_string_to_metric_families

import intdet
from intdet.serve.app import create_app
from test_serve import KEY, model_dir, post, request, sse, start_server  # noqa: F401  (model_dir: a fixture)

FEWSHOT = "Q: the cat sat on the mat. A: the mat. " * 6 + "Q: the dog sat on the log. A:"


def scrape(port, key=KEY, accept=None):
    """{sample name: {frozenset(labels): value}} of one scrape, parsed by prometheus_client."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics", headers={**({"Authorization": f"Bearer {key}"} if key else {}),
                                           **({"Accept": accept} if accept else {})})
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    assert r.status == 200 and r.getheader("content-type").startswith("text/plain"), (r.status, text)
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def value(m, name, **labels):
    """The sample of ``name`` with exactly ``labels`` and model_name "tiny"."""
    return m[name][frozenset({("model_name", "tiny"), *labels.items()})]




def test_metrics_equal_what_the_requests_did(model_dir):
    proc, port = start_server(model_dir, "--served-model-name", "tiny", "--prefix-cache", "--spec-ngram", "2",
                              "--max-batch", "4")
    try:
        m = scrape(port)
        assert value(m, "vllm:num_requests_running") == 0 and value(m, "vllm:num_requests_waiting") == 0
        for reason in ("stop", "length", "abort", "error"):  # every series from the start
            assert value(m, "vllm:request_success_total", finished_reason=reason) == 0
        assert value(m, "vllm:e2e_request_latency_seconds_count") == 0

        bodies = [
            {"prompt": "hello world", "max_tokens": 7, "temperature": 0, "seed": 0},
            {"prompt": ["one prompt", "and another"], "max_tokens": 5, "temperature": 0.8, "seed": 3},
            {"prompt": FEWSHOT, "max_tokens": 6, "temperature": 0, "seed": 1},
            {"prompt": FEWSHOT, "max_tokens": 6, "temperature": 0, "seed": 1},  # a prefix-cache hit
            {"prompt": "stop here", "max_tokens": 40, "temperature": 0, "seed": 0, "stop": ["zz", "ar "]},
        ]
        usages, reasons = [], []
        for b in bodies:
            status, r = post(port, "/v1/completions", b)
            assert status == 200, r
            usages.append(r["usage"])
            reasons += [c["finish_reason"] for c in r["choices"]]
        status, r = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                         "max_tokens": 4, "temperature": 0})
        assert status == 200, r
        usages.append(r["usage"])
        reasons += [c["finish_reason"] for c in r["choices"]]
        chunks = sse(port, "/v1/completions", {"prompt": "streamed", "max_tokens": 5, "stream": True,
                                               "stream_options": {"include_usage": True}, "temperature": 0})
        usages.append(chunks[-1]["usage"])
        reasons += [c["finish_reason"] for ch in chunks for c in ch["choices"] if c["finish_reason"]]
        n = len(reasons)  # sequences run (one per choice; every request here has n=1)
        assert n == 8

        m = scrape(port)
        prompt = sum(u["prompt_tokens"] for u in usages)
        cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
        assert cached >= 16  # the second few-shot prompt hit
        assert value(m, "vllm:prompt_tokens_total") == prompt
        assert value(m, "vllm:generation_tokens_total") == sum(u["completion_tokens"] for u in usages)
        assert value(m, "vllm:prompt_tokens_cached_total") == cached
        assert value(m, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == cached
        assert value(m, "vllm:prompt_tokens_by_source_total", source="local_compute") == prompt - cached
        assert value(m, "vllm:prefix_cache_hits_total") == cached
        assert value(m, "vllm:prefix_cache_queries_total") == prompt  # every prompt was looked up
        for reason in ("stop", "length", "abort", "error"):
            assert value(m, "vllm:request_success_total", finished_reason=reason) == reasons.count(reason), reason
        for h in ("vllm:e2e_request_latency_seconds", "vllm:time_to_first_token_seconds",
                  "vllm:request_queue_time_seconds", "vllm:request_inference_time_seconds",
                  "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                  "vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
            assert value(m, h + "_count") == n, h
            assert value(m, h + "_bucket", le="+Inf") == n, h
        assert value(m, "vllm:request_prompt_tokens_sum") == prompt
        assert value(m, "vllm:request_generation_tokens_sum") == sum(u["completion_tokens"] for u in usages)
        assert 0 < value(m, "vllm:e2e_request_latency_seconds_sum") < 600
        # per-request TPOT: the requests that made more than one token
        assert 0 < value(m, "vllm:request_time_per_output_token_seconds_count") <= n
        st = request(port, "GET", "/stats")[1]
        assert value(m, "vllm:spec_decode_num_draft_tokens_total") == st["spec_drafted_tokens"]
        assert value(m, "vllm:spec_decode_num_accepted_tokens_total") == st["spec_accepted_tokens"]
        assert value(m, "vllm:num_requests_running") == 0 and value(m, "vllm:kv_cache_usage_perc") == 0
        assert value(m, "intdet:prefix_cache_bytes") == st["prefix_cache"]["bytes"] > 0

        # a client that goes away mid-stream (16 sequences of 250 tokens on 4
        # slots: still running): each sequence counted once, the cut ones as "abort"
        before = {r: value(m, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length", "abort")}
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            body = json.dumps({"prompt": ["x", "y", "z", "w"], "n": 4, "max_tokens": 250, "stream": True,
                               "temperature": 0}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            assert s.recv(100).startswith(b"HTTP/1.1 200")  # the stream has begun
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and value(scrape(port), "vllm:e2e_request_latency_seconds_count") < n + 16:
            time.sleep(0.05)
        m = scrape(port)
        assert value(m, "vllm:e2e_request_latency_seconds_count") == n + 16
        after = {r: value(m, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length", "abort")}
        assert sum(after.values()) - sum(before.values()) == 16 and after["abort"] > before["abort"] == 0
        assert value(m, "vllm:num_requests_running") == value(m, "vllm:num_requests_waiting") == 0
        assert value(m, "vllm:kv_cache_usage_perc") == 0
        # Prometheus 2.x's Accept (OpenMetrics first) gets the text format,
        # which parses (prometheus_client's OpenMetrics output of the vllm:
        # names did not: "Clashing name")
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("GET", "/metrics", headers={
            "Authorization": f"Bearer {KEY}",
            "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                      "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"})
        r = c.getresponse()
        assert r.status == 200 and r.getheader("content-type").startswith("text/plain; version=0.0.4")
        fams = {f.name for f in text_string_to_metric_families(r.read().decode())}
        assert "vllm:request_success" in fams and "vllm:e2e_request_latency_seconds" in fams
        # the API key guards /metrics as it does /stats
        assert request(port, "GET", "/metrics", key=None)[0] == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_each_app_has_its_own_registry(model_dir):
    """Two apps in one process: each its own metrics (the global registry
    would refuse the second app's names)."""
    llm = intdet.load(model_dir, threads=1)
    a, b = create_app(llm, "a"), create_app(llm, "b")
    ma, mb = a.state.server.metrics, b.state.server.metrics
    req = llm.request([1, 2, 3], intdet.SamplingParams(max_tokens=2, temperature=0))
    llm.scheduler.submit(req)
    llm.scheduler.run_until_idle()
    ma.finished(req)
    ta, tb = ma.render(None)[0].decode(), mb.render(None)[0].decode()
    assert 'vllm:generation_tokens_total{model_name="a"} 2.0' in ta
    assert 'vllm:generation_tokens_total{model_name="b"} 0.0' in tb and 'model_name="a"' not in tb
