"""Tool-calling requests against ``intdet serve``, at 1 client and at N
clients at once: every response must be the same bytes (issue 52's target;
the response id and timestamp aside, which differ per request anyway).

    python scripts/tool_calls_concurrency.py -m MODEL [-n 200] [--clients 8]
    python scripts/tool_calls_concurrency.py --url http://127.0.0.1:8000 --api-key KEY

With -m it starts ``intdet serve -m MODEL --max-batch 8`` on a free port
(the model's chat template must have a tool-call format: Qwen2.5/Qwen3,
Llama 3.x, Mistral, Granite). The requests cycle through tool_choice
required, named, auto and none, whole and streamed, greedy and sampled,
fresh conversations and ones with a call and its result fed back. Prints
one JSON object: requests, clients, same, the indices that differ, seconds
per pass.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                                        "unit": {"type": "string", "enum": ["C", "F"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "a + b",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                                        "b": {"type": "integer", "minimum": -99, "maximum": 99}},
                       "required": ["a", "b"], "additionalProperties": False}}},
]
QUESTIONS = ["What is the weather in Paris?", "Add 2 and 40.", "Is it cold in Oslo today?", "What is 7 + 8?",
             "Tell me about Rome's weather, in F.", "hello"]
CHOICES = ["required", {"type": "function", "function": {"name": "add"}}, "auto",
           {"type": "function", "function": {"name": "get_weather"}}, "none"]


def bodies(n: int, seed: int = 0) -> list:
    """n chat requests with tools (deterministic in n and seed)."""
    out = []
    for i in range(n):
        q = QUESTIONS[(i + seed) % len(QUESTIONS)]
        msgs = [{"role": "developer", "content": "Use the tools."}, {"role": "user", "content": q}]
        if i % 4 == 3:  # a call and its result fed back
            msgs += [{"role": "assistant", "content": None, "tool_calls": [
                {"id": "abcdefghi", "type": "function",
                 "function": {"name": "add", "arguments": json.dumps({"a": i % 10, "b": 2})}}]},
                {"role": "tool", "tool_call_id": "abcdefghi", "content": str(i % 10 + 2)}]
        b = {"messages": msgs, "tools": TOOLS, "tool_choice": CHOICES[i % len(CHOICES)], "max_tokens": 96,
             "temperature": 0 if i % 3 == 0 else 0.8, "seed": seed * 1000 + i, "stream": i % 2 == 1}
        if b["tool_choice"] == "required":
            b["parallel_tool_calls"] = i % 10 == 0
        if b["stream"]:
            b["stream_options"] = {"include_usage": True}
        out.append(b)
    return out


def _strip(obj: dict) -> dict:
    # cached_tokens counts the prompt positions the prefix cache reused:
    # what ran before decides it, not a bit of the output
    out = {k: v for k, v in obj.items() if k not in ("id", "created")}
    if isinstance(out.get("usage"), dict):
        out["usage"] = {k: v for k, v in out["usage"].items() if k != "prompt_tokens_details"}
    return out


def one(url: str, body: dict, key: str | None) -> bytes:
    """The response to body, normalized: JSON with id, created and
    usage.prompt_tokens_details removed (each chunk's, for a stream), keys
    sorted."""
    u = urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(), headers=h)
    r = c.getresponse()
    raw = r.read().decode()
    c.close()
    if r.status != 200:
        return f"{r.status} {raw}".encode()
    if not body.get("stream"):
        return json.dumps(_strip(json.loads(raw)), sort_keys=True).encode()
    lines = [x[6:] for x in raw.split("\n\n") if x.startswith("data: ")]
    return "\n".join(x if x == "[DONE]" else json.dumps(_strip(json.loads(x)), sort_keys=True) for x in lines).encode()


def run(url: str, reqs: list, clients: int, key: str | None = None) -> list:
    """Every request's normalized response, ``clients`` at a time."""
    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(lambda b: one(url, b, key), reqs))


def start_server(model: str, max_batch: int):
    cmd = [sys.executable, "-m", "intdet", "serve", "-m", model, "--port", "0", "--max-batch", str(max_batch)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, INTDET_API_KEY=""))
    line = ""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line or "listening on http://" in line:
            break
    if "listening on http://" not in line:
        proc.kill()
        raise SystemExit(f"intdet serve did not start: {line.strip()}")
    return proc, "http://" + line.split("http://", 1)[1].split()[0].rstrip("/")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", help="start intdet serve on this model")
    ap.add_argument("--url", help="a running server instead of -m")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("-n", type=int, default=200, help="requests (default 200)")
    ap.add_argument("--clients", type=int, default=8, help="clients at once in the second pass (default 8)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if (a.model is None) == (a.url is None):
        ap.error("give -m MODEL or --url URL")
    proc, url = start_server(a.model, max(8, a.clients)) if a.model else (None, a.url)
    try:
        reqs = bodies(a.n, a.seed)
        t0 = time.perf_counter()
        alone = run(url, reqs, 1, a.api_key)
        t1 = time.perf_counter()
        together = run(url, reqs, a.clients, a.api_key)
        t2 = time.perf_counter()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    differ = [i for i, (x, y) in enumerate(zip(alone, together)) if x != y]
    errors = sum(x[:1].isdigit() for x in alone)  # "400 {...}": not a 200
    print(json.dumps({"requests": a.n, "clients": a.clients, "same": not differ, "differ": differ[:20],
                      "with_tool_calls": sum(b'"tool_calls"' in x for x in alone), "errors": errors,
                      "seconds_1_client": round(t1 - t0, 2), f"seconds_{a.clients}_clients": round(t2 - t1, 2)}))
    return 0 if not differ and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
