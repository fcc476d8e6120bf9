"""The public Python API: load a model, generate (one prompt or many,
batched), stream, chat, and score continuations, every result with its
chain hash.

    import intdet
    llm = intdet.load()                      # default SmolLM2-135M-Instruct; any source -m accepts
    c = llm.generate("The capital of France is", intdet.SamplingParams(max_tokens=40))
    c.text, c.tokens, c.hash                 # c.hash == `intdet generate ... -n 40`'s hash
    outs = llm.generate(["a", "b", [1, 2, 3]], intdet.SamplingParams(temperature=0.8, seed=7))
    for chunk in llm.stream("Once upon a time"):
        print(chunk.text, end="")
    s = llm.stream("Once upon a time")          # a Stream: close() it early, read s.completion
    s = llm.score("The capital of France is", " Paris")
    s.logprob, s.is_greedy, s.hash

Many prompts run together through one ``Scheduler`` (continuous batching
over ``forward_batch``); each result is the same bits as the prompt run
alone with ``intdet generate`` (same tokens, text, log-probabilities and
hash), whatever else is in the batch. Log-probabilities are fixed-point
(logprobs.py): ``TokenLogprob.logprob_q`` is an int in Q24 nats and
``.logprob`` its exact float value, identical on every machine.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence, Union

from . import receipts
from .errors import IntdetError, check_token_ids
from .logprobs import MAX_LOGPROBS, to_float
from .sampling import MASK64, Sampler, splitmix64
from .structured import Grammar, StructuredOutputsParams, grammar_tokenizer, structured_from_any
from .scheduler import DEFAULT_KV_BYTES, DEFAULT_MAX_BATCH, DEFAULT_STEP_TOKENS, Request, Scheduler, TokenLogprob

Prompt = Union[str, Sequence[int]]

GRAMMAR_CACHE = 64  # compiled structured-output grammars an LLM keeps
DEFAULT_DRAFT_TOKENS = 4  # drafts per step from a draft model (llama.cpp's --draft-max is 16; small models gain less)
FINISH_REASONS = ("eos", "stop", "length", "context", "cancelled", "error")


def _check_params(params, n: int) -> list:
    """One SamplingParams per prompt (None: the defaults), or IntdetError."""
    params = SamplingParams() if params is None else params
    per = list(params) if isinstance(params, (list, tuple)) else [params] * n
    for p in per:
        if not isinstance(p, SamplingParams):
            raise IntdetError(f"params: expected intdet.SamplingParams (or a list of them), got {type(p).__name__}",
                              field="params")
    if len(per) != n:
        raise IntdetError(f"params: {len(per)} SamplingParams for {n} prompts", field="params")
    return per


def derive_seed(seed: int, index: int) -> int:
    """The seed of choice ``index`` of a request seeded ``seed`` (n > 1):
    choice 0 keeps ``seed``, choice i > 0 gets SplitMix64(seed + i), so
    every choice draws independently and is reproducible alone.
    Raises IntdetError for a seed outside [0, 2^64) or an index < 0."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MASK64:
        raise IntdetError(f"seed: {seed!r} must be an integer in [0, 2^64)", field="seed")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise IntdetError(f"index: {index!r} must be an integer >= 0", field="index")
    return seed if index == 0 else splitmix64((seed + index) & MASK64)


