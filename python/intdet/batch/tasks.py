"""The tasks of ``intdet batch``: a ``TaskRunner`` holds one model
(``intdet.LLM``) and turns a batch of items into output records.

Every record is ``{"id", "task", "result", "error"}``: ``error`` is null and
``result`` the task's result, or ``error`` is a one-line message and
``result`` null (one bad item never fails the batch). ``record_line`` writes
it as canonical JSON (sorted keys, no spaces), so equal records are equal
bytes. Numbers are integers or exact floats: a log-probability is
``*_q``, an int in Q24 nats (logprobs.py, the fixed-point log-softmax), and
its float is the exact quotient q / 2^24.

Results:
* generate: prompt_tokens, tokens, text, finish_reason, hash (chain hash),
  seed, truncated, cumulative_logprob_q; logprobs ([{token, logprob_q,
  logprob, behaviour_logprob_q, top: [[id, q]]}]) when the item asks for
  them; receipt (receipts.py, docs/receipts.md) with ``--receipts``.
* score: tokens (continuation ids), logprob_q, logprob, is_greedy, hash,
  token_logprobs_q; top ([[[id, q]]] per token) when top > 0.
* compress: bytes (UTF-8 bytes of the text), compressed_bytes (the
  intdet.compress container), tokens, chunks, stored_chunks, sha256 (of the
  container); data (base64) when asked.
* perplexity: nll_q (sum over the scored tokens of -log p, Q24 nats, an
  int), tokens (scored tokens: each window of T tokens scores T - 1), bytes
  (UTF-8 bytes of the scored tokens' text, as ``intdet perplexity``),
  windows, nll (nll_q / 2^24, exact). A text item of a model whose
  tokenizer adds a BOS (Gemma 3) starts every window with it, as ``intdet
  perplexity`` does (perplexity.window_bos); ids items are run as given.
  Corpus totals add these integers (output.summarize), so they are the same
  whatever the split.

Items of one task in a batch run together through the scheduler (continuous
batching over forward_batch), which gives every item the same bits as alone;
an item that fails its checks gets its error and the others still run.
"""

from __future__ import annotations

import json
import os

from ..errors import IntdetError
from ..logprobs import to_float
from .items import Item

COMPRESS_UNAVAILABLE = "task compress: not available in this build (no intdet.compress codec)"


def _codec():
    """intdet.compress.codec, or None in a build without it."""
    try:
        from .. import _core
        from ..compress import codec
    except ImportError:
        return None
    return codec if hasattr(_core, "compress") and hasattr(codec, "compress_stream") else None


