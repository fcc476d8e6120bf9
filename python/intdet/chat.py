"""``intdet chat``: an interactive multi-turn chat.

Each turn the whole conversation is rendered by the model's chat template
(``tokenizer.encode_messages``: control-token strings typed in a message
stay text) and generated from an empty KV cache through ``LLM.run`` (the
one generation loop, scheduler.py), so a reply is the one ``generate --chat``
would give for that conversation, with the same chain hash. Lines are read from stdin: with readline editing and a
prompt on a terminal, one message per line otherwise. ``/reset`` forgets the
conversation (the system prompt stays), ``/help`` lists the commands, Ctrl-D
(end of input) or ``/exit`` leaves, Ctrl-C stops the current reply only (the
part already shown stays in the conversation).
"""

from __future__ import annotations

import json
import sys

from .conversation import conversation_ids
from .generate import PREFILL_CHUNK, Generation
from .scheduler import Request
from .tool_calls import CallParser

HELP = """commands:
  /reset   forget the conversation (the system prompt stays)
  /tool TEXT  the result of the reply's next unanswered tool call (with --tools)
  /help    this list
  /exit    leave (or Ctrl-D); Ctrl-C stops the current reply only"""


def _tool_setup(lm, eos, vocab_size: int, tools, tool_choice) -> tuple:
    """(ToolSetup or None, the compiled grammar a forced reply follows or None)."""
    from .structured import Grammar
    from .tool_calls import setup, tool_grammar

    ts = setup(lm.tok_meta.get("chat_template"), tools, tool_choice)
    return ts, tool_grammar(ts, lm.tokenizer, lambda so: Grammar(so, lm.tokenizer, eos, vocab_size))[1]


def _lines(inp, tty: bool, prompt: str, err):
    """User lines; None for Ctrl-C at the prompt (the line is dropped)."""
    while True:
        if tty:
            try:
                try:
                    import readline  # noqa: F401  (line editing and history for input())
                except ImportError:
                    pass
                line = input(prompt)
            except EOFError:
                err.write("\n")
                return
            except KeyboardInterrupt:
                err.write("\n")
                yield None
                continue
            except UnicodeDecodeError as e:  # a terminal whose bytes are not UTF-8
                err.write(f"intdet: that line is not valid UTF-8 (byte {e.start}); it was not sent\n")
                continue
        else:
            # bytes, decoded here: a line that is not UTF-8 then reaches run_chat
            # as surrogates (refused there, the chat goes on), not as a
            # UnicodeDecodeError out of the text layer
            raw = inp.buffer.readline() if hasattr(inp, "buffer") else inp.readline()
            if not raw:
                return
            line = (raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw).rstrip("\r\n")
        yield line


def run_chat(engine, lm, sampler, max_new_tokens: int, system: str | None = None, stop=(), inp=None, out=None,
             err=None, tty: bool | None = None, quiet: bool = False, stats_line=None, tools=None,
             tool_choice=None) -> int:
    """The chat loop; returns the number of replies. ``stats_line(g)``
    formats a reply's stats (token counts, speed, hash) for stderr.
    ``tools`` (OpenAI's function definitions) and ``tool_choice`` as the
    server takes them (tool_calls.py): each call of a reply is printed on
    its own line as OpenAI's tool_calls item (JSON), and ``/tool TEXT``
    answers the next unanswered one (the reply follows the last answer)."""
    from .api import LLM

    inp = inp or sys.stdin
    out = out or sys.stdout
    err = err or sys.stderr
    tty = inp.isatty() if tty is None else tty
    base = [{"role": "system", "content": system}] if system is not None else []
    messages = list(base)
    eos = lm.tok_meta.get("eos_token_ids") or []
    ts, grammar = _tool_setup(lm, eos, engine.vocab_size, tools, tool_choice)
    tool_defs = ts.tools if ts is not None else None
    conversation_ids(lm, messages + [{"role": "user", "content": "x"}], tool_defs)  # a broken template fails now
    pending: list = []  # the last reply's calls not yet answered by /tool
    # one sequence, its whole KV cache its own (no budget); the prompt in PREFILL_CHUNK calls
    llm = LLM(engine, max_batch=1, step_tokens=PREFILL_CHUNK, kv_bytes=1 << 62, prefix_cache=False)
    replies = 0

    parser = None  # the reply's tool_calls.CallParser (with tools)

    def show(ev):  # the reply's text as it comes (a stop string and what follows never shown)
        text = (parser.push(ev.token) if parser is not None else ev.text) if ev.kind == "token" else ""
        if text:
            out.write(text)
            out.flush()

    if tty:
        err.write("intdet chat: type a message; /help for commands, Ctrl-D to leave\n")
    for line in _lines(inp, tty, "> ", err):
        if line is None or not line.strip():
            continue
        cmd = line.strip()
        if cmd in ("/exit", "/quit"):
            break
        if cmd == "/reset":
            messages = list(base)
            err.write("(conversation cleared)\n")
            continue
        tool_result = cmd.startswith("/tool ") or cmd == "/tool"
        if tool_result and not pending:
            err.write("no tool call to answer\n")
            continue
        if cmd == "/help":
            out.write(HELP + "\n")
            out.flush()
            continue
        if cmd.startswith("/") and " " not in cmd and not tool_result:
            err.write(f"unknown command {cmd}; /help lists them\n")
            continue
        try:  # stdin's undecodable bytes arrive as surrogates: one bad line is not the end of the chat
            line.encode("utf-8")
        except UnicodeEncodeError as e:
            at = len(line[:e.start].encode("utf-8", "surrogateescape"))
            err.write(f"intdet: that line is not valid UTF-8 (byte {at}); it was not sent\n")
            continue
        if tool_result:
            messages.append({"role": "tool", "tool_call_id": pending.pop(0)["id"], "content": line.strip()[6:]})
            if pending:
                continue
        else:
            pending = []
            messages.append({"role": "user", "content": line})
        ids = conversation_ids(lm, messages, tool_defs)
        if len(ids) >= engine.context_length:
            messages.pop()
            err.write(f"intdet: the conversation ({len(ids)} tokens) no longer fits the context length "
                      f"{engine.context_length}: /reset to start again\n")
            continue
        parser = CallParser(ts, lm.tokenizer, eos, stop) if ts is not None and ts.parses else None
        req = Request(ids, max_new_tokens, sampler, eos_ids=eos, stop=stop, tokenizer=lm.tokenizer, on_event=show,
                      grammar=grammar)
        try:
            llm.run([req])
        except KeyboardInterrupt:  # Ctrl-C stops this reply (run cancelled and retired it); what was shown stays
            pass
        reply: dict = {"role": "assistant", "content": req.text}
        if parser is not None:
            rest, pending = parser.finish(req.hash)
            out.write(rest)
            reply["content"] = parser.content
            if pending:
                reply["tool_calls"] = list(pending)
        out.write("\n")
        for c in pending:
            out.write(json.dumps(c, ensure_ascii=False) + "\n")
        out.flush()
        g = Generation(prompt_ids=ids, tokens=list(req.tokens), hash=req.hash, hashes=dict(req.hashes),
                       prefill_s=(req.t_first - req.t_start) if req.t_first else 0.0,
                       decode_s=(req.t_done - req.t_first) if req.t_first else 0.0,
                       stop="interrupted" if req.finish_reason == "cancelled" else req.finish_reason)
        messages.append(reply)
        replies += 1
        if not quiet and stats_line:
            err.write(stats_line(g) + "\n")
            err.flush()
    return replies
