"""Issue 52's SIGTERM check: C concurrent long prompts (half streamed, half
not), SIGTERM after S seconds, and every response must still be whole (a
200 with a JSON body, or a stream with its finish chunk and [DONE]), the
server's log free of tracebacks and its exit status 0.

    python scripts/check_drain.py [-m MODEL] [--clients 12] [--words 900] [--after 1.5] [-- SERVE OPTIONS]

e.g. ``-- --step-tokens 4096 --drain-timeout 3 --threads 1 --after 3``.
Prompts are WikiText-2 words (../shared/data/wikitext-2-raw-test.txt when
present, else a repeated sentence). Prints one JSON object; exit 1 when a
response was cut, a traceback was logged or the exit status was not 0.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time

WIKI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "wikitext-2-raw-test.txt")


def words() -> list:
    if os.path.isfile(WIKI):
        with open(WIKI, encoding="utf-8") as f:
            return f.read().split()
    return ("the quick brown fox jumps over the lazy dog " * 20000).split()


def whole(k: int, status, text: str):
    """(whole?, finish reasons) of response k (even k: streamed)."""
    if status != 200:
        return False, None
    try:
        if k % 2 == 0:
            if not text.endswith("data: [DONE]\n\n"):
                return False, None
            chunks = [json.loads(x[6:]) for x in text.strip().split("\n\n") if x.startswith("data: {")]
            ends = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
            return len(ends) == 1, ends
        return True, [json.loads(text)["choices"][0]["finish_reason"]]
    except (ValueError, KeyError, IndexError):
        return False, None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--words", type=int, default=900, help="words per prompt (~1,100 tokens at 900)")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--after", type=float, default=1.5, help="seconds from the requests to SIGTERM")
    a = ap.parse_args(argv)
    cmd = [sys.executable, "-m", "intdet", "serve", "--port", "0", *(["-m", a.model] if a.model else []), *serve_args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=dict(os.environ, INTDET_API_KEY=""))
    line = ""
    while "listening on http://" not in line:
        line = proc.stderr.readline()
        if not line:
            print(json.dumps({"error": "the server did not start"}))
            return 1
    port = int(line.split("http://127.0.0.1:")[1].split()[0])
    log: list = []
    threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
    ws = words()
    out: dict = {}

    def one(k):
        prompt = " ".join(ws[k * a.words:(k + 1) * a.words])
        body = {"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0, "stream": k % 2 == 0}
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        try:
            c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            out[k] = (r.status, r.read().decode())
        except Exception as e:  # noqa: BLE001  (a cut response is what this checks)
            out[k] = (None, repr(e))

    ts = [threading.Thread(target=one, args=(k,)) for k in range(a.clients)]
    for t in ts:
        t.start()
    time.sleep(a.after)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    for t in ts:
        t.join(600)
    rc = proc.wait(600)
    judged = [whole(k, *out.get(k, (None, ""))) for k in range(a.clients)]
    finishes: dict = {}
    for ok, ends in judged:
        for e in ends or []:
            finishes[e] = finishes.get(e, 0) + 1
    res = {"clients": a.clients, "whole": sum(ok for ok, _ in judged), "finish_reasons": finishes,
           "tracebacks": sum("Traceback" in ln for ln in log), "exit_status": rc,
           "seconds_from_sigterm_to_exit": round(time.monotonic() - t0, 2), "serve_args": serve_args}
    print(json.dumps(res))
    return 0 if res["whole"] == a.clients and not res["tracebacks"] and rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