@dataclass
class SamplingParams:
    """How to generate (vLLM's ``SamplingParams`` names; intdet's exact integer
    sampling, sampling.py).

    max_tokens: most tokens to generate (>= 0; the generation also ends at an
        EOS id, a stop string or the end of the context).
    temperature: 0 = greedy (integer argmax, lowest id on ties); else an
        exact decimal in (0, 100] (a float is read by its shortest repr, so
        0.7 is 7/10; at most 6 decimal places).
    top_k (0 = off), top_p in (0, 1] (1 = off), min_p in [0, 1] (0 = off).
    repeat_penalty in (0, 100] (1 = off; llama.cpp's, greedy too) over the
        last repeat_last_n ids (-1 = all, 0 = off).
    seed: int in [0, 2^64): keys the draws with the position (default 0,
        as ``intdet generate``).
    stop: strings that end the generation (not included in the text).
    logprobs: None, or k in [0, 20] (MAX_LOGPROBS): each generated token's
        log-probability and the k most likely tokens at its position.
    prompt_logprobs: None, or k in [0, 20]: the same for each prompt token
        after the first.
    truncate: None (a prompt that does not fit is an error), "left" or
        "right" (as ``intdet generate --truncate``).
    structured_outputs: None, or a ``StructuredOutputsParams`` (or a dict
        of its fields: json, json_object, regex, choice, grammar): the
        output matches it (an exact mask on the logits; structured.py);
        or a ``Grammar`` that ``LLM.grammar`` compiled for this model.
    receipt: the Completion carries a ``receipt`` (receipts.py,
        docs/receipts.md) that ``intdet verify`` replays bit for bit.
    step_hashes: keep the chain hash after every generated token
        (``Completion.step_hashes``, and in the receipt: a replay then
        names the first step whose logits differ).
    Raises IntdetError (naming the field) for a value out of range.
    """

    max_tokens: int = 16
    temperature: Union[float, int, str] = 0
    top_p: Union[float, int, str] = 1
    top_k: int = 0
    min_p: Union[float, int, str] = 0
    repeat_penalty: Union[float, int, str] = 1
    repeat_last_n: int = 64
    seed: int = 0
    stop: Sequence[str] = ()
    logprobs: Union[int, None] = None
    prompt_logprobs: Union[int, None] = None
    truncate: Union[str, None] = None
    structured_outputs: Union[StructuredOutputsParams, Grammar, dict, None] = None
    receipt: bool = False
    step_hashes: bool = False

    def sampler(self) -> Sampler:
        """The integer ``Sampler`` of these parameters (IntdetError naming the field)."""
        return Sampler(temperature=str(self.temperature), top_k=self.top_k, top_p=str(self.top_p),
                       seed=self.seed, min_p=str(self.min_p), repeat_penalty=str(self.repeat_penalty),
                       repeat_last_n=self.repeat_last_n)

    def __post_init__(self):
        self.check()  # a bad value fails where it is written, not at generate()

    def check(self) -> None:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 0:
            raise IntdetError(f"max_tokens: {self.max_tokens!r} must be an integer >= 0", field="max_tokens")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_LOGPROBS):
                raise IntdetError(f"{name}: {v!r} must be None or an integer in [0, {MAX_LOGPROBS}] "
                                  "(as the server's, vLLM's default max_logprobs)", field=name)
        if self.truncate not in (None, "left", "right"):
            raise IntdetError(f"truncate: {self.truncate!r}: choose None, 'left' or 'right'", field="truncate")
        if not isinstance(self.stop, (list, tuple)) or not all(isinstance(s, str) for s in self.stop):
            raise IntdetError(f"stop: must be a list of strings (got {type(self.stop).__name__})", field="stop")
        if any(x == "" for x in self.stop):  # it never fired: refused, as the CLI's --stop ""
            raise IntdetError("stop: an empty string never ends the text", field="stop")
        for name in ("receipt", "step_hashes"):
            if not isinstance(getattr(self, name), bool):
                raise IntdetError(f"{name}: {getattr(self, name)!r} must be true or false", field=name)
        self.structured_outputs = structured_from_any(self.structured_outputs)
        self.sampler()


@dataclass
class Completion:
    """One generation.

    prompt_ids: the ids run (after truncation); tokens: the generated ids
    (an EOS id, or the token completing a stop string, included); text: their
    text (special tokens skipped, a stop string and what follows cut);
    finish_reason: "eos", "stop" (a stop string), "length" (max_tokens),
    "context" (the context is full), "cancelled" or "error"; stop_reason:
    the stop string that ended it (finish_reason "stop"), else None
    (vLLM's); error: what went wrong (finish_reason "error"); hash: the
    12-hex-digit chain hash (docs/chain-hash.md) after the last token,
    ``intdet generate``'s; hashes: {step: hash} at steps 1, 64, 128, 256,
    512; seed: the sampler's seed; logprobs: [TokenLogprob] per generated
    token (when asked); prompt_logprobs: [None, TokenLogprob, ...] per
    prompt position (when asked); truncated: prompt tokens cut;
    spec_drafted / spec_accepted: draft tokens proposed / kept by
    speculative decoding (``LLM(spec_tokens=K)``; 0 without);
    cached_tokens: prompt positions reused from the prefix cache;
    model_version: the sha256 of the weights it ran on (LLM.model_version).
    tool_calls: None, or (``LLM.chat`` with tools) the calls parsed from
    the reply in OpenAI's shape ([{"id", "type": "function", "function":
    {"name", "arguments": JSON text}}]); finish_reason is then "tool_calls"
    and text the content before them.
    receipt: the replayable record (receipts.py) when
    ``SamplingParams.receipt``, else None; step_hashes: the 12-digit chain
    hash after each token when ``SamplingParams.step_hashes``, else None.
    """

    prompt_ids: list
    tokens: list
    text: str
    finish_reason: str
    hash: str
    hashes: dict
    seed: int
    logprobs: Union[list, None] = None
    prompt_logprobs: Union[list, None] = None
    truncated: int = 0
    error: str = ""
    spec_drafted: int = 0
    spec_accepted: int = 0
    cached_tokens: int = 0
    model_version: str = ""
    tool_calls: Union[list, None] = None
    receipt: Union[dict, None] = None
    step_hashes: Union[list, None] = None
    stop_reason: Union[str, None] = None

    @property
    def cumulative_logprob(self) -> Union[float, None]:
        """Sum of the generated tokens' log-probabilities (exact in Q24, then a float)."""
        return None if self.logprobs is None else to_float(sum(t.logprob_q for t in self.logprobs))


