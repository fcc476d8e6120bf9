"""Request bodies of the OpenAI-compatible endpoints, as vLLM shapes them,
checked with pydantic (strict types: "5" is not a number, true is not 1;
unknown fields are refused, as OpenAI does), and the OpenAI error shape.

Sampling numbers (temperature, top_p, min_p, repetition_penalty) arrive as
JSON numbers; intdet reads each by its shortest decimal repr (0.7 is 7/10)
and samples in exact integers (sampling.py). Fields OpenAI defines that
intdet does not implement are accepted only at their neutral value
(presence/frequency penalty 0, no logit_bias, best_of equal to n).
"""

from __future__ import annotations

from typing import Annotated, List, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError,
                      model_validator)

from ..logprobs import MAX_LOGPROBS

U64 = 2**64 - 1
# Fields with a non-null default that OpenAI's API also takes as null ("not
# given"), as its clients send them: null is read as the default.
NULL_IS_DEFAULT = frozenset({"n", "stream", "echo", "logprobs"})

Num = Union[StrictInt, StrictFloat]
Count = Annotated[StrictInt, Field(ge=0)]
TokenId = Annotated[StrictInt, Field(ge=0, le=2**31 - 1)]

UNION_HELP = {
    "prompt": "must be a string, a list of strings, a list of token ids or a list of token-id lists",
    "stop": "must be a string or a list of strings",
    "content": "must be a string or a list of {\"type\": \"text\", \"text\": str} parts",
    "tool_choice": "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": str}}",
}


# Fields accepted only at their neutral value (the module docstring), and that value.
NEUTRAL_ONLY = {"presence_penalty": "0", "frequency_penalty": "0", "logit_bias": "{}", "suffix": '""'}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class JsonSchemaFormat(Strict):
    """OpenAI's response_format.json_schema."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: Optional[StrictStr] = None
    description: Optional[StrictStr] = None
    schema_: Union[dict, StrictBool] = Field(alias="schema")
    strict: Optional[StrictBool] = None


class ResponseFormat(Strict):
    """OpenAI's response_format: text, any JSON object, or a JSON schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class StructuredOutputs(Strict):
    """vLLM's structured_outputs (set one; checked by structured.StructuredOutputsParams)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    json_: Optional[Union[dict, StrictBool, StrictStr]] = Field(default=None, alias="json")  # true/false: JSON Schema's
    json_object: Optional[StrictBool] = None
    regex: Optional[StrictStr] = None
    choice: Optional[List[StrictStr]] = None
    grammar: Optional[StrictStr] = None


class SamplingFields(Strict):
    """What completions and chat completions share."""

    model: Optional[StrictStr] = None
    temperature: Optional[Annotated[Num, Field(ge=0, le=100)]] = None  # None: 1, OpenAI's default
    top_p: Optional[Annotated[Num, Field(gt=0, le=1)]] = None
    top_k: Optional[Annotated[StrictInt, Field(ge=-1, le=2**31 - 1)]] = None  # -1 or 0: off (vLLM uses -1)
    min_p: Optional[Annotated[Num, Field(ge=0, le=1)]] = None
    repetition_penalty: Optional[Annotated[Num, Field(gt=0, le=100)]] = None
    seed: Optional[Annotated[StrictInt, Field(ge=0, le=U64)]] = None
    n: Annotated[StrictInt, Field(ge=1)] = 1
    best_of: Optional[Annotated[StrictInt, Field(ge=1)]] = None
    stop: Optional[Union[StrictStr, List[StrictStr]]] = None
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[Annotated[Num, Field(ge=0, le=0)]] = None
    frequency_penalty: Optional[Annotated[Num, Field(ge=0, le=0)]] = None
    logit_bias: Optional[Annotated[dict, Field(max_length=0)]] = None
    user: Optional[StrictStr] = None
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputs] = None
    return_token_ids: Optional[StrictBool] = None  # vLLM's: prompt and output token ids in the response (null: false)
    receipt: Optional[StrictBool] = None  # each choice's receipt (docs/receipts.md; null: false)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data):
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (v is None and k in NULL_IS_DEFAULT)}
        return data


class CompletionRequest(SamplingFields):
    # ids of any size: the server names an id outside the vocabulary (app.prompts_of)
    prompt: Union[StrictStr, List[StrictStr], List[StrictInt], List[List[StrictInt]]]
    max_tokens: Optional[Count] = 16
    echo: StrictBool = False
    logprobs: Optional[Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)]] = None
    suffix: Optional[Annotated[StrictStr, Field(max_length=0)]] = None


class TextPart(Strict):
    type: Literal["text"]
    text: StrictStr


class FunctionCall(Strict):
    name: StrictStr
    arguments: StrictStr  # JSON text, as OpenAI sends it


class ToolCall(Strict):
    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Strict):
    """A chat message. ``developer`` is rendered as ``system``; ``tool``
    carries a call's result (``tool_call_id``); an assistant message may
    carry ``tool_calls`` (content then may be null). ``refusal``,
    ``annotations``, ``audio`` and ``function_call``: what the SDK echoes
    back from a response message, accepted and not rendered."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[StrictStr, List[TextPart], None] = None
    name: Optional[StrictStr] = None
    tool_calls: Optional[List[ToolCall]] = None
    tool_call_id: Optional[StrictStr] = None
    refusal: Optional[StrictStr] = None
    annotations: Optional[list] = None
    audio: None = None
    function_call: None = None

    def text(self) -> str:
        c = self.content
        return "" if c is None else c if isinstance(c, str) else "".join(p.text for p in c)

    def openai(self) -> dict:
        """The message as tool_calls.template_messages reads it."""
        return self.model_dump(include={"role", "content", "name", "tool_calls", "tool_call_id"}, exclude_none=True)


