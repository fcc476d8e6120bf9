"""``POST /v1/chat/completions``: messages rendered by the model's chat
template, to chat completions, whole or streamed, with logprobs and tool
calls (tool_calls.py: the model's own format, parsed back into OpenAI's
``tool_calls``; streamed as one delta per call once the call is complete)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..api import derive_seed
from ..errors import IntdetError
from ..tool_calls import CallParser, parse_reply
from . import protocol as P
from .common import FINISH, BadRequest
from .logprobs import chat_logprob
from .sse import sse
from .token_io import add_to_choice, add_to_delta, params


async def create_chat_completion(srv, request: Request):
    r = await srv.body(request, P.ChatRequest)
    srv.check_model(r.model)
    srv.check_shape(r, 1)
    ts, tool_so = await tools_off_the_loop(srv, r)
    ids = await asyncio.to_thread(srv.chat_ids, r.messages, ts.tools if ts is not None else None)  # template + encode
    mt = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
    if mt is None:
        if len(ids) >= srv.llm.context_length:
            srv.check_room(ids, 1, "messages")
        mt = srv.llm.context_length - len(ids)
    srv.check_room(ids, mt, "messages")
    if r.top_logprobs is not None and not r.logprobs:  # as OpenAI: top_logprobs needs logprobs
        raise BadRequest("top_logprobs: needs \"logprobs\": true", param="top_logprobs")
    k = (r.top_logprobs or 0) if r.logprobs else None
    seed = srv.new_seed(r.seed)
    grammar = await srv.structured(r)
    jobs = [(ids, params(with_grammar(srv.sampling(r, mt, derive_seed(seed, c), k, None, grammar), tool_so), r))
            for c in range(r.n)]
    runs = srv.launch(asyncio.get_running_loop(), jobs)
    stop = tuple(jobs[0][1].stop)  # the stop strings of every choice (the tool-call parser holds them back)
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if r.stream:
        include_usage = bool(r.stream_options and r.stream_options.include_usage)
        head = lambda choices: {"id": cid, "object": "chat.completion.chunk", "created": created,  # noqa: E731
                                "model": srv.model_name, "system_fingerprint": srv.llm.system_fingerprint,
                                "choices": choices}
        if ts is not None and ts.parses:
            parsers = [CallParser(ts, srv.llm.tokenizer, srv.llm.eos_ids, stop) for _ in runs]

            def chunk(i, ev, c):
                ds = tool_deltas(srv, i, ev, c, k, parsers[i])
                if r.return_token_ids and not ds and ev.kind == "token":
                    ds = [{"index": i, "delta": {}, "logprobs": None, "finish_reason": None}]  # the id, held text
                if ds:  # the event's token id, or at the end the receipt, on its last delta
                    ds[-1] = add_to_delta(ds[-1], ev, r, c)
                return [head([d]) for d in ds]
        else:
            chunk = lambda i, ev, c: head([add_to_delta(chat_delta(srv, i, ev, c, k), ev, r, c)])  # noqa: E731
        return sse(srv, request, runs, chunk, len(ids), include_usage, lambda usage: dict(head([]), usage=usage),
                   first=[head([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}]) for i in range(len(runs))],
                   every_token=(ts is not None and ts.parses) or bool(r.return_token_ids))
    await srv.wait_all(request, runs)
    done = [srv.result(run) for run in runs]
    choices = []
    for i, c in enumerate(done):
        srv.raise_failed(c)
        message, finish = {"role": "assistant", "content": c.text}, FINISH[c.finish_reason]
        if ts is not None and ts.parses:
            content, calls = parse_reply(ts, srv.llm.tokenizer, c.tokens, srv.llm.eos_ids, stop, c.hash)
            message["content"] = content if content or not calls else None
            if calls:
                message["tool_calls"], finish = calls, "tool_calls"
        choices.append(add_to_choice({"index": i, "message": message,
                                      "logprobs": None if k is None else
                                      {"content": [chat_logprob(srv.llm, lp, k) for lp in c.logprobs or ()]},
                                      "finish_reason": finish, "stop_reason": c.stop_reason,
                                      "hash": c.hash, "seed": c.seed, "model_version": c.model_version},
                                     c, r, prompt_ids=False))
    body = {"id": cid, "object": "chat.completion", "created": created, "model": srv.model_name,
            "system_fingerprint": srv.llm.system_fingerprint, "choices": choices,
            "usage": srv.usage(done, len(ids))}
    if r.return_token_ids:  # vLLM's chat response holds the prompt's ids once
        body["prompt_token_ids"] = list(ids)
    return JSONResponse(body)


def chat_delta(srv, i, ev, c, k):
    """Choice i's stream delta of event ``ev`` (``c``: its Completion on the "done" event)."""
    if ev.kind == "done":
        return {"index": i, "delta": {}, "logprobs": None, "finish_reason": FINISH[c.finish_reason],
                "stop_reason": c.stop_reason, "hash": c.hash, "seed": c.seed, "model_version": c.model_version}
    lp = None
    if k is not None and ev.logprob is not None:
        lp = {"content": [chat_logprob(srv.llm, ev.logprob, k)]}
    return {"index": i, "delta": {"content": ev.text}, "logprobs": lp, "finish_reason": None}


