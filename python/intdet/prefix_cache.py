"""Exact prefix caching for the scheduler (issue 39).

When a request's prompt has been prefilled, its sequence is entered here
("live": later prompts can copy those positions while it runs, so of many
few-shot prompts admitted together only the first computes the shared
header); when it retires, its KV cache (the token ids of positions
[0, n_past)) is kept here instead of freed. A new request whose prompt starts
with the same tokens copies those positions' K/V rows into its own sequence
(``State.copy_prefix``) and prefills only the rest. The copied rows are
what a prefill of those tokens writes, bit for bit (a row's K/V does not
depend on how the prompt was cut into forward calls: the core's guarantee),
so every logit, token, log-probability and chain hash of a hit equals a cold
run's (tests/api/test_prefix_cache.py). This is vLLM's automatic prefix caching,
SGLang's radix cache and llama-server's cache_prompt; in those engines a hit
can change results (the cached KV came from another batch shape); here it
cannot.

Retired entries are kept least-recently-used first and share the
scheduler's KV budget (``kv_bytes``): admission evicts the oldest until a
new request fits (live ones are the running requests' own memory).
A hit reuses at most len(prompt) - 1 positions (the last prompt token's row
gives the first token's logits) and at least ``min_tokens``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


@dataclass
class Entry:
    ids: np.ndarray  # int64 token ids of the cached positions
    seq: object  # model.State holding their KV
    nbytes: int  # its KV cache's size (as the scheduler accounts it); 0 while live
    live: bool = False  # a running request's prompt: its memory is the request's, never evicted here


class PrefixCache:
    """Retired sequences by the token ids their KV holds, LRU order."""

    def __init__(self, min_tokens: int = 16):
        self.min_tokens = min_tokens
        self.entries: OrderedDict[int, Entry] = OrderedDict()
        self.bytes = 0
        self._next = 0
        self.lookups = self.hits = self.hit_tokens = 0
        self.query_tokens = 0  # prompt tokens looked up (vLLM's prefix_cache_queries; hit_tokens: its hits)

    def __len__(self) -> int:
        """Retired entries held (live ones are the running requests')."""
        return sum(not e.live for e in self.entries.values())

    def lookup(self, prompt) -> tuple:
        """(entry, m): the entry sharing the longest prefix with ``prompt``
        and m = the positions to reuse (< len(prompt)), or (None, 0) when no
        entry shares min_tokens. A hit becomes the most recently used."""
        self.lookups += 1
        self.query_tokens += len(prompt)
        p = np.asarray(prompt, dtype=np.int64)
        best, best_m = None, 0
        for key, e in self.entries.items():
            L = min(len(e.ids), len(p) - 1)
            if L <= best_m:
                continue
            diff = np.flatnonzero(e.ids[:L] != p[:L])
            m = int(diff[0]) if diff.size else L
            if m > best_m:
                best, best_m = key, m
        if best is None or best_m < self.min_tokens:
            return None, 0
        self.entries.move_to_end(best)
        self.hits += 1
        self.hit_tokens += best_m
        return self.entries[best], best_m

    def insert(self, ids, seq, nbytes: int) -> bool:
        """Keep ``seq`` (whose KV holds ``ids``) unless it holds fewer than
        min_tokens positions or an entry already covers it; an entry it
        covers is dropped. Returns whether it was kept."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) < self.min_tokens:
            return False
        for key, e in list(self.entries.items()):
            if e.live:
                continue
            n = min(len(e.ids), len(ids))
            if np.array_equal(e.ids[:n], ids[:n]):
                if len(e.ids) >= len(ids):
                    self.entries.move_to_end(key)
                    return False  # nothing new
                self._drop(key)  # the new one extends it
        self.entries[self._next] = Entry(ids, seq, nbytes)
        self._next += 1
        self.bytes += nbytes
        return True

    def insert_live(self, ids, seq) -> None:
        """A running request's prompt, prefilled: later prompts may copy it
        while it runs (the positions below len(ids) no longer change). Its
        memory stays the request's (drop_live when it retires)."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) >= self.min_tokens:
            self.entries[self._next] = Entry(ids, seq, 0, live=True)
            self._next += 1

    def drop_live(self, seq) -> None:
        """Forget the live entry of ``seq`` (its request retired)."""
        for key in [k for k, e in self.entries.items() if e.live and e.seq is seq]:
            self._drop(key)

    def evict_oldest(self) -> int:
        """Drop the least recently used retired entry; returns the bytes
        freed (0 if there is none)."""
        key = next((k for k, e in self.entries.items() if not e.live), None)
        if key is None:
            return 0
        n = self.entries[key].nbytes
        self._drop(key)
        return n

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

    def _drop(self, key) -> None:
        e = self.entries.pop(key)
        self.bytes -= e.nbytes
