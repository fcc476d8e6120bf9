"""The decoder forward pass in the integer spec (``--device ref``).

Reads top to bottom like the C++ ``csrc/model/forward.cpp``; every buffer has
its shape and fixed-point format in a comment. Tensors are the ones
``intdet convert`` writes (see docs/format.md).
"""

from __future__ import annotations

import numpy as np

from . import ops
from .intmath import I64, quant16, round_shift, sat32, softcap


class RefModel:
    """Integer-only decoder over an int8 KV cache, each block as config.json
    "layers" describes it (biases are the ``.bias`` tensors present).

    cfg: the converted config.json dict. tensors: name -> numpy array, as
    python/intdet/model.py's load_model accepted them (the loader's table).
    ``forward(tokens, start)`` runs prefill or decode for tokens at absolute
    positions start..start+T-1 and returns int64 [T, vocab] logits (int32
    values, Q16).
    """

    def __init__(self, cfg: dict, tensors: dict):
        self.cfg = cfg
        self.t = {k: np.asarray(v) for k, v in tensors.items()}
        c = cfg
        self.n_layers = c["num_layers"]
        self.nh, self.nkv, self.D = c["num_heads"], c["num_kv_heads"], c["head_dim"]
        self.ctx = c["context_length"]
        self.eps_h = c["rms_eps_q60"]["hidden"]
        self.eps_d = c["rms_eps_q60"]["head"]
        self.eps_q = c["rms_eps_q60"].get("q_proj")  # projection-wide q/k RMSNorm (OLMo 2) only
        self.eps_k = c["rms_eps_q60"].get("k_proj")
        self._w4 = {}  # int4 layers' dequantized integer weights, made on first use
        self.reset()

    def reset(self):
        L, P, nkv, D = self.n_layers, self.ctx, self.nkv, self.D
        self.kc = np.zeros((L, P, nkv, D), dtype=I64)
        self.ka = np.zeros((L, P, nkv), dtype=I64)
        self.vc = np.zeros((L, P, nkv, D), dtype=I64)
        self.va = np.zeros((L, P, nkv), dtype=I64)
        self.n_past = 0

    def copy_prefix(self, src: "RefModel", n: int) -> None:
        """The KV of positions [0, n) from src (the same model): the spec of
        the core's State.copy_prefix (cache rows indexed by position)."""
        for name in ("kc", "ka", "vc", "va"):
            getattr(self, name)[:, :n] = getattr(src, name)[:, :n]
        self.n_past = n

    def _lin(self, name, q, e):
        t = self.t
        if name + ".q4" in t:  # int4 weights: the same linear on their integer values
            if name not in self._w4:
                self._w4[name] = ops.dequant_int4(t[name + ".q4"], t[name + ".gd"], t[name + ".gm"])
            w = self._w4[name]
        else:
            w = t[name + ".q"]
        return ops.linear(q, e, w, t[name + ".mant"], t[name + ".shift"], t.get(name + ".bias"))

    def _moe(self, p, moe, hq, he):
        """Mixture of experts on the FFN input (int16 hq, exponents he):
        router z (Q16 log2 units) [T, E]; per row the k largest (ties: lowest
        id), weights softmax_q16 over those k (norm_topk_prob) or the full
        softmax's entries; out = round_shift(sum_j w_j * down_j, 16), the
        experts' down in the residual's format. Returns (z, out)."""
        t = self.t
        z = ops.linear(hq, he, t[p + "ffn_gate_inp.q"], t[p + "ffn_gate_inp.mant"], t[p + "ffn_gate_inp.shift"])
        T, E = z.shape
        k = moe["experts_per_token"]
        # stable sort of -z: equal scores keep ascending expert ids
        sel = np.argsort(-z, axis=1, kind="stable")[:, :k]
        if moe["norm_topk_prob"]:
            w = ops.softmax_q16(np.take_along_axis(z, sel, axis=1))
        else:
            w = np.take_along_axis(ops.softmax_q16(z), sel, axis=1)
        acc = np.zeros((T, self.cfg["hidden_size"]), dtype=I64)
        for e in range(E):
            rows, slots = np.nonzero(sel == e)
            if len(rows) == 0:
                continue
            ex = lambda n: self._expert(p + n, e)  # noqa: E731
            g = ops.linear(hq[rows], he[rows], *ex("ffn_gate_exps"))
            u = ops.linear(hq[rows], he[rows], *ex("ffn_up_exps"))
            aq, ae = quant16(ops.swiglu(g, u))
            d = ops.linear(aq, ae, *ex("ffn_down_exps"))
            np.add.at(acc, rows, w[rows, slots][:, None] * d)
        return z, round_shift(acc, ops.PROB_FRAC)

    def _expert(self, name, e):
        """(w, mant, shift) of expert e of an [E, N, K] tensor (int4: its integer weights)."""
        t = self.t
        if name + ".q4" in t:
            key = (name, e)
            if key not in self._w4:
                self._w4[key] = ops.dequant_int4(t[name + ".q4"][e], t[name + ".gd"][e], t[name + ".gm"][e])
            w = self._w4[key]
        else:
            w = t[name + ".q"][e]
        return w, t[name + ".mant"][e], t[name + ".shift"][e]

    def _post_norm(self, name, y):
        """RMSNorm of a branch output y (int32 Q16, [T, H]) straight to the
        residual: gamma holds (1 + w) sqrt(H) 2^G, so the norm units are
        x/rms * (1 + w) * 2^(14 + G) and ``.shift`` = 14 + G - R brings them
        to the residual's Q R (saturating)."""
        t = self.t
        h = ops.rms_norm(y, t[name + ".g"], self.eps_h, 16)
        return ops.shift_round_sat32(h, int(t[name + ".shift"][0]))

    def _softcap(self, name):
        """(cap, inv_mant, inv_shift) of soft-capping tensor group ``name``."""
        return tuple(int(self.t[f"{name}.{k}"][0]) for k in ("cap", "inv_mant", "inv_shift"))

    def forward(self, tokens, start: int, trace: dict | None = None):
        """trace, if given, receives name -> (int array, factor) for every
        named intermediate (GGUF-style names, e.g. ``blk.3.ffn_down``); the
        real value is array * factor (used by scripts/op_errors.py)."""
        t = self.t
        rec = (lambda name, a, f: trace.__setitem__(name, (np.asarray(a), f))) if trace is not None else (lambda *a: None)
        G = self.cfg.get("norm_gamma_exponents", {})
        H = self.cfg["hidden_size"]
        Q16 = 2.0**-16
        tokens = np.asarray(tokens, dtype=I64)
        T = len(tokens)
        nh, nkv, D = self.nh, self.nkv, self.D
        pos = np.arange(start, start + T, dtype=I64)
        # Residual stream int32 in Q R: R = 16 unless config.json says otherwise (Gemma 3: 10).
        R = self.cfg.get("residual_frac_bits", 16)
        QR = 2.0**-R
        # Embedding: int8 row * per-row dyadic scale -> residual, int32 Q R.
        emb = t["tok_embd.q"][tokens].astype(I64)  # [T, H]
        x = ops.shift_round_sat32(emb * t["tok_embd.mant"][tokens, None].astype(I64), t["tok_embd.shift"][tokens, None])
        rec("tok_embd", x, QR)
        for i in range(self.n_layers):
            p = f"blk.{i}."
            blk = self.cfg["layers"][i]
            post = "post_attention_norm" in blk["norms"]  # Gemma, OLMo 2: each branch RMSNorm-ed before its residual add
            pre = "attn_norm" in blk["norms"]  # OLMo 2: no pre-norm, q/k/v and gate/up read the residual itself
            # --- attention block ---
            if pre:
                h = ops.rms_norm(x, t[p + "attn_norm.g"], self.eps_h, R)  # [T, H] norm units
                rec(p + "attn_norm", h, H**0.5 * 2.0 ** -(14 + G.get(p + "attn_norm", 0)))
                hq, he = quant16(h)  # [T, H] int16, [T] exponents
            else:
                hq, he = quant16(x)  # the residual, Q R
            q = self._lin(p + "attn_q", hq, he).reshape(T, nh, D)  # Q16
            k = self._lin(p + "attn_k", hq, he).reshape(T, nkv, D)  # Q16
            v = self._lin(p + "attn_v", hq, he).reshape(T, nkv, D)  # Q16
            rec(p + "attn_q", q, Q16)
            rec(p + "attn_k", k, Q16)
            rec(p + "attn_v", v, Q16)
            if blk["qk_norm"] and blk.get("qk_norm_span") == "projection":  # OLMo 2: over all heads at once
                q = ops.rms_norm(q.reshape(T, nh * D), t[p + "attn_q_norm.g"], self.eps_q, 16).reshape(T, nh, D)
                k = ops.rms_norm(k.reshape(T, nkv * D), t[p + "attn_k_norm.g"], self.eps_k, 16).reshape(T, nkv, D)
            elif blk["qk_norm"]:  # per-head RMSNorm (Qwen3), gamma at runtime
                q = ops.rms_norm(q, t[p + "attn_q_norm.g"], self.eps_d, 16)
                k = ops.rms_norm(k, t[p + "attn_k_norm.g"], self.eps_d, 16)
            if blk["rope"] != "none":  # "none": a NoPE layer (SmolLM3)
                cos, sin = t[blk["rope"] + ".cos"][pos], t[blk["rope"] + ".sin"][pos]  # [T, D/2] Q14
                q = ops.rope(q, cos, sin)  # [T, nh, D]
                k = ops.rope(k, cos, sin)  # [T, nkv, D]
            kq, ka = ops.quant8_row(k)  # int8 [T, nkv, D], absmax [T, nkv]
            vq, va = ops.quant8_row(v)
            self.kc[i, pos], self.ka[i, pos] = kq, ka
            self.vc[i, pos], self.va[i, pos] = vq, va
            qq, qe = quant16(q)  # [T, nh, D] int16, [T, nh]
            n = start + T
            o = ops.attention(
                qq, qe, self.kc[i, :n], self.ka[i, :n], self.vc[i, :n], self.va[i, :n], pos,
                int(t[p + "attn_score.mant"][0]), int(t[p + "attn_score.shift"][0]), blk["attention_window"],
                self._softcap(p + "attn_softcap") if blk.get("attn_softcap") else None,
            )  # [T, nh, D], V units / (127 * 2^16)
            rec(p + "attn_out", o.reshape(T, nh * D), 1.0 / (127 * 2.0**32))
            oq, oe = quant16(o.reshape(T, nh * D))
            ao = self._lin(p + "attn_output", oq, oe)
            rec(p + "attn_output", ao, Q16 if post else QR)
            x = sat32(x + (self._post_norm(p + "post_attention_norm", ao) if post else ao))  # residual Q R
            # --- feed-forward block ---
            if pre:
                h = ops.rms_norm(x, t[p + "ffn_norm.g"], self.eps_h, R)
                hq, he = quant16(h)
            else:
                hq, he = quant16(x)
            if "moe" in blk:  # mixture of experts instead of the dense FFN
                if pre:
                    rec(p + "ffn_norm", h, H**0.5 * 2.0 ** -(14 + G.get(p + "ffn_norm", 0)))
                z, dn = self._moe(p, blk["moe"], hq, he)
                rec(p + "ffn_gate_inp", z, Q16)
                rec(p + "ffn_down", dn, Q16 if post else QR)
                x = sat32(x + (self._post_norm(p + "post_ffw_norm", dn) if post else dn))
                rec(p + "residual", x, QR)
                continue
            gate = self._lin(p + "ffn_gate", hq, he)  # [T, F] Q16
            up = self._lin(p + "ffn_up", hq, he)  # [T, F] Q16
            act = ops.geglu if blk["activation"] == "gelu_tanh" else ops.swiglu
            a = act(gate, up)  # [T, F] Q32 int64
            if pre:
                rec(p + "ffn_norm", h, H**0.5 * 2.0 ** -(14 + G.get(p + "ffn_norm", 0)))
            rec(p + "ffn_gate", gate, Q16)
            rec(p + "ffn_up", up, Q16)
            rec(p + "ffn_swiglu", a, 2.0**-32)
            aq, ae = quant16(a)
            dn = self._lin(p + "ffn_down", aq, ae)
            rec(p + "ffn_down", dn, Q16 if post else QR)
            x = sat32(x + (self._post_norm(p + "post_ffw_norm", dn) if post else dn))
            rec(p + "residual", x, QR)
        h = ops.rms_norm(x, t["output_norm.g"], self.eps_h, R)
        hq, he = quant16(h)
        w = t["output.q"] if "output.q" in t else t["tok_embd.q"]
        logits = ops.linear(hq, he, w, t["output.mant"], t["output.shift"])  # [T, V] Q16
        if self.cfg.get("final_logit_softcap"):  # Gemma 2: c tanh(logits / c), still Q16
            logits = softcap(logits, *self._softcap("output_softcap"))
        rec("output", logits, Q16)
        self.n_past = start + T
        return logits
