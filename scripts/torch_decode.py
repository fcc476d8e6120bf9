#!/usr/bin/env python3
"""A gpt-fast-style fp16 torch decoder, the float baseline of the device check
(issue 50): the same Hugging Face checkpoint as intdet and llama.cpp, a static
KV cache, SDPA, fused QKV and gate/up matrices, and one decode step (forward,
argmax, position + 1) captured in a torch.cuda.CUDAGraph per batch size.

    python scripts/torch_decode.py HF_DIR ROWS.jsonl --model NAME
        [--batches 1,8,64,256] [--prompt 512] [--steps 64] [--prefill 2048] [--device cuda]

Rows (scripts/bench_results.py): engine "torch", decode tok/s at each batch
after a shared PROMPT-token prompt (prefilled once, its K/V copied to every
row, as llama-batched-bench -pps does), and prefill tok/s of PREFILL tokens
(batch 1, eager, best of 3). --device cpu runs the same code eagerly (no
graphs; float32; rows with backend "cpu") for rehearsals and tests.

Architectures: llama (with llama3 rope scaling) and qwen3 (q/k norms, tied
embeddings), the ones `intdet random-model` writes at full size."""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def load_config(hf_dir: str) -> dict:
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") not in ("llama", "qwen3"):
        raise SystemExit(f"torch_decode: {hf_dir}/config.json: model_type {cfg.get('model_type')!r} is not llama or qwen3")
    return cfg


def load_weights(hf_dir: str, dtype: torch.dtype, device: str) -> dict:
    """name -> tensor of every *.safetensors file in hf_dir, in dtype on device."""
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
    if not files:
        raise SystemExit(f"torch_decode: no .safetensors file in {hf_dir}")
    out = {}
    for f in files:
        for k, v in load_file(f, device=device).items():
            out[k] = v.to(dtype)
    return out


def inv_freq(cfg: dict) -> torch.Tensor:
    """RoPE inverse frequencies [head_dim / 2] (float64 math, float32 out),
    with Llama 3's rope scaling when the config names it."""
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    base = float(cfg.get("rope_theta", 10000.0))
    f = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / f
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = torch.where(wavelen > old / lo, f / factor, f)
        mid = (1 - smooth) * f / factor + smooth * f
        f = torch.where((wavelen >= old / hi) & (wavelen <= old / lo), mid, scaled)
    elif kind not in (None, "default"):
        raise SystemExit(f"torch_decode: rope_scaling {kind!r} is not supported")
    return f.float()


