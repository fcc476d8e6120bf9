"""Float reference of the same architectures (analysis only, never on the
integer path): numpy, float32 or float64, on the dequantized source weights.

It follows Hugging Face's Llama/Qwen2/Qwen3/Gemma3 modelling code: RMSNorm
in the compute dtype, split-half RoPE, GQA, SiLU- or tanh-GELU-gated MLP,
and what the block description adds (post-norms, sliding windows, a second
RoPE base; Gemma's embedding and attention scales from ``hp``). Used by tests and by
scripts/compare_float.py to measure what integer arithmetic costs.
"""

from __future__ import annotations

import numpy as np

from .models.rope_scaling import attention_factor, scaled_inv_freq


class FloatModel:
    """fm: ``convert.sources.FloatModel``. ``forward(tokens, start)`` ->
    float logits [T, vocab] in ``dtype``; keeps a float KV cache."""

    def __init__(self, fm, dtype=np.float32, max_len: int | None = None):
        self.hp = fm.hp
        self.dt = np.dtype(dtype)
        self.w = {k: np.asarray(v, dtype=self.dt) for k, v in fm.weights.items() if v is not None}
        hp = self.hp
        D = hp["head_dim"]
        n = max_len or hp["context_length"]
        self.tables = {}  # block "rope" name -> (cos, sin) [n, D/2]
        for name, theta in (("rope", hp["rope_theta"]), ("rope_local", hp.get("rope_local_theta"))):
            if theta is None:
                continue
            inv = 1.0 / (theta ** (np.arange(0, D, 2, dtype=np.float64) / D))
            if name == "rope":  # long-context scaling (models/rope_scaling.py); Gemma's local layers keep plain RoPE
                inv = scaled_inv_freq(inv, theta, D, hp.get("rope_scaling"))
            ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
            self.tables[name] = (np.cos(ang).astype(self.dt), np.sin(ang).astype(self.dt))
        self.max_len = n
        self.reset()

    def reset(self):
        hp = self.hp
        shape = (hp["num_layers"], self.max_len, hp["num_kv_heads"], hp["head_dim"])
        self.kc = np.zeros(shape, self.dt)
        self.vc = np.zeros(shape, self.dt)

    def _norm(self, x, g):
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.dt.type(self.hp["rms_eps"])) * g

    def _moe(self, p, moe, h):
        """transformers' Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock: softmax
        of the router logits, the top k (ties: lowest id), renormalised when
        norm_topk_prob, each chosen expert's SwiGLU FFN weighted."""
        w = self.w
        z = h @ w[p + "ffn_gate_inp"].T  # [T, E]
        pr = np.exp(z - z.max(-1, keepdims=True))
        pr = pr / pr.sum(-1, keepdims=True)
        k = moe["experts_per_token"]
        sel = np.argsort(-pr, axis=1, kind="stable")[:, :k]
        wt = np.take_along_axis(pr, sel, axis=1)
        if moe["norm_topk_prob"]:
            wt = wt / wt.sum(-1, keepdims=True)
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            for j in range(k):
                e = sel[t, j]
                g, u = w[p + "ffn_gate_exps"][e] @ h[t], w[p + "ffn_up_exps"][e] @ h[t]
                out[t] += wt[t, j] * (w[p + "ffn_down_exps"][e] @ ((g / (1 + np.exp(-g))) * u))
        return out

    def _rope(self, x, pos, table="rope"):
        h = x.shape[-1] // 2
        cos, sin = self.tables[table]
        c, s = cos[pos][:, None, :], sin[pos][:, None, :]
        x1, x2 = x[..., :h], x[..., h:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    def forward(self, tokens, start: int, trace: dict | None = None):
        """trace, if given, receives the same intermediate names as
        ref.model.RefModel.forward (float arrays)."""
        hp, w = self.hp, self.w
        rec = (lambda name, a: trace.__setitem__(name, np.asarray(a))) if trace is not None else (lambda *a: None)
        tokens = np.asarray(tokens)
        T = len(tokens)
        nh, nkv, D = hp["num_heads"], hp["num_kv_heads"], hp["head_dim"]
        pos = np.arange(start, start + T)
        x = w["tok_embd"][tokens] * self.dt.type(hp.get("embed_scale", 1.0))
        rec("tok_embd", x)
        scale = self.dt.type(hp.get("attn_scale", 1.0 / np.sqrt(D)) * attention_factor(hp.get("rope_scaling")) ** 2)
        for i in range(hp["num_layers"]):
            p, blk = f"blk.{i}.", hp["layers"][i]  # the block description (models/block.py)
            pre = "attn_norm" in blk["norms"]  # OLMo 2: no pre-norm
            h = self._norm(x, w[p + "attn_norm"]) if pre else x
            if pre:
                rec(p + "attn_norm", h)
            q, k, v = (h @ w[p + n].T + (w[p + n + ".bias"] if n in blk["bias"] else 0) for n in ("attn_q", "attn_k", "attn_v"))
            rec(p + "attn_q", q.reshape(T, nh, D))
            rec(p + "attn_k", k.reshape(T, nkv, D))
            rec(p + "attn_v", v.reshape(T, nkv, D))
            if blk["qk_norm"] and blk.get("qk_norm_span") == "projection":  # OLMo 2: over the whole projection
                q, k = self._norm(q, w[p + "attn_q_norm"]), self._norm(k, w[p + "attn_k_norm"])
            q, k, v = q.reshape(T, nh, D), k.reshape(T, nkv, D), v.reshape(T, nkv, D)
            if blk["qk_norm"] and blk.get("qk_norm_span") != "projection":
                q, k = self._norm(q, w[p + "attn_q_norm"]), self._norm(k, w[p + "attn_k_norm"])
            if blk["rope"] != "none":  # SmolLM3's NoPE layers
                q, k = self._rope(q, pos, blk["rope"]), self._rope(k, pos, blk["rope"])
            self.kc[i, pos], self.vc[i, pos] = k, v
            n = start + T
            K = np.repeat(self.kc[i, :n], nh // nkv, axis=1)  # [n, nh, D]
            V = np.repeat(self.vc[i, :n], nh // nkv, axis=1)
            # matmul, not einsum: numpy's einsum does not reach BLAS here and
            # took half of a Gemma 3 window's time
            sc = np.matmul(q.transpose(1, 0, 2), K.transpose(1, 2, 0)) * scale  # [nh, T, n]
            if blk.get("attn_softcap"):  # Gemma 2: c tanh(scores / c)
                c = self.dt.type(hp["attn_softcap"])
                sc = np.tanh(sc / c) * c
            mask = np.arange(n)[None, :] > pos[:, None]
            if blk["attention_window"]:  # sliding window: positions pos - W + 1 .. pos
                mask |= np.arange(n)[None, :] <= pos[:, None] - blk["attention_window"]
            sc = np.where(mask[None], -np.inf, sc)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc = sc / sc.sum(-1, keepdims=True)
            o = np.matmul(sc, V.transpose(1, 0, 2)).transpose(1, 0, 2).reshape(T, nh * D)
            rec(p + "attn_out", o)
            o = o @ w[p + "attn_output"].T
            if "attn_output" in blk["bias"]:
                o = o + w[p + "attn_output.bias"]
            rec(p + "attn_output", o)
            post = "post_attention_norm" in blk["norms"]  # Gemma: RMSNorm of each branch before its residual add
            x = x + (self._norm(o, w[p + "post_attention_norm"]) if post else o)
            h = self._norm(x, w[p + "ffn_norm"]) if pre else x
            if "moe" in blk:  # Qwen3-MoE / Mixtral: softmax router, top-k, (renormalised) weighted experts
                if pre:
                    rec(p + "ffn_norm", h)
                dn = self._moe(p, blk["moe"], h)
                rec(p + "ffn_down", dn)
                x = x + (self._norm(dn, w[p + "post_ffw_norm"]) if "post_ffw_norm" in blk["norms"] else dn)
                rec(p + "residual", x)
                continue
            g, u = h @ w[p + "ffn_gate"].T, h @ w[p + "ffn_up"].T
            if blk["activation"] == "gelu_tanh":
                c = self.dt.type(np.sqrt(2.0 / np.pi))
                a = self.dt.type(0.5) * g * (1 + np.tanh(c * (g + self.dt.type(0.044715) * g * g * g))) * u
            else:
                a = (g / (1 + np.exp(-g))) * u
            if pre:
                rec(p + "ffn_norm", h)
            rec(p + "ffn_gate", g)
            rec(p + "ffn_up", u)
            rec(p + "ffn_swiglu", a)
            dn = a @ w[p + "ffn_down"].T
            rec(p + "ffn_down", dn)
            x = x + (self._norm(dn, w[p + "post_ffw_norm"]) if "post_ffw_norm" in blk["norms"] else dn)
            rec(p + "residual", x)
        h = self._norm(x, w["output_norm"])
        out = w["output"] if "output" in w else w["tok_embd"]
        logits = h @ out.T
        if hp.get("final_softcap"):  # Gemma 2: c tanh(logits / c)
            c = self.dt.type(hp["final_softcap"])
            logits = np.tanh(logits / c) * c
        rec("output", logits)
        return logits


def torch_supported(hp) -> bool:
    """Whether torch_model implements every block (Llama-style ones only)."""
    return all(b["norms"] == ["attn_norm", "ffn_norm"] and b["activation"] == "silu" and not b["attention_window"]
               and b["rope"] == "rope" and b.get("qk_norm_span", "head") == "head" and "moe" not in b
               and not b.get("attn_softcap") for b in hp["layers"]) and "embed_scale" not in hp and "attn_scale" not in hp \
        and not hp.get("rope_scaling")


def torch_model(fm):
    """The same float reference in torch float32 (CPU), to show that another
    float library and thread count change the bits. Returns an object with
    ``start(prompt) -> (last logits as numpy, step_fn(token, pos) -> logits)``."""
    import torch

    hp = fm.hp
    if not torch_supported(hp):
        raise ValueError("torch_model implements Llama-style blocks only (use FloatModel)")
    W = {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in fm.weights.items() if v is not None}
    nh, nkv, D = hp["num_heads"], hp["num_kv_heads"], hp["head_dim"]
    inv = 1.0 / (hp["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    eps = hp["rms_eps"]

    def norm(x, g):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * g

    def rope(x, pos):
        ang = pos[:, None].double() * inv[None, :]
        c, s = ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    class M:
        def start(self, prompt):
            self.kc = [None] * hp["num_layers"]
            self.vc = [None] * hp["num_layers"]
            return self.fwd(prompt, 0), lambda tok, pos: self.fwd([tok], pos)

        @torch.no_grad()
        def fwd(self, toks, start):
            T = len(toks)
            pos = torch.arange(start, start + T)
            x = W["tok_embd"][torch.tensor(toks)]
            for i in range(hp["num_layers"]):
                p, blk = f"blk.{i}.", hp["layers"][i]
                h = norm(x, W[p + "attn_norm"])
                q, k, v = (h @ W[p + n].T + (W[p + n + ".bias"] if n in blk["bias"] else 0)
                           for n in ("attn_q", "attn_k", "attn_v"))
                q, k, v = q.view(T, nh, D), k.view(T, nkv, D), v.view(T, nkv, D)
                if blk["qk_norm"]:
                    q, k = norm(q, W[p + "attn_q_norm"]), norm(k, W[p + "attn_k_norm"])
                q, k = rope(q, pos), rope(k, pos)
                self.kc[i] = k if self.kc[i] is None else torch.cat([self.kc[i], k])
                self.vc[i] = v if self.vc[i] is None else torch.cat([self.vc[i], v])
                K = self.kc[i].repeat_interleave(nh // nkv, 1)
                V = self.vc[i].repeat_interleave(nh // nkv, 1)
                sc = torch.einsum("thd,nhd->htn", q, K) / D**0.5
                mask = torch.arange(len(K))[None, :] > pos[:, None]
                sc = sc.masked_fill(mask[None], float("-inf")).softmax(-1)
                o = torch.einsum("htn,nhd->thd", sc, V).reshape(T, nh * D) @ W[p + "attn_output"].T
                if "attn_output" in blk["bias"]:
                    o = o + W[p + "attn_output.bias"]
                x = x + o
                h = norm(x, W[p + "ffn_norm"])
                x = x + (torch.nn.functional.silu(h @ W[p + "ffn_gate"].T) * (h @ W[p + "ffn_up"].T)) @ W[p + "ffn_down"].T
            h = norm(x[-1:], W["output_norm"])
            out = W["output"] if "output" in W else W["tok_embd"]
            return (h @ out.T)[0].numpy()

    return M()
