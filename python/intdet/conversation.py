"""A chat conversation as the model's token ids: OpenAI's messages (tool
calls and results included) rendered by the model's chat template, the
form ``intdet chat``, ``generate --chat``, ``LLM.chat`` and the server run."""

from __future__ import annotations

from .errors import IntdetError


def conversation_ids(lm, messages: list[dict], tools: list | None = None,
                     add_generation_prompt: bool = True) -> list[int]:
    """Token ids of ``messages`` (OpenAI's chat messages: system, developer,
    user, assistant with or without ``tool_calls``, tool) under the model's
    chat template, with ``tools`` (OpenAI's definitions) when given, ending
    with the generation prompt unless ``add_generation_prompt`` is False;
    IntdetError for a bad message, a missing or
    failing template (tool_calls.template_messages)."""
    import jinja2

    from .tokenizer import encode_messages
    from .tool_calls import detect_format, renders_tool_calls, template_messages

    meta = lm.tok_meta
    template = meta.get("chat_template")
    fmt = detect_format(template)
    has_calls = any(isinstance(m, dict) and m.get("tool_calls") for m in messages)
    renders = (not has_calls or fmt is None
               or renders_tool_calls(template, meta.get("bos_token") or "", meta.get("eos_token") or ""))
    msgs, literals = template_messages(messages, fmt, renders, tools)
    try:
        return encode_messages(lm.tokenizer, meta, msgs, add_generation_prompt=add_generation_prompt, tools=tools,
                               literals=literals)
    except ValueError as e:
        raise IntdetError(str(e)) from None
    except jinja2.TemplateError as e:  # a broken template or its raise_exception()
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise IntdetError(f"{lm.path}: chat template failed ({msg})") from None
