"""The chain hash of a generation (specified in docs/chain-hash.md).

h_0 = XXH3-128(b"intdet-chain" || u32 format_version || sha256(model.safetensors)
               || u32 n_prompt || u32 prompt ids...)
h_t = XXH3-128(h_{t-1} || int32 logits of step t, little-endian || u32 token_t)

Step t's logits are the ones the t-th generated token was chosen from (the
last prompt position for t = 1). All integers are little-endian. XXH3 (not
sha256) because a step hashes vocab x 4 bytes (600 KB for Qwen3) and must not
slow decode; it detects accidental divergence, not a forger. The displayed
hash is the first 12 hex digits of h_t.
"""

from __future__ import annotations

import numpy as np
import xxhash

REPORT_STEPS = (1, 64, 128, 256, 512)


def _u32(values) -> bytes:
    return np.asarray(values, dtype="<u4").tobytes()


class ChainHash:
    def __init__(self, format_version: int, model_sha256: str, prompt_ids):
        h = xxhash.xxh3_128()
        h.update(b"intdet-chain")
        h.update(_u32([format_version]))
        h.update(bytes.fromhex(model_sha256))
        h.update(_u32([len(prompt_ids)]))
        h.update(_u32(prompt_ids))
        self.state = h.digest()
        self.steps = 0
        self.at = {}  # step -> 12-hex hash at REPORT_STEPS

    def update(self, logits: np.ndarray, token: int):
        h = xxhash.xxh3_128()
        h.update(self.state)
        h.update(np.ascontiguousarray(logits, dtype="<i4"))  # the buffer itself: no bytes copy
        h.update(_u32([token]))
        self.state = h.digest()
        self.steps += 1
        if self.steps in REPORT_STEPS:
            self.at[self.steps] = self.hex()

    def hex(self, n: int = 12) -> str:
        return self.state.hex()[:n]