async def tools_off_the_loop(srv, r):
    """tool_request in a worker thread (each tool's schema is compiled),
    bounded in time as the other grammars are (Server.grammar)."""
    loop = asyncio.get_running_loop()
    try:
        return await asyncio.wait_for(loop.run_in_executor(None, tool_request, srv, r),
                                      2 * srv.limits.grammar_seconds)
    except asyncio.TimeoutError:
        raise BadRequest(f"tools: took more than {2 * srv.limits.grammar_seconds:g} s to compile; give simpler "
                         "parameter schemas", "tools") from None


def tool_request(srv, r):
    """(ToolSetup or None, the grammar's StructuredOutputsParams or None) of
    a chat request's tools, tool_choice and parallel_tool_calls; BadRequest
    naming the field."""
    tools = None if r.tools is None else [
        {"type": t.type, "function": {k: v for k, v in t.function.model_dump().items() if v is not None}}
        for t in r.tools]
    choice = r.tool_choice.model_dump() if isinstance(r.tool_choice, P.NamedToolChoice) else r.tool_choice
    try:
        ts = srv.llm.tool_setup(tools, choice, r.parallel_tool_calls)
        so = srv.llm.tool_grammar(ts)
    except IntdetError as e:
        raise BadRequest(str(e), e.field) from None
    if so is not None and ((r.response_format is not None and r.response_format.type != "text")
                           or r.structured_outputs is not None):
        raise BadRequest("tool_choice: \"required\" or a named function cannot be combined with response_format or "
                         "structured_outputs", "tool_choice")
    return ts, so


def with_grammar(sp, so):
    """sp generating under the tool grammar so (None: sp as it is)."""
    return sp if so is None else dataclasses.replace(sp, structured_outputs=so)


def tool_deltas(srv, i, ev, c, k, parser) -> list:
    """The stream's choice deltas of choice i's event when its reply is
    parsed for calls: content as the parser lets it through, then at the
    end the rest of the content, each call (a delta with index, id, type and
    name, then one with its arguments) and the finish chunk."""
    if ev.kind == "token":
        text = parser.push(ev.token)
        lp = {"content": [chat_logprob(srv.llm, ev.logprob, k)]} if k is not None and ev.logprob is not None else None
        return [{"index": i, "delta": {"content": text}, "logprobs": lp, "finish_reason": None}] if text or lp else []
    rest, calls = parser.finish(c.hash)
    out = [{"index": i, "delta": {"content": rest}, "logprobs": None, "finish_reason": None}] if rest else []
    for j, call in enumerate(calls):
        fn = call["function"]
        out.append({"index": i, "delta": {"tool_calls": [{"index": j, "id": call["id"], "type": "function",
                                                          "function": {"name": fn["name"], "arguments": ""}}]},
                    "logprobs": None, "finish_reason": None})
        out.append({"index": i, "delta": {"tool_calls": [{"index": j, "function": {"arguments": fn["arguments"]}}]},
                    "logprobs": None, "finish_reason": None})
    done = chat_delta(srv, i, ev, c, k)
    if calls:
        done["finish_reason"] = "tool_calls"
    return out + [done]
