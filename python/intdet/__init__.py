"""intdet: LLM inference with bit-identical integer-only logits on every machine.
The public API is intdet.api (imported lazily, so `import intdet` stays light)."""

_API = ("LLM", "load", "SamplingParams", "Completion", "StreamChunk", "Stream", "Score", "TokenLogprob", "derive_seed",
        "StructuredOutputsParams")
__all__ = [*_API, "IntdetError"]


def __getattr__(name):
    if name in _API:
        from . import api

        return getattr(api, name)
    if name == "IntdetError":  # what every bad argument raises, with .field naming it
        from .errors import IntdetError

        return IntdetError
    raise AttributeError(f"module 'intdet' has no attribute {name!r}")