@dataclass
class StreamChunk:
    """What ``LLM.stream`` yields: ``text`` newly safe to show, ``token`` the
    id generated (None for a chunk carrying only held-back text or the end),
    ``logprob`` (TokenLogprob or None); the last chunk has ``finish_reason``
    and the whole ``completion``."""

    text: str
    token: Union[int, None] = None
    logprob: Union[TokenLogprob, None] = None
    finish_reason: Union[str, None] = None
    completion: Union[Completion, None] = None


@dataclass
class Score:
    """Log-likelihood of ``continuation_ids`` after ``context_ids``.

    logprobs: [TokenLogprob] per continuation token (its Q24 log-probability
    and the ``top`` most likely tokens at that position); logprob_q: their
    exact sum (Q24 int) and logprob its float; is_greedy: every continuation
    token is a most likely token at its position (ties count); hash: the
    chain hash of the context with the continuation as if generated (equal
    to ``intdet generate --ids CONTEXT``'s when greedy decoding produces
    exactly the continuation); model_version: the sha256 of the weights it
    ran on (LLM.model_version)."""

    context_ids: list
    continuation_ids: list
    logprobs: list = field(default_factory=list)
    logprob_q: int = 0
    is_greedy: bool = True
    hash: str = ""
    model_version: str = ""

    @property
    def logprob(self) -> float:
        return to_float(self.logprob_q)


def receipt_of(req) -> Union[dict, None]:
    """The receipt of a finished request made by ``LLM.request`` with
    ``SamplingParams.receipt`` (receipts.py), else None."""
    hd = getattr(req, "receipt_head", None)
    return None if hd is None else receipts.finish(hd, req)


def _is_ids(x) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


