"""Receipts: what a generation needs to be replayed bit for bit elsewhere
(docs/receipts.md), and their replay (``intdet verify``).

A receipt is a JSON object (``RECEIPT_VERSION`` 1):
  receipt_version  1
  model_sha256     sha256 of model.safetensors (the chain hash's model id)
  format_version   the model format version (the chain hash's first field)
  prompt_ids       the ids run (after any truncation)
  sampling         temperature, top_p, min_p, repeat_penalty (exact decimal
                   strings), top_k, repeat_last_n, seed (ints)
  structured_outputs  null, or {kind: value} of the grammar that masked the picks
  output_ids       the generated ids (EOS or the stop string's token included)
  finish_reason    eos, stop, length, context, cancelled, error
  chain_hash       the chain hash after the last output id, all 32 hex
                   digits (docs/chain-hash.md; its first 12 are ``hash``)
  step_hashes      (when asked) the 12-digit chain hash after every output id

Replay forces the recorded output ids (teacher forcing) through the
scheduler: a ``ForcedChooser`` per receipt picks each step's token with the
recorded sampler (same seed, position, history and mask) on this machine's
logits, notes the first step where that pick differs from the record, and
feeds the recorded id on; the scheduler's chain hash (and step hashes) of
the forced run are then compared with the receipt's. So a changed output id
is named at its step, and logits that differ anywhere change the hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from .errors import IntdetError
from .sampling import Sampler

RECEIPT_VERSION = 1
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed")
RECEIPT_KEYS = ("receipt_version", "model_sha256", "format_version", "prompt_ids", "sampling", "structured_outputs",
                "output_ids", "finish_reason", "chain_hash", "step_hashes")
FINISH_REASONS = ("eos", "stop", "length", "context", "cancelled", "error")  # api.FINISH_REASONS


def _dec(num: int, den: int) -> str:
    """num / den (a finite decimal: den divides a power of ten) as its exact decimal string."""
    return format((Decimal(num) / Decimal(den)).normalize(), "f")


def sampling_fields(s: Sampler) -> dict:
    """A sampler's parameters as exact JSON values (decimals as strings, so
    0.7 stays 7/10 whatever reads it)."""
    return {"temperature": _dec(s.t_num, s.t_den), "top_k": s.top_k, "top_p": _dec(s.p_num, s.p_den),
            "min_p": _dec(s.m_num, s.m_den), "repeat_penalty": _dec(s.r_num, s.r_den),
            "repeat_last_n": s.repeat_last_n, "seed": s.seed}


def head(lm, sampler: Sampler, structured=None) -> dict:
    """The fields of a receipt known when a request starts: the model (a
    ``model.LoadedModel``: the version the request runs on), the sampler
    and the structured-output parameters (None or StructuredOutputsParams)."""
    so = None if structured is None else {structured.kind(): getattr(structured, structured.kind())}
    return {"receipt_version": RECEIPT_VERSION, "model_sha256": lm.model_sha256,
            "format_version": lm.cfg["format_version"], "sampling": sampling_fields(sampler),
            "structured_outputs": so}


def finish(hd: dict, req) -> dict:
    """The receipt of a finished scheduler Request whose ``head`` is ``hd``."""
    r = dict(hd, prompt_ids=list(req.prompt_ids), output_ids=list(req.tokens), finish_reason=req.finish_reason,
             chain_hash=req.chain_hash)
    if getattr(req, "model_version", ""):  # the weights it was admitted on (LLM.update_weights swaps between)
        r["model_sha256"] = req.model_version
    if req.step_hashes is not None:
        r["step_hashes"] = list(req.step_hashes)
    return {k: r[k] for k in RECEIPT_KEYS if k in r}


# ------------------------------------------------------------------ reading


def _fail(where: str, msg: str):
    raise IntdetError(f"{where}: {msg}", field="receipt")


def _int_list(v, where, name):
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v):
        _fail(where, f"{name} must be a list of token ids (integers >= 0)")
    return v


def _hex(v, n, where, name):
    if not isinstance(v, str) or len(v) != n or any(c not in "0123456789abcdef" for c in v):
        _fail(where, f"{name} must be {n} lowercase hex digits")
    return v


def check_receipt(d, where: str) -> dict:
    """``d`` checked as a receipt (IntdetError naming ``where`` and the field
    otherwise); returns it."""
    if not isinstance(d, dict):
        _fail(where, "a receipt must be a JSON object")
    missing = [k for k in RECEIPT_KEYS if k not in d and k != "step_hashes"]
    if missing:
        _fail(where, f"not a receipt: no {', '.join(missing)}")
    if d["receipt_version"] != RECEIPT_VERSION:
        _fail(where, f"receipt_version {d['receipt_version']!r} is not supported (this intdet reads {RECEIPT_VERSION})")
    _hex(d["model_sha256"], 64, where, "model_sha256")
    if not isinstance(d["format_version"], int) or isinstance(d["format_version"], bool):
        _fail(where, "format_version must be an integer")
    if not _int_list(d["prompt_ids"], where, "prompt_ids"):
        _fail(where, "prompt_ids: empty")
    _int_list(d["output_ids"], where, "output_ids")
    _hex(d["chain_hash"], 32, where, "chain_hash")
    if d["finish_reason"] not in FINISH_REASONS:
        _fail(where, f"finish_reason {d['finish_reason']!r}: one of {', '.join(FINISH_REASONS)}")
    sh = d.get("step_hashes")
    if sh is not None:
        if not isinstance(sh, list) or len(sh) != len(d["output_ids"]):
            _fail(where, "step_hashes must list one hash per output id")
        for h in sh:
            _hex(h, 12, where, "step_hashes[]")
    s = d["sampling"]
    if not isinstance(s, dict) or sorted(s) != sorted(SAMPLING_KEYS):
        _fail(where, f"sampling must hold exactly {', '.join(SAMPLING_KEYS)}")
    so = d["structured_outputs"]
    if so is not None and not (isinstance(so, dict) and len(so) == 1):
        _fail(where, "structured_outputs must be null or one {kind: value}")
    sampler_of(d, where)
    return d


def sampler_of(d: dict, where: str) -> Sampler:
    """The recorded Sampler of a receipt (IntdetError naming the field)."""
    s = d["sampling"]
    for k in ("top_k", "repeat_last_n", "seed"):
        if not isinstance(s[k], int) or isinstance(s[k], bool):
            _fail(where, f"sampling.{k} must be an integer")
    for k in ("temperature", "top_p", "min_p", "repeat_penalty"):
        if not isinstance(s[k], str):
            _fail(where, f"sampling.{k} must be an exact decimal string")
    try:
        return Sampler(**s)
    except IntdetError as e:
        _fail(where, f"sampling.{e}")  # the sampler names its field ("top_p: ...")


def receipts_in(obj, where: str) -> list:
    """The receipts an object holds, as [(where, receipt)]: itself, the one
    under ``receipt`` (a generate --json object), under ``result.receipt``
    (an ``intdet batch`` record), or under each of ``choices[i].receipt`` (a
    saved server response). IntdetError when it holds none."""
    if isinstance(obj, dict) and "receipt_version" in obj:
        return [(where, obj)]
    if isinstance(obj, dict):
        if isinstance(obj.get("receipt"), dict):
            return [(where, obj["receipt"])]
        res = obj.get("result")
        if isinstance(res, dict) and isinstance(res.get("receipt"), dict):
            return [(f"{where} (id {obj.get('id')!r})", res["receipt"])]
        ch = obj.get("choices")
        if isinstance(ch, list):
            out = [(f"{where} choices[{i}]", c["receipt"]) for i, c in enumerate(ch)
                   if isinstance(c, dict) and isinstance(c.get("receipt"), dict)]
            if out:
                return out
    _fail(where, "holds no receipt (a receipt object, or one under \"receipt\", \"result.receipt\" or "
                 "\"choices[].receipt\")")


# ------------------------------------------------------------------ replay


class ForcedChooser:
    """Teacher forcing for one receipt (a scheduler ``Request.chooser``):
    each step returns the recorded id, after noting whether the recorded
    sampler picks that id from this machine's logits at that position
    (``first_bad_pick``: the first step, 1-based, where it does not; the
    step's own pick in ``picked``)."""

    def __init__(self, sampler: Sampler, prompt_ids: list, output_ids: list, grammar=None):
        self.sampler, self.output_ids = sampler, output_ids
        self.position = len(prompt_ids)
        self.history = list(prompt_ids) if sampler.penalized else None
        self.grammar = grammar.matcher() if grammar is not None else None
        self.step = 0
        self.first_bad_pick: int | None = None
        self.picked: int | None = None

    def _next(self, row) -> int:
        want = self.output_ids[self.step]
        if self.first_bad_pick is not None:  # only the first divergence is reported: force the rest
            self.step += 1
            return want
        try:
            allowed = self.grammar.allowed() if self.grammar is not None else None
            got = self.sampler.pick(row, self.position, self.history or (), allowed)
        except IntdetError:  # the grammar allows nothing here
            got = -1
        if got != want and self.first_bad_pick is None:
            self.first_bad_pick, self.picked = self.step + 1, got
        if self.grammar is not None and self.first_bad_pick is None:
            self.grammar.advance(want)  # (a token the grammar refuses differs from the pick: not advanced)
        if self.history is not None:
            self.history.append(want)
        self.step += 1
        self.position += 1
        return want

    @staticmethod
    def choose_rows(choosers, rows) -> list:
        return [c._next(row) for c, row in zip(choosers, rows)]


@dataclass
class Verdict:
    """One receipt's replay: ``ok``, else ``step`` (1-based, the first
    divergent output step; None when the divergence has no step: the model,
    or a final hash without step hashes) and ``reason`` (one line)."""

    where: str
    ok: bool
    step: int | None = None
    reason: str = ""

    def line(self) -> str:
        if self.ok:
            return f"{self.where}: match"
        at = f" at step {self.step}" if self.step is not None else ""
        return f"{self.where}: MISMATCH{at}: {self.reason}"


def replay(llm, receipts: list, model_name: str = "the model") -> list:
    """Replay [(where, receipt)] on ``llm`` (an ``api.LLM``), all as one
    batch through its scheduler; returns a [Verdict] in the same order.
    A receipt of another model (sha256 or format version) is not run: its
    verdict names both models."""
    from .scheduler import Request

    mine = llm.model_sha256
    fmt = llm.lm.cfg["format_version"]
    verdicts: list = [None] * len(receipts)
    jobs = []
    for i, (where, d) in enumerate(receipts):
        if d["model_sha256"] != mine or d["format_version"] != fmt:
            verdicts[i] = Verdict(where, False, None,
                                  f"model differs: the receipt's is sha256 {d['model_sha256'][:16]}... format "
                                  f"{d['format_version']}, {model_name} is sha256 {mine[:16]}... format {fmt}")
            continue
        bad = next((k for k, t in enumerate(d["output_ids"]) if t >= llm.vocab_size), None)
        if bad is not None:  # this receipt alone fails (the batch must not)
            verdicts[i] = Verdict(where, False, bad + 1, f"output id {d['output_ids'][bad]} at step {bad + 1} is "
                                                         f"outside the vocabulary [0, {llm.vocab_size})")
            continue
        grammar = None
        if d["structured_outputs"] is not None:
            from .structured import structured_from_any

            try:
                grammar = llm.grammar(structured_from_any(d["structured_outputs"]))
            except IntdetError as e:
                verdicts[i] = Verdict(where, False, None, f"cannot run here: {e}")
                continue
        ch = ForcedChooser(sampler_of(d, where), d["prompt_ids"], d["output_ids"], grammar)
        req = Request(d["prompt_ids"], len(d["output_ids"]), ch.sampler, chooser=ch,
                      step_hashes=d.get("step_hashes") is not None)
        try:
            llm.scheduler.check(req)
        except IntdetError as e:
            verdicts[i] = Verdict(where, False, None, f"cannot run here: {e}")
            continue
        jobs.append((i, req, ch))
    # one batch: the scheduler runs them together (LLM._run: submit, step until done, Ctrl-C retires them)
    llm.run([r for _, r, _ in jobs])
    for i, req, ch in jobs:
        where, d = receipts[i]
        verdicts[i] = _judge(where, d, req, ch, llm)
    return verdicts


def _judge(where: str, d: dict, req, ch: ForcedChooser, llm) -> Verdict:
    if req.finish_reason == "error":
        return Verdict(where, False, None, f"replay failed: {req.error}")
    rec = d.get("step_hashes")
    bad_hash = None
    if rec is not None:
        bad_hash = next((k + 1 for k, (a, b) in enumerate(zip(rec, req.step_hashes)) if a != b), None)
    candidates = [s for s in (ch.first_bad_pick, bad_hash) if s is not None]
    if candidates:
        step = min(candidates)
        if step == ch.first_bad_pick:
            want = d["output_ids"][step - 1]
            got = "no token (the grammar allows none)" if ch.picked < 0 else f"{ch.picked} {llm.token_text(ch.picked)!r}"
            return Verdict(where, False, step, f"the receipt has token {want} {llm.token_text(want)!r}, "
                                               f"the sampler picks {got}")
        return Verdict(where, False, step, f"the chain hash differs (logits differ): receipt {rec[step - 1]}, "
                                           f"here {req.step_hashes[step - 1]}")
    if req.chain_hash != d["chain_hash"]:
        return Verdict(where, False, None, f"the chain hash differs: receipt {d['chain_hash']}, here {req.chain_hash} "
                                           "(ask for step hashes to find the step)")
    return Verdict(where, True)