def record_line(rec: dict) -> str:
    """A record as one canonical JSON line (no newline)."""
    return json.dumps(rec, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def error_record(item: Item, msg: str) -> dict:
    rec = {"id": item.id, "task": item.task, "result": None, "error": msg, "item_sha256": item.digest()}
    if item.key.startswith("line:"):
        rec["line"] = item.index + 1
    return rec


def ok_record(item: Item, result: dict) -> dict:
    return {"id": item.id, "task": item.task, "result": result, "error": None, "item_sha256": item.digest()}


def _one_line(e: BaseException) -> str:
    if isinstance(e, IntdetError):
        return str(e)
    return f"internal error: {type(e).__name__}: {e}".splitlines()[0]


class TaskRunner:
    """One model, loaded once; ``run(items) -> [record]`` in item order.

    Args: model (any source ``intdet generate -m`` takes; a converted
    directory loads without converting), device, threads (None/0 = all
    cores), max_batch (sequences the scheduler runs together), revision and
    weights (when the model needs converting), prefix_cache (the scheduler
    reuses the KV cache of prompts' shared starts: scheduler.py), receipts
    (every generate result carries its receipt). Raises IntdetError when
    the model cannot be loaded."""

    def __init__(self, model, device: str = "cpu", threads=None, max_batch: int = 16, revision=None, weights=None,
                 prefix_cache: bool = False, receipts: bool = False):
        from ..api import LLM

        self.receipts = receipts
        self.llm = LLM(model, device=device, threads=threads or None, max_batch=max(1, max_batch), revision=revision,
                       weights=weights, prefix_cache=prefix_cache)

    # ------------------------------------------------------------ per task

    def _generate_args(self, it: Item):
        from ..api import SamplingParams

        f = it.fields
        if "messages" in f:
            ids = self.llm.chat_ids(f["messages"])
        else:
            field = "prompt" if "prompt" in f else "ids"
            ids = self.llm.prompt_ids(f[field], field)
        kw = {k: f[k] for k in f if k not in ("prompt", "messages", "ids")}
        if isinstance(kw.get("stop"), list):
            kw["stop"] = tuple(kw["stop"])
        try:
            sp = SamplingParams(**kw, receipt=self.receipts)
        except TypeError as e:
            raise IntdetError(str(e)) from None
        # every check the run makes (context, KV cache) before anything runs; prompt_ids checked the ids
        self.llm.request(ids, sp, ids_checked="messages" not in f)
        return ids, sp

    def _generate_result(self, c) -> dict:
        r = {"prompt_tokens": len(c.prompt_ids), "tokens": c.tokens, "text": c.text,
             "finish_reason": c.finish_reason, "hash": c.hash, "seed": c.seed, "truncated": c.truncated,
             "cumulative_logprob_q": None}
        if c.logprobs is not None:
            r["cumulative_logprob_q"] = sum(t.logprob_q for t in c.logprobs)
            r["logprobs"] = [{"token": t.token, "logprob_q": t.logprob_q, "logprob": to_float(t.logprob_q),
                              "behaviour_logprob_q": t.behaviour_logprob_q, "top": [[i, q] for i, q in t.top]}
                             for t in c.logprobs]
        if c.receipt is not None:
            r["receipt"] = c.receipt
        return r

    def _score_args(self, it: Item):
        f = it.fields
        c_ids = self.llm.prompt_ids(f["context"], "context")
        cont = f["continuation"]
        k_ids = self.llm.prompt_ids(self.llm.encode(cont, add_bos=False) if isinstance(cont, str) else list(cont),
                                    "continuation")
        return c_ids, k_ids, f.get("top", 0)

    def _check_score(self, c_ids, k_ids):
        from ..api import SamplingParams

        self.llm.request(c_ids + k_ids, SamplingParams(max_tokens=0, prompt_logprobs=1), score_from=len(c_ids),
                         ids_checked=True)

    @staticmethod
    def _score_result(s, top: int) -> dict:
        r = {"tokens": s.continuation_ids, "logprob_q": s.logprob_q, "logprob": to_float(s.logprob_q),
             "is_greedy": s.is_greedy, "hash": s.hash, "token_logprobs_q": [t.logprob_q for t in s.logprobs]}
        if top:
            r["top"] = [[[i, q] for i, q in t.top] for t in s.logprobs]
        return r

    def _perplexity_windows(self, it: Item):
        from ..perplexity import window_bos, windows_of

        f = it.fields
        ids = self.llm.encode(f["text"], add_bos=False) if "text" in f else list(f["ids"])
        bos = window_bos(self.llm.meta) if "text" in f else None
        ctx = f.get("ctx")
        n = self.llm.context_length
        if ctx is None:
            if bos is not None:
                ids = [bos] + ids
            if len(ids) < 2:
                raise IntdetError(f"text: {len(ids)} token(s); perplexity needs at least 2")
            if len(ids) > n:
                raise IntdetError(f"text: {len(ids)} tokens do not fit the context length {n} "
                                  "(give ctx to cut it into windows)")
            wins = [ids]
        else:
            if ctx > n:
                raise IntdetError(f"ctx: {ctx} is more than the context length {n}")
            wins = windows_of(ids, ctx, bos=bos)
        for w in wins:
            self._check_score(w[:1], w[1:])
        return wins

    def _compress(self, it: Item) -> dict:
        """One text through intdet.compress (compress_stream: chunks coded
        one after another; the container is the same bytes anywhere)."""
        codec = _codec()
        if codec is None:
            raise IntdetError(COMPRESS_UNAVAILABLE)
        import base64
        import hashlib
        import io

        data = it.fields["text"].encode("utf-8")
        ctx = it.fields.get("ctx", min(codec.DEFAULT_CTX, self.llm.context_length))
        if ctx > self.llm.context_length:
            raise IntdetError(f"ctx: {ctx} is more than the context length {self.llm.context_length}")
        out = io.BytesIO()
        st = codec.compress_stream(self.llm.engine, io.BytesIO(data).read, out, ctx=ctx)
        blob = out.getvalue()
        r = {"bytes": st.in_bytes, "compressed_bytes": st.out_bytes, "tokens": st.tokens, "chunks": st.chunks,
             "stored_chunks": st.stored_chunks, "sha256": hashlib.sha256(blob).hexdigest()}
        if it.fields.get("return_data"):
            r["data"] = base64.b64encode(blob).decode("ascii")
        return r

    def _n_bytes(self, ids) -> int:
        return len(self.llm.tokenizer.decode(ids).encode("utf-8"))

    # ------------------------------------------------------------ batch

    def run(self, items: list) -> list:
        """Records for ``items`` (a list of Item), in the same order."""
        out = [None] * len(items)
        gen, sco, ppl = [], [], []
        for k, it in enumerate(items):
            try:
                if it.error:
                    out[k] = error_record(it, it.error)
                elif it.task == "generate":
                    gen.append((k, self._generate_args(it)))
                elif it.task == "score":
                    args = self._score_args(it)
                    self._check_score(args[0], args[1])
                    sco.append((k, args))
                elif it.task == "perplexity":
                    ppl.append((k, self._perplexity_windows(it)))
                else:
                    out[k] = ok_record(it, self._compress(it))
            except Exception as e:  # noqa: BLE001 (one bad item never fails the batch)
                out[k] = error_record(it, _one_line(e))
        self._run_group(items, out, gen, self._run_generate)
        self._run_group(items, out, sco, self._run_score)
        self._run_group(items, out, ppl, self._run_perplexity)
        return out

    def _run_group(self, items, out, group, fn):
        """Run ``group`` batched; should that fail, each item alone (the same
        bits: results do not depend on the batch), so one failure names one item."""
        if not group:
            return
        try:
            for (k, _), res in zip(group, fn([a for _, a in group])):
                out[k] = ok_record(items[k], res)
            return
        except Exception:  # noqa: BLE001
            if len(group) == 1:
                pass
            else:
                for g in group:
                    self._run_group(items, out, [g], fn)
                return
        k, a = group[0]
        try:
            out[k] = ok_record(items[k], fn([a])[0])
        except Exception as e:  # noqa: BLE001
            out[k] = error_record(items[k], _one_line(e))

    def _run_generate(self, args):
        outs = self.llm.generate([ids for ids, _ in args], [sp for _, sp in args])
        res = []
        for c in outs:
            if c.error or c.finish_reason == "error":
                raise IntdetError(c.error or "generation failed")
            res.append(self._generate_result(c))
        return res

    def _run_score(self, args):
        scores = self.llm.score([(c, k) for c, k, _ in args], top=max(t for _, _, t in args))
        return [self._score_result(s, t) if t == max(t for _, _, t in args) else
                self._score_result(_cut_top(s, t), t) for s, (_, _, t) in zip(scores, args)]

    def _run_perplexity(self, args):
        pairs = [(w[:1], w[1:]) for wins in args for w in wins]
        scores = iter(self.llm.score(pairs))
        res = []
        for wins in args:
            nll_q = tokens = n_bytes = 0
            for w in wins:
                s = next(scores)
                nll_q -= s.logprob_q
                tokens += len(w) - 1
                n_bytes += self._n_bytes(w[1:])
            res.append({"nll_q": nll_q, "tokens": tokens, "bytes": n_bytes, "windows": len(wins),
                        "nll": to_float(nll_q)})
        return res


def _cut_top(s, top: int):
    from dataclasses import replace

    from ..scheduler import TokenLogprob

    return replace(s, logprobs=[TokenLogprob(t.token, t.logprob_q, t.top[:top]) for t in s.logprobs])


def default_threads(workers: int) -> int:
    """CPU threads per worker when the user gives none: the cores shared out."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))