class LLM:
    """A model on a device with a batching scheduler.

    Args:
        model: any source ``intdet generate -m`` accepts (converted dir, GGUF
            file, Hugging Face dir or repo id; None = the default
            SmolLM2-135M-Instruct), converted into the cache when needed; or
            a ``model.LoadedModel`` already loaded (as the CLI passes); or a
            ``model.Engine`` already set up, used as it is (its device, ISA
            and threads; ``device``, ``threads``, ``weights`` and ``revision``
            are then not read): hash-check and decompression, which drive
            their own engines through the same loop.
        device: a name of the backends table (backends/__init__.py): "cpu"
            (C++ core), "cuda" (GPU kernels, same bits), "ref" (numpy
            integer spec) or "webgpu" (WebGPU adapter, same bits);
            IntdetError (field "device") naming why one cannot run here.
        threads: CPU threads (None: leave the setting as it is; 0 = auto:
            the cores other processes leave free; N = exactly N).
        weights: "int8" or "int4" when the source needs converting.
        revision: Hub revision for a repo id.
        max_batch, step_tokens, kv_bytes: the scheduler's limits (scheduler.py).
        spec_tokens: speculative decoding, up to that many drafts per
            decode step (0: off; speculate.py), by prompt lookup unless
            ``draft_model`` is given. The tokens, logits and hashes are
            those of plain decoding.
        draft_model: None, or a smaller model with the same tokenizer (any
            source ``model`` accepts, or a LoadedModel) whose greedy tokens
            are the drafts (spec_tokens 0 then means 4), on ``device``.
        prefix_cache: keep finished requests' KV for prompts that start
            with the same tokens (prefix_cache.py; every device). On by
            default, as in vLLM and llama-server: a hit gives the same bits
            as a cold run, so only memory (within kv_bytes) and speed change.
        progress: a conversion progress bar on stderr; notice: None or a
            callable given a one-line message when the model is converted
            into the cache (or waits for another process converting it).
    Raises IntdetError for a model or option that cannot be used.
    """

    def __init__(self, model=None, device: str = "cpu", threads: Union[int, None] = None,
                 weights: Union[str, None] = None, revision: Union[str, None] = None,
                 max_batch: int = DEFAULT_MAX_BATCH, step_tokens: int = DEFAULT_STEP_TOKENS,
                 kv_bytes: int = DEFAULT_KV_BYTES, progress: bool = False, notice=None, spec_tokens: int = 0,
                 prefix_cache: bool = True, draft_model=None):
        from .model import Engine, LoadedModel, load_model
        from .resolve import resolve_model

        if isinstance(model, Engine):
            self.lm, self.engine = model.lm, model
        else:
            self.lm = model if isinstance(model, LoadedModel) else load_model(
                resolve_model(model, revision, progress=progress, weights=weights, notice=notice))
            self.engine = Engine(self.lm, device, threads)
        draft = None
        if draft_model is not None:
            draft = self._draft_model(draft_model, device, revision, weights, progress, notice)
            spec_tokens = spec_tokens or DEFAULT_DRAFT_TOKENS
        self.scheduler = Scheduler(self.engine, max_batch=max_batch, step_tokens=step_tokens, kv_bytes=kv_bytes,
                                   spec_tokens=spec_tokens, prefix_cache=prefix_cache, draft=draft)
        self.tokenizer, self.meta = self.lm.tokenizer, self.lm.tok_meta
        self.eos_ids = tuple(self.meta.get("eos_token_ids") or ())
        self._run_lock = threading.RLock()  # one thread steps at a time; re-entrant for generate inside stream
        self._grammars: collections.OrderedDict = collections.OrderedDict()  # structured outputs compiled, LRU
        self._grammars_lock = threading.Lock()
        self._compiling: dict = {}  # key -> threading.Event set when its compile ends

    def _draft_model(self, spec, device, revision, weights, progress, notice):
        """speculate.DraftModel of ``spec`` (IntdetError naming draft_model)."""
        from .model import Engine, LoadedModel, load_model
        from .resolve import resolve_model
        from .speculate import DraftModel, check_same_tokenizer

        try:
            lm = spec if isinstance(spec, LoadedModel) else load_model(
                resolve_model(spec, revision, progress=progress, weights=weights, notice=notice))
            check_same_tokenizer(self.lm.tokenizer, lm.tokenizer, "draft_model")
            return DraftModel(Engine(lm, device), self.engine.vocab_size)
        except IntdetError as e:
            msg = str(e)
            if e.field == "model" and msg.startswith("model"):  # the draft's own spec: "model: x: no such file"
                msg = "draft_model" + msg[len("model"):]
            elif not msg.startswith("draft_model"):
                msg = f"draft_model: {msg}"
            raise IntdetError(msg, field="draft_model") from None

    # ---------------------------------------------------------------- facts

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def model_sha256(self) -> str:
        return self.lm.model_sha256

    @property
    def model_version(self) -> str:
        """The policy version: the sha256 of the model file the weights in
        force would be (the chain hash's model id; ``update_weights``
        changes it). Every Completion and Score names the one it ran on."""
        return self.lm.model_sha256

    @property
    def system_fingerprint(self) -> str:
        """Names the model file and the format version, nothing of the
        machine: equal fingerprints give equal results."""
        key = (self.lm.cfg["format_version"], self.lm.model_sha256)
        if getattr(self, "_fingerprint", (None, None))[0] != key:  # every streamed chunk names it: computed once
            h = hashlib.sha256(f"intdet-v{key[0]}-{key[1]}".encode()).hexdigest()
            self._fingerprint = (key, f"intdet-v{key[0]}-{h[:16]}")
        return self._fingerprint[1]

    # ---------------------------------------------------------------- weights

    def update_weights(self, weights, timeout: Union[float, None] = None) -> str:
        """Swap in new float weights, quantized exactly as ``intdet convert``
        would quantize them: afterwards every logit equals that of a fresh
        conversion of the same weights (update.py), on every device.

        Args:
            weights: a mapping or an iterable of (name, tensor) pairs in
                Hugging Face names (torch tensors or numpy arrays, float32,
                float16 or bfloat16), or the path of a .safetensors file or
                a directory of them. A subset of the model's tensors may be
                given; the rest keep their values.
            timeout: seconds to wait for the running requests to finish
                (the swap happens between them; waiting ones start after it).
        Returns:
            The new model_version (64 hex digits).
        Raises:
            IntdetError (field "weights") naming the tensor: an unknown
            name, a wrong shape, a dtype that is not float, NaN/Inf, an
            RMSNorm whose fixed-point exponent changes without the layers
            reading it; (field "model") a model converted before config.json
            recorded "hparams". The old weights stay in force whole.

        The prefix cache is emptied (its KV was computed with the old
        weights). The model directory on disk is not changed.
        """
        from .background import Background
        from .convert import quantize_workers
        from .update import file_sha256, plan_update

        try:
            tensors, cfg, _ = plan_update(self.lm, weights, workers=quantize_workers())
        except IntdetError as e:  # a NaN met in a row block (convert's LazyTensor) names no field
            if e.field is None and str(e).startswith("weights"):
                e.field = "weights"
            raise
        sha = Background(file_sha256, tensors)  # beside the packing (both let the GIL go)
        cfg["model_sha256"] = None

        def swap():
            self.engine.replace_weights(cfg, tensors, sha)
            if self.scheduler.cache is not None:
                self.scheduler.cache.clear()
            return self.lm.model_sha256

        with self._run_lock:
            return self.scheduler.exclusive(swap, timeout)

    # ---------------------------------------------------------------- text

    def encode(self, text: str, add_bos: Union[bool, None] = None, what: str = "prompt") -> list:
        """Token ids of ``text`` (BOS as the model asks unless ``add_bos``);
        special-token strings in it stay plain text. IntdetError naming
        ``what`` for text that is not a string or not valid Unicode."""
        from .tokenizer import encode

        if not isinstance(text, str):
            raise IntdetError(f"{what}: expected a string, got {type(text).__name__}", field=what)
        return encode(self.tokenizer, self.meta, text, add_bos=add_bos, what=what)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        from .tokenizer.text import RELEASE_GIL_IDS

        self._check_ids(ids, "tokens")
        ids = [int(t) for t in ids]
        if len(ids) > RELEASE_GIL_IDS:  # decode_batch lets the GIL go while it runs
            return self.tokenizer.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token: int) -> str:
        """The text of one id (special tokens shown; '' for an id the tokenizer lacks)."""
        if self.tokenizer.id_to_token(int(token)) is None:
            return ""
        return self.tokenizer.decode([int(token)], skip_special_tokens=False)

    def chat_ids(self, messages: list, tools: Union[list, None] = None, add_generation_prompt: bool = True) -> list:
        """Token ids of ``messages`` (OpenAI's chat messages: roles system,
        developer, user, assistant (with ``tool_calls``) and tool) under the
        model's chat template with the generation prompt (``intdet generate
        --chat``'s); ``tools``: OpenAI's tool definitions, given to the
        template; ``add_generation_prompt``: False leaves the assistant's
        header out (/tokenize's option). IntdetError naming ``messages[i]...``
        for a bad message."""
        from .conversation import conversation_ids

        if not isinstance(messages, list) or not messages:
            raise IntdetError("messages: must be a non-empty list of {\"role\": str, \"content\": str}", field="messages")
        return conversation_ids(self.lm, messages, tools, add_generation_prompt)

    def tool_setup(self, tools, tool_choice=None, parallel_tool_calls=None):
        """The checked ``tool_calls.ToolSetup`` of a chat request (None
        without tools); IntdetError naming ``tools...`` or ``tool_choice``."""
        from .tool_calls import setup

        return setup(self.meta.get("chat_template"), tools, tool_choice, parallel_tool_calls)

    def tool_grammar(self, ts) -> Union[StructuredOutputsParams, None]:
        """The structured output a reply under ``ts`` (a ToolSetup or None)
        must match (tool_choice "required" or a named function), else None;
        ``tool_calls.tool_grammar`` over ``grammar`` (IntdetError naming
        ``tools[i].function.parameters`` or ``tools``)."""
        from .tool_calls import tool_grammar

        return tool_grammar(ts, self.tokenizer, self.grammar)[0]

    def with_tool_calls(self, c: Completion, ts, stop=()) -> Completion:
        """``c`` with its reply parsed under ``ts`` (tool_calls.parse_reply):
        text the content (special tokens shown), tool_calls and finish_reason
        "tool_calls" when it holds calls."""
        from .tool_calls import parse_reply

        if ts is None or not ts.parses:
            return c
        c.text, calls = parse_reply(ts, self.tokenizer, c.tokens, self.eos_ids, stop, c.hash)
        if calls:
            c.tool_calls, c.finish_reason = calls, "tool_calls"
        return c

    def _check_ids(self, ids, what: str) -> None:
        if not _is_ids(ids):
            raise IntdetError(f"{what}: expected a list of integer token ids", field=what)
        check_token_ids(ids, self.vocab_size, what)

    def prompt_ids(self, prompt: Prompt, what: str = "prompt") -> list:
        """A prompt (text or ids) as checked ids; errors name ``what``."""
        ids = self.encode(prompt, what=what) if isinstance(prompt, str) else prompt
        self._check_ids(ids, what)
        if not ids:
            raise IntdetError(f"{what}: empty", field=what)
        return [int(t) for t in ids]

    # ---------------------------------------------------------------- requests

    def request(self, prompt_ids: list, params: SamplingParams, on_event=None, score_from=None,
                on_prefill=None, ids_checked: bool = False) -> Request:
        """The scheduler ``Request`` for ``prompt_ids`` under ``params``
        (checked once, by ``Scheduler.check``: submitting it does not check
        again; truncated as ``params.truncate`` says); ``on_event`` and
        ``on_prefill`` as ``scheduler.Request`` takes them; ``ids_checked``:
        the caller has checked the ids (``prompt_ids``, errors.check_token_ids
        naming its own field), so they are not scanned again."""
        from .generate import truncate_prompt

        params.check()
        n_given = len(prompt_ids)
        if params.truncate is not None and len(prompt_ids) >= self.context_length:
            prompt_ids = truncate_prompt(prompt_ids, self.context_length, params.max_tokens, params.truncate,
                                         self.meta.get("bos_token_id"))
        so = params.structured_outputs  # check() made a dict a StructuredOutputsParams
        grammar: Union[Grammar, None] = self.grammar(so) if isinstance(so, StructuredOutputsParams) else so  # type: ignore[assignment]
        if isinstance(so, Grammar) and so.tokenizer is not grammar_tokenizer(self.tokenizer, self.eos_ids):
            raise IntdetError("structured_outputs: this Grammar was compiled for another model's tokenizer",
                              field="structured_outputs")
        sampler = params.sampler()
        req = Request(prompt_ids, params.max_tokens, sampler, eos_ids=self.eos_ids, stop=params.stop,
                      logprobs=params.logprobs, prompt_logprobs=params.prompt_logprobs, score_from=score_from,
                      on_event=on_event, tokenizer=self.tokenizer, on_prefill=on_prefill, grammar=grammar,
                      step_hashes=params.step_hashes)
        req.truncated = n_given - len(prompt_ids)
        # the receipt's model and parameters as the request starts (receipts.py)
        req.receipt_head = receipts.head(self.lm, sampler, grammar.params if grammar is not None else None) \
            if params.receipt else None
        self.scheduler.check(req, ids_checked)
        return req

    def grammar(self, so: StructuredOutputsParams) -> Grammar:
        """``so`` compiled for this model and checked (``structured.Grammar``:
        sizes, the library's compile, a first token allowed and taken):
        IntdetError with ``field`` "structured_outputs.<kind>" in one plain
        sentence otherwise. The last GRAMMAR_CACHE outcomes are kept, errors
        too, so a schema sent with every request is compiled once and a bad
        one is refused at once; a thread asking for one being compiled waits
        for that compile instead of starting another."""
        so.check()
        key = (so.kind(), json.dumps(getattr(so, so.kind()), sort_keys=True))
        while True:
            with self._grammars_lock:
                g = self._grammars.get(key)
                if g is not None:
                    self._grammars.move_to_end(key)
                    break
                running = self._compiling.get(key)
                if running is None:
                    running = self._compiling[key] = threading.Event()
                    break
            running.wait()  # then read its outcome (compiled again only if evicted meanwhile)
        if g is None:
            try:
                g = Grammar(so, self.tokenizer, self.eos_ids, self.vocab_size)
            except IntdetError as e:
                g = e
            finally:
                with self._grammars_lock:
                    if g is not None:
                        self._grammars[key] = g
                        while len(self._grammars) > GRAMMAR_CACHE:
                            self._grammars.popitem(last=False)
                    self._compiling.pop(key).set()
        if isinstance(g, IntdetError):  # a new exception each time: a raised one keeps its traceback
            raise IntdetError(str(g), field=g.field)
        return g

    @staticmethod
    def completion(req: Request) -> Completion:
        """The ``Completion`` of a finished request."""
        return Completion(prompt_ids=req.prompt_ids, tokens=list(req.tokens), text=req.text,
                          finish_reason=req.finish_reason, hash=req.hash, hashes=dict(req.hashes),
                          seed=req.sampler.seed,
                          logprobs=list(req.token_logprobs) if req.logprobs is not None else None,
                          prompt_logprobs=list(req.prompt_token_logprobs) if req.prompt_logprobs is not None else None,
                          truncated=req.truncated, error=req.error,
                          spec_drafted=req.spec_drafted, spec_accepted=req.spec_accepted,
                          cached_tokens=req.cached_tokens, model_version=req.model_version, receipt=receipt_of(req),
                          step_hashes=list(req.step_hashes) if req.step_hashes is not None else None,
                          stop_reason=req.stop_string)

    def run(self, reqs: list, until=None) -> None:
        """Submit ``reqs`` (scheduler Requests: ``request``'s, or ones it
        cannot build, with a chooser or step_hashes) and step the scheduler
        in this thread until each is done, or until ``until()`` is true
        (requests submitted before advance too). On any exception (Ctrl-C
        mid-step) ``reqs`` are cancelled and retired before it propagates.
        IntdetError from submit for a request that can never run."""
        with self._run_lock:
            for r in reqs:
                self.scheduler.submit(r)
            try:
                self.scheduler.run_until_idle(until=until or (lambda: all(r.done.is_set() for r in reqs)))
            except BaseException:  # Ctrl-C mid-step: retire these requests, leave the scheduler clean
                for r in reqs:
                    r.cancel()
                self.scheduler.run_until_idle(until=lambda: all(r.done.is_set() for r in reqs))
                raise

    # ---------------------------------------------------------------- generate

    def generate(self, prompts, params: Union[SamplingParams, Sequence[SamplingParams], None] = None):
        """Generate for one prompt (a str, or a list of int ids) -> Completion,
        or for a list of prompts -> [Completion] (run batched). ``params``:
        one SamplingParams for all, or one per prompt. Raises IntdetError for
        a bad prompt or parameter before anything runs."""
        if not isinstance(prompts, (str, list, tuple)):
            raise IntdetError(f"prompts: expected a string, a list of token ids or a list of those, "
                              f"got {type(prompts).__name__}", field="prompts")
        single = isinstance(prompts, str) or _is_ids(prompts) and len(prompts) > 0
        plist = [prompts] if single else list(prompts)
        if not plist:
            raise IntdetError("prompts: empty list", field="prompts")
        per = _check_params(params, len(plist))
        reqs = [self.request(self.prompt_ids(p), sp, ids_checked=True) for p, sp in zip(plist, per)]
        self.run(reqs)
        outs = [self.completion(r) for r in reqs]
        return outs[0] if single else outs

    def chat(self, messages, params: Union[SamplingParams, None] = None, tools: Union[list, None] = None,
             tool_choice=None, parallel_tool_calls: Union[bool, None] = None):
        """``generate`` on chat conversations: one conversation (OpenAI's
        messages, ``chat_ids``) -> Completion, or a list of them ->
        [Completion]. ``tools`` (OpenAI's function definitions),
        ``tool_choice`` ("none", "auto" (the default with tools),
        "required" or {"type": "function", "function": {"name": ...}}) and
        ``parallel_tool_calls`` as OpenAI's chat completions take them
        (tool_calls.py): the calls come back in ``Completion.tool_calls``;
        "required" and a named function generate under the format's grammar
        (not with ``structured_outputs``). Raises IntdetError naming the
        argument or field."""
        single = isinstance(messages, list) and messages and isinstance(messages[0], dict)
        convs = [messages] if single else list(messages)
        ts = self.tool_setup(tools, tool_choice, parallel_tool_calls)
        so = self.tool_grammar(ts)
        per = _check_params(params, len(convs)) if convs else []
        if so is not None:
            if any(p.structured_outputs is not None for p in per):
                raise IntdetError("tool_choice: \"required\" or a named function cannot be combined with "
                                  "structured_outputs", field="tool_choice")
            per = [dataclasses.replace(p, structured_outputs=so) for p in per]
        ids = [self.chat_ids(m, ts.tools if ts else None) for m in convs]
        outs = self.generate(ids, per) if ids else self.generate([], params)
        outs = [self.with_tool_calls(c, ts, p.stop) for c, p in zip(outs, per)]
        return outs[0] if single else outs

    def stream(self, prompt: Prompt, params: Union[SamplingParams, None] = None, on_prefill=None) -> "Stream":
        """A ``Stream`` of StreamChunks as tokens are generated (text with
        stop strings held back); the last chunk has finish_reason and the
        Completion. ``on_prefill(done, total)`` is called after each prefill
        chunk. Leaving the loop early (or ``Stream.close()``) cancels the
        generation; ``Stream.completion`` then holds what was made
        (finish_reason "cancelled"). Raises IntdetError for a bad prompt or
        parameter before anything runs."""
        (params,) = _check_params(params, 1)
        events: deque = deque()
        req = self.request(self.prompt_ids(prompt), params, on_event=events.append, on_prefill=on_prefill,
                           ids_checked=True)
        self.scheduler.submit(req)
        return Stream(self, req, events)

    # ---------------------------------------------------------------- score

    def score(self, context, continuation: Union[Prompt, None] = None, top: int = 0):
        """Log-likelihood of ``continuation`` after ``context`` (text or ids;
        a text continuation is encoded without BOS) -> Score, with the ``top``
        most likely tokens at each continuation position. A list of pairs,
        ``score([(ctx, cont), ...])``, is scored batched -> [Score]."""
        pairs = context if continuation is None else [(context, continuation)]
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_LOGPROBS:
            raise IntdetError(f"top: {top!r} must be an integer in [0, {MAX_LOGPROBS}]", field="top")
        if not isinstance(pairs, (list, tuple)) or not pairs:
            raise IntdetError("score: give (context, continuation) or a non-empty list of such pairs", field="score")
        reqs, shapes = [], []
        for pair in pairs:
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise IntdetError("score: each item must be a (context, continuation) pair", field="score")
            ctx, cont = pair
            c_ids = self.prompt_ids(ctx, "context")
            k_ids = self.encode(cont, add_bos=False) if isinstance(cont, str) else cont
            self._check_ids(k_ids, "continuation")
            if not k_ids:
                raise IntdetError("continuation: empty", field="continuation")
            # top-1 always, for is_greedy
            req = self.request(c_ids + [int(t) for t in k_ids],
                               SamplingParams(max_tokens=0, prompt_logprobs=max(int(top), 1)), score_from=len(c_ids),
                               ids_checked=True)
            reqs.append(req)
            shapes.append((c_ids, [int(t) for t in k_ids]))
        self.run(reqs)
        out = []
        for req, (c_ids, k_ids) in zip(reqs, shapes):
            lps = [t for t in req.prompt_token_logprobs[len(c_ids):] if t is not None]  # every position has one
            greedy = all(t.logprob_q == t.top[0][1] for t in lps)
            lps = [TokenLogprob(t.token, t.logprob_q, t.top[:top]) for t in lps]
            out.append(Score(c_ids, k_ids, lps, sum(t.logprob_q for t in lps), greedy, req.hash, req.model_version))
        return out if continuation is None else out[0]


