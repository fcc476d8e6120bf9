"""``POST /v1/completions``: prompts (text or token ids, one or many) to
completions, whole or streamed, with echo and logprobs."""

from __future__ import annotations

import asyncio
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..api import derive_seed
from ..errors import IntdetError, check_token_ids
from ..logprobs import to_float
from . import protocol as P
from .common import FINISH, BadRequest
from .logprobs import completion_logprobs, top_dict
from .sse import sse
from .token_io import add_to_choice, add_to_delta, params


def prompts_of(srv, prompt) -> list:
    if isinstance(prompt, str):
        plist = [prompt]
    elif prompt and all(isinstance(x, int) for x in prompt):
        plist = [prompt]
    else:
        plist = list(prompt)
    if not plist:
        raise BadRequest("prompt: empty list", "prompt")
    if len(plist) > srv.limits.max_prompts:
        raise BadRequest(f"prompt: more than {srv.limits.max_prompts} prompts", "prompt")
    out = []
    for i, p in enumerate(plist):
        where = "prompt" if len(plist) == 1 else f"prompt[{i}]"
        try:
            ids = srv.llm.encode(p, what=where) if isinstance(p, str) else list(p)  # not valid Unicode text
            if not ids:
                raise IntdetError(f"{where}: empty")
            check_token_ids(ids, srv.llm.vocab_size, where)
        except IntdetError as e:
            raise BadRequest(str(e), "prompt") from None
        out.append((ids, p if isinstance(p, str) else None))
    return out


async def create_completion(srv, request: Request):
    r = await srv.body(request, P.CompletionRequest)
    srv.check_model(r.model)
    prompts = await asyncio.to_thread(prompts_of, srv, r.prompt)  # ~0.3 s per MB of text: off the loop
    srv.check_shape(r, len(prompts))
    if r.stream and r.echo and r.logprobs is not None:
        raise BadRequest("echo: with logprobs, not supported when streaming", "echo")
    max_tokens = 16 if r.max_tokens is None else r.max_tokens
    seed = srv.new_seed(r.seed)
    grammar = await srv.structured(r)
    jobs, meta = [], []
    for p, (ids, text) in enumerate(prompts):
        srv.check_room(ids, max_tokens, "prompt" if len(prompts) == 1 else f"prompt[{p}]")
        for c in range(r.n):
            s = derive_seed(seed, c)
            jobs.append((ids, params(srv.sampling(r, max_tokens, s, r.logprobs,
                                                  r.logprobs if r.echo and r.logprobs is not None else None, grammar),
                                     r)))
            meta.append((p, text))
    loop = asyncio.get_running_loop()
    runs = srv.launch(loop, jobs, ids_checked=True)  # prompts_of checked them, naming prompt[i]
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    n_prompt = sum(len(ids) for ids, _ in prompts)
    if r.stream:
        include_usage = bool(r.stream_options and r.stream_options.include_usage)
        offsets = [0] * len(runs)  # text_offset of each choice's next chunk

        def chunk(i, ev, c):
            d = add_to_delta(completion_delta(srv, i, ev, c, r.logprobs, offsets[i]), ev, r, c)
            offsets[i] += len(ev.text)
            return {"id": cid, "object": "text_completion", "created": created, "model": srv.model_name,
                    "system_fingerprint": srv.llm.system_fingerprint, "choices": [d]}

        return sse(srv, request, runs, chunk, n_prompt, include_usage,
            lambda usage: {"id": cid, "object": "text_completion", "created": created, "model": srv.model_name,
                           "system_fingerprint": srv.llm.system_fingerprint, "choices": [], "usage": usage},
            echo_texts=[echo_text(srv, prompts[p][0], text) if r.echo else "" for p, text in meta],
            every_token=bool(r.return_token_ids))
    await srv.wait_all(request, runs)
    done = [srv.result(run) for run in runs]
    choices = []
    for i, c in enumerate(done):
        srv.raise_failed(c)
        prefix = echo_text(srv, c.prompt_ids, meta[i][1]) if r.echo else ""
        choices.append(add_to_choice({"index": i, "text": prefix + c.text,
                                      "logprobs": None if r.logprobs is None else
                                      completion_logprobs(srv.llm, c, r.echo, r.logprobs),
                                      "finish_reason": FINISH[c.finish_reason], "stop_reason": c.stop_reason,
                                      "hash": c.hash, "seed": c.seed, "model_version": c.model_version},
                                     c, r))
    return JSONResponse({"id": cid, "object": "text_completion", "created": created, "model": srv.model_name,
                         "system_fingerprint": srv.llm.system_fingerprint, "choices": choices,
                         "usage": srv.usage(done, n_prompt)})


def echo_text(srv, prompt_ids, text):
    """The echoed prompt: its text as sent, or its ids decoded."""
    return text if text is not None else srv.llm.decode(prompt_ids)


def completion_delta(srv, i, ev, c, k, offset: int):
    """Choice i's stream chunk of event ``ev`` (``c``: its Completion on the "done" event)."""
    d = {"index": i, "text": ev.text, "logprobs": None, "finish_reason": None}
    if ev.kind == "token" and k is not None and ev.logprob is not None:
        s = srv.llm.token_text(ev.token)
        d["logprobs"] = {"tokens": [s], "token_logprobs": [to_float(ev.logprob.logprob_q)],
                         "behaviour_logprobs": [ev.logprob.behaviour_logprob],
                         "top_logprobs": [top_dict(srv.llm, ev.logprob, k)], "text_offset": [offset]}
    if ev.kind == "done":
        d.update(finish_reason=FINISH[c.finish_reason], stop_reason=c.stop_reason, hash=c.hash, seed=c.seed,
                 model_version=c.model_version)
    return d