class FunctionDef(Strict):
    name: StrictStr
    description: Optional[StrictStr] = None
    parameters: Optional[dict] = None
    strict: Optional[StrictBool] = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Strict):
    name: StrictStr


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(SamplingFields):
    messages: Annotated[List[Message], Field(min_length=1)]
    max_tokens: Optional[Count] = None  # None: up to the end of the context
    max_completion_tokens: Optional[Count] = None
    logprobs: StrictBool = False
    top_logprobs: Optional[Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)]] = None
    tools: Optional[List[Tool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: Optional[StrictBool] = None
    # OpenAI's fields that do not change the output, accepted and ignored (as vLLM does)
    store: Optional[StrictBool] = None
    metadata: Optional[dict] = None
    service_tier: Optional[StrictStr] = None
    prompt_cache_key: Optional[StrictStr] = None
    safety_identifier: Optional[StrictStr] = None


class TokenizeRequest(Strict):
    model: Optional[StrictStr] = None
    prompt: Optional[StrictStr] = None
    messages: Optional[Annotated[List[Message], Field(min_length=1)]] = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(Strict):
    model: Optional[StrictStr] = None
    tokens: List[TokenId]


def error_body(message: str, kind: str = "invalid_request_error", param: Optional[str] = None, code=None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def validation_message(e: ValidationError) -> tuple:
    """(one-line message naming the field, the field) of a pydantic error."""
    errs = e.errors()
    first = errs[0]
    loc = [str(x) for x in first["loc"]]
    field = loc[0] if loc else ""
    same = [x for x in errs if x["loc"] and str(x["loc"][0]) == field]
    if len(same) > 1 and {x["type"] for x in same} == {"int_type", "float_type"}:  # a Num field (int or float)
        return f"{field}: must be a number (got {first.get('input')!r})"[:120], field
    last_name = next((p for p in reversed(loc) if p in UNION_HELP), None)
    if len(same) > 1 and last_name:
        return f"{'.'.join(loc[:loc.index(last_name) + 1])}: {UNION_HELP[last_name]}", field
    if first["type"] == "extra_forbidden":
        return f"{'.'.join(loc)}: unknown field", field
    if field in NEUTRAL_ONLY and len(loc) == 1:  # OpenAI fields intdet takes only at their neutral value
        return f"{field}: not supported (only {NEUTRAL_ONLY[field]} or null)", field
    # drop pydantic's union-branch names ("int", "float", "list[int]", "dict[any,any]") from the path
    path = [p for p in loc if not (p in ("int", "float", "str") or p.startswith(("list[", "dict[", "function-")))]
    what = first["msg"]
    if first["type"] in ("less_than_equal", "greater_than_equal", "less_than", "greater_than"):
        what += f" (got {first.get('input')!r})"[:80]
    return f"{'.'.join(path) or 'body'}: {what}", field