class Stream:
    """Iterator over one request's StreamChunks (``LLM.stream``).

    Iterating steps the LLM's scheduler (other requests in it advance too);
    ``completion`` is None until the request ends, then its Completion.
    ``close()`` cancels an unfinished request and waits until the scheduler
    has retired it (``completion.finish_reason == "cancelled"``, with the
    tokens, text and chain hash of what was made); it is also what ``with``
    and dropping the Stream (leaving a for loop early) do."""

    def __init__(self, llm: LLM, req: Request, events: deque):
        self._llm, self.request, self._events = llm, req, events
        self.completion: Union[Completion, None] = None

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> StreamChunk:
        with self._llm._run_lock:
            while True:
                while self._events:
                    ev = self._events.popleft()
                    if ev.kind == "token":
                        if ev.token is not None or ev.text:
                            return StreamChunk(ev.text, ev.token, ev.logprob)
                    elif self.completion is None:  # "done" or "error": the last chunk
                        self.completion = self._llm.completion(self.request)
                        return StreamChunk("", None, None, self.completion.finish_reason, self.completion)
                if self.completion is not None:
                    raise StopIteration
                self._llm.scheduler.step()

    def close(self) -> Completion:
        """Cancel the request if it has not ended; returns its Completion."""
        with self._llm._run_lock:
            if not self.request.done.is_set():
                self.request.cancel()
                self._llm.scheduler.run_until_idle(until=self.request.done.is_set)
            self._events.clear()
            if self.completion is None:
                self.completion = self._llm.completion(self.request)
        return self.completion

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        # Leaving a for loop early drops the Stream: retire the request now
        # (freeing its slot and KV cache) unless another thread is stepping,
        # in which case its next step retires it.
        req = getattr(self, "request", None)
        if req is None or req.done.is_set():
            return
        req.cancel()
        lock = self._llm._run_lock
        if lock.acquire(blocking=False):
            try:
                self._llm.scheduler.run_until_idle(until=req.done.is_set)
            except Exception:  # noqa: BLE001  (nothing may escape a finalizer)
                pass
            finally:
                lock.release()


def load(model: Union[str, None] = None, device: str = "cpu", threads: Union[int, None] = None, **kw) -> LLM:
    """``LLM(model, device, threads, ...)``: mlx-lm's habit."""
    return LLM(model, device=device, threads=threads, **kw)