class Decoder:
    """The model as plain tensors. ``prefill(ids [1, T], cache, row=0)``:
    K/V of positions 0..T-1 into cache row ``row``, logits [1, V] of the last
    position; ``decode(ids [B, 1], pos [1] long, cache)``: one token per row at
    position pos (the same for every row), logits [B, V]. cache: ``new_cache``."""

    def __init__(self, cfg: dict, w: dict, max_pos: int):
        self.cfg = cfg
        self.qwen3 = cfg["model_type"] == "qwen3"
        self.H, self.KV = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        self.D = cfg.get("head_dim") or cfg["hidden_size"] // self.H
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.L = cfg["num_hidden_layers"]
        dev, dt = w["model.embed_tokens.weight"].device, w["model.embed_tokens.weight"].dtype
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = w["lm_head.weight"] if "lm_head.weight" in w else self.embed
        self.norm = w["model.norm.weight"]
        self.layers = []
        for i in range(self.L):
            p = f"model.layers.{i}."
            lay = dict(
                attn_norm=w[p + "input_layernorm.weight"], ffn_norm=w[p + "post_attention_layernorm.weight"],
                qkv=torch.cat([w[p + f"self_attn.{x}_proj.weight"] for x in "qkv"]),  # one matmul instead of three
                o=w[p + "self_attn.o_proj.weight"],
                gate_up=torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]),
                down=w[p + "mlp.down_proj.weight"])
            for x in "qkv":
                del w[p + f"self_attn.{x}_proj.weight"]
            del w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]
            if self.qwen3:
                lay["q_norm"], lay["k_norm"] = w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"]
            self.layers.append(lay)
        ang = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq(cfg))  # [P, D/2]
        ang = torch.cat([ang, ang], dim=-1)  # the halves layout of HF's rotate_half
        self.cos, self.sin = ang.cos().to(dev, dt), ang.sin().to(dev, dt)
        self.positions = torch.arange(max_pos, device=dev)

    def new_cache(self, batch: int, length: int) -> list:
        """Per layer (K, V), each [batch, kv_heads, length, head_dim]; length
        rounded up to 64 (the attention kernels' mask alignment)."""
        length = -(-length // 64) * 64
        z = dict(device=self.embed.device, dtype=self.embed.dtype)
        return [(torch.zeros(batch, self.KV, length, self.D, **z), torch.zeros(batch, self.KV, length, self.D, **z))
                for _ in range(self.L)]

    def _rms(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w

    def _rope(self, x, cos, sin):  # x [B, heads, T, D]; cos, sin [T, D] or [1, D]
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
        return x * cos + rot * sin

    def _qkv(self, lay, x, cos, sin):
        B, T, _ = x.shape
        qkv = self._rms(x, lay["attn_norm"]) @ lay["qkv"].T
        q, k, v = qkv.split([self.H * self.D, self.KV * self.D, self.KV * self.D], dim=-1)
        q = q.view(B, T, self.H, self.D)
        k = k.view(B, T, self.KV, self.D)
        if self.qwen3:
            q, k = self._rms(q, lay["q_norm"]), self._rms(k, lay["k_norm"])
        q = self._rope(q.transpose(1, 2), cos, sin)
        k = self._rope(k.transpose(1, 2), cos, sin)
        return q, k, v.view(B, T, self.KV, self.D).transpose(1, 2)

    def _ffn(self, lay, x):
        gu = self._rms(x, lay["ffn_norm"]) @ lay["gate_up"].T
        g, u = gu.chunk(2, dim=-1)
        return x + (F.silu(g) * u) @ lay["down"].T

    def prefill(self, ids: torch.Tensor, cache: list | None = None, row: int = 0) -> torch.Tensor:
        T = ids.shape[1]
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[:T], self.sin[:T]
        G = self.H // self.KV
        for i, lay in enumerate(self.layers):
            q, k, v = self._qkv(lay, x, cos, sin)
            if cache is not None:
                cache[i][0][row:row + 1, :, :T] = k
                cache[i][1][row:row + 1, :, :T] = v
            a = F.scaled_dot_product_attention(q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1), is_causal=True)
            x = x + a.transpose(1, 2).reshape(1, T, -1) @ lay["o"].T
            x = self._ffn(lay, x)
        return self._rms(x[:, -1:], self.norm)[:, 0] @ self.lm_head.T

    def decode(self, ids: torch.Tensor, pos: torch.Tensor, cache: list) -> torch.Tensor:
        B = ids.shape[0]
        x = F.embedding(ids, self.embed)  # [B, 1, hidden]
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        S = cache[0][0].shape[2]
        mask = (self.positions[:S] <= pos).view(1, 1, 1, S)  # the written positions, up to this one
        G = self.H // self.KV
        for i, lay in enumerate(self.layers):
            q, k, v = self._qkv(lay, x, cos, sin)
            kc, vc = cache[i]
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            # grouped-query attention as G query rows per K/V head: no repeated K/V
            a = F.scaled_dot_product_attention(q.view(B, self.KV, G, self.D), kc, vc, attn_mask=mask)
            x = x + a.reshape(B, 1, -1) @ lay["o"].T
            x = self._ffn(lay, x)
        return self._rms(x, self.norm)[:, 0] @ self.lm_head.T


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def bench_decode(m: Decoder, batch: int, prompt: int, steps: int, dev: str, gen: torch.Generator) -> float:
    """tok/s of `steps` decode steps of `batch` rows after a shared prompt."""
    warm = 3
    cache = m.new_cache(batch, prompt + warm + steps + 1)
    ids = torch.randint(0, m.embed.shape[0], (1, prompt), generator=gen).to(dev)
    m.prefill(ids, cache, 0)
    for kc, vc in cache:  # every row continues the same prompt
        kc[1:, :, :prompt] = kc[:1, :, :prompt]
        vc[1:, :, :prompt] = vc[:1, :, :prompt]
    tok = torch.randint(0, m.embed.shape[0], (batch, 1), generator=gen).to(dev)
    pos = torch.tensor([prompt], device=dev)

    def step():
        logits = m.decode(tok, pos, cache)
        tok.copy_(logits.argmax(-1, keepdim=True))
        pos.add_(1)

    if dev == "cuda":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(warm):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        pos.fill_(prompt + warm)
        g.replay()  # one more warm-up, through the graph
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            g.replay()
        end.record()
        end.synchronize()
        secs = start.elapsed_time(end) / 1e3
    else:
        for _ in range(warm):
            step()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        secs = time.perf_counter() - t
    return batch * steps / secs


def bench_prefill(m: Decoder, n: int, dev: str, gen: torch.Generator, repeats: int = 3) -> float:
    ids = torch.randint(0, m.embed.shape[0], (1, n), generator=gen).to(dev)
    best = 0.0
    for _ in range(repeats + 1):  # the first is a warm-up
        _sync(dev)
        t = time.perf_counter()
        m.prefill(ids)
        _sync(dev)
        best = max(best, n / (time.perf_counter() - t))
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_dir")
    ap.add_argument("rows", help="JSONL file the rows are appended to")
    ap.add_argument("--model", required=True, help="the rows' model name (qwen3-0.6b, llama3-8b)")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    a = ap.parse_args(argv)
    sys.path.insert(0, HERE)
    import bench_results

    batches = [int(b) for b in a.batches.split(",") if b]
    dev = a.device
    dtype = torch.float16 if dev == "cuda" else torch.float32
    cfg = load_config(a.hf_dir)
    t = time.perf_counter()
    max_pos = -(-max(a.prompt + a.steps + 8, a.prefill) // 64) * 64 + 64  # past every cache's rounded length
    m = Decoder(cfg, load_weights(a.hf_dir, dtype, dev), max_pos)
    print(f"torch_decode: {a.model} loaded in {time.perf_counter() - t:.1f} s ({dtype}, {dev})", flush=True)
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for b in batches:
            rate = bench_decode(m, b, a.prompt, a.steps, dev, gen)
            bench_results.append_row(a.rows, bench_results.make_row("torch", a.model, "decode", b, a.prompt, rate, dev))
            print(f"torch {a.model} decode batch {b} after {a.prompt}: {rate:.1f} tok/s", flush=True)
        if a.prefill:
            rate = bench_prefill(m, a.prefill, dev, gen)
            bench_results.append_row(a.rows, bench_results.make_row("torch", a.model, "prefill", 1, a.prefill, rate, dev))
            print(f"torch {a.model} prefill {a.prefill}: {rate:.1f} tok/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
