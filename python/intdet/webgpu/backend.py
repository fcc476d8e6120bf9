"""The WebGPU engine, with intdet._core's API: ``Model``, ``State``,
``forward``, ``forward_batch``, ``device_name``, plus ``available``.

Weights and every sequence's int8 KV cache live on the GPU; a forward step
(one sequence, or a batch of them) is recorded into one command encoder
(kernels.Recorder) and only the int32 logits come back. The kernels are
the spec ops of python/intdet/ref/ops.py in WGSL, in the order of
ref/model.py's forward, so the logits are the CPU's bit for bit.
"""

from __future__ import annotations

import json

import numpy as np

from . import device as _device
from . import pack
from .kernels import BufferPool, Kernels, Recorder, groups_coop, groups_flat, groups_rows

CHUNK = 128  # prefill rows per pass: bounds the attention scratch (rows x heads x positions)


def available() -> tuple[bool, str]:
    """(True, adapter) when a WebGPU adapter opens here, else (False, why)."""
    return _device.available()


def device_name() -> str:
    """The adapter's name, its graphics API and kind (e.g. 'llvmpipe (...) (Vulkan, CPU)')."""
    adapter, _ = _device.gpu()
    return _device.adapter_name(adapter)


def _i32(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a).astype(np.int32))


def _lo_hi(v: int) -> list:
    """An int64 as the two int32 parameter words (lo, hi) of an I64P."""
    u = int(v) & ((1 << 64) - 1)
    return [int(np.uint32(u & 0xFFFFFFFF).view(np.int32)), int(np.uint32(u >> 32).view(np.int32))]


class Model:
    """A converted model's tensors on the GPU.

    cfg: config.json (dict or text); tensors: name -> numpy array (the
    loader's dtypes and shapes). Checked by intdet._core.check_model first:
    ValueError naming ``config_path`` / ``tensors_path`` and the field, as
    the CPU engine does; ValueError also for what this backend does not run
    (mixture-of-experts layers with a post-norm or more than 64 experts per
    token). ``mapped`` is accepted for the API's sake."""

    def __init__(self, cfg, tensors: dict, mapped: bool = False, config_path: str = "config.json",
                 tensors_path: str = "model.safetensors", dot4: bool | None = None, coop: bool | None = None):
        from .. import _core

        text = cfg if isinstance(cfg, str) else json.dumps(cfg)
        cfg = json.loads(text) if isinstance(cfg, str) else cfg
        _core.check_model(text, tensors, config_path, tensors_path, mapped=False)
        for i, blk in enumerate(cfg["layers"]):
            if "moe" in blk and ("post_ffw_norm" in blk["norms"] or blk["moe"]["experts_per_token"] > 64):
                raise ValueError(f"{config_path}: layers[{i}].moe: mixture-of-experts with a post-norm or more "
                                 "than 64 experts per token is not implemented on --device webgpu")
        self.cfg = cfg
        self.kernels = Kernels(dot4, coop)
        self.pool = BufferPool(self.kernels)
        c = cfg
        self.L, self.H, self.V = c["num_layers"], c["hidden_size"], c["vocab_size"]
        self.nh, self.nkv, self.D = c["num_heads"], c["num_kv_heads"], c["head_dim"]
        self.ctx = c["context_length"]
        self.R = c.get("residual_frac_bits", 16)
        eps = c["rms_eps_q60"]
        self.eps_h, self.eps_d = eps["hidden"], eps["head"]
        self.eps_q, self.eps_k = eps.get("q_proj"), eps.get("k_proj")
        self.dw = pack.words(self.D)
        t = tensors
        up = self.pool.storage
        # The vocabulary's matrices (embedding, lm_head: V x H bytes, 155 MB
        # for Qwen3) can pass one binding's limit (128 MiB on many adapters):
        # they are kept as buffers of whole rows, each within the limit.
        self.chunk_bytes = _chunk_limit(self.kernels.device)
        emb_q = t["tok_embd.q"]
        self.emb_chunks = [(r0, r1, up(pack.pack_i8_rows(emb_q[r0:r1]), f"tok_embd[{r0}:{r1}]"))
                           for r0, r1 in _row_chunks(self.V, 4 * pack.words(self.H), self.chunk_bytes)]
        self.emb_sc = up(_i32(np.stack([t["tok_embd.mant"], t["tok_embd.shift"]])), "tok_embd.scale")
        self.rope = {}
        for blk in cfg["layers"]:
            r = blk["rope"]
            if r != "none" and r not in self.rope:
                self.rope[r] = (up(_i32(t[r + ".cos"]), r + ".cos"), up(_i32(t[r + ".sin"]), r + ".sin"))
        self.g = {}
        for name, a in t.items():
            if name.endswith(".g"):
                self.g[name[:-2]] = up(_i32(a), name)
        self.lin = {}
        F = E = 0
        self.seg = {}  # "blk.i.attn_qkv" / "blk.i.ffn_gate_up": the int8 linears of one input as one matrix
        for i, blk in enumerate(cfg["layers"]):
            dense = ("ffn_gate", "ffn_up", "ffn_down") if "moe" not in blk else ("ffn_gate_inp",)
            for ln in ("attn_q", "attn_k", "attn_v", "attn_output") + dense:
                self.lin[f"blk.{i}.{ln}"] = None
            for key, parts in (("attn_qkv", ("attn_q", "attn_k", "attn_v")),
                               ("ffn_gate_up", ("ffn_gate", "ffn_up") if "moe" not in blk else ())):
                names = [f"blk.{i}.{ln}" for ln in parts]
                fits = names and 4 * sum(t[n + ".q"].shape[0] * pack.words(t[n + ".q"].shape[1]) for n in names
                                         if n + ".q" in t) <= self.chunk_bytes  # else each its own, by row buffers
                if names and fits and all(n + ".q" in t for n in names):
                    self.seg[f"blk.{i}.{key}"] = self._segments(t, names)
                    for n, N in zip(names, self.seg[f"blk.{i}.{key}"][1]):
                        self.lin[n] = ("seg", N)
            for name in [n for n, v in self.lin.items() if v is None]:
                self.lin[name] = self._linear(t, name)
            if "moe" in blk:
                for ln in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
                    self.lin[f"blk.{i}.{ln}"] = self._linear(t, f"blk.{i}.{ln}")
                F = max(F, blk["moe"]["expert_ffn_size"])
                E = max(E, blk["moe"]["experts"])
            else:
                F = max(F, self.lin[f"blk.{i}.ffn_gate"][1])
        self.F, self.E = F, E
        out_q = t["output.q"] if "output.q" in t else t["tok_embd.q"]
        chan = np.stack([np.asarray(out_q, np.int64).sum(1), t["output.mant"], t["output.shift"],
                         np.zeros(self.V, np.int64)])
        if "output.q" not in t:  # tied: the embedding's buffers
            ws = [(r0, r1, w) for r0, r1, w in self.emb_chunks]
        else:
            ws = [(r0, r1, up(pack.pack_i8_rows(out_q[r0:r1]), f"output[{r0}:{r1}]"))
                  for r0, r1 in _row_chunks(self.V, 4 * pack.words(self.H), self.chunk_bytes)]
        self.lin["output"] = ("8", self.V, self.H,
                              [(r0, r1, w, up(_i32(chan[:, r0:r1]), f"output.chan[{r0}:{r1}]")) for r0, r1, w in ws], 0)
        self.scalar = {name: int(np.asarray(a).ravel()[0]) for name, a in t.items()
                       if name.endswith(("attn_score.mant", "attn_score.shift", ".cap", ".inv_mant", ".inv_shift"))
                       or (name.endswith("norm.shift"))}
        self.kw_max = max(pack.words(self.H), pack.words(self.nh * self.D), pack.words(F))

    def _segments(self, t, names):
        """("seg", (N of each), K, weights, channel constants [4, sum N], has bias) of the int8
        linears ``names`` of one input as one matrix (linear8.wgsl ``segments``): their rows
        and channel constants one after another; a bias of zeros where one has none."""
        ws = [np.asarray(t[n + ".q"]) for n in names]
        chans = []
        for n, w in zip(names, ws):
            b = t.get(n + ".bias")
            chans.append(np.stack([w.astype(np.int64).sum(1), np.asarray(t[n + ".mant"], np.int64),
                                   np.asarray(t[n + ".shift"], np.int64),
                                   np.zeros(w.shape[0], np.int64) if b is None else np.asarray(b, np.int64)]))
        key = names[0].rsplit(".", 1)[0] + ".segments"
        up = self.pool.storage
        return ("seg", tuple(w.shape[0] for w in ws), ws[0].shape[1], up(pack.pack_i8_rows(np.concatenate(ws)), key),
                up(_i32(np.concatenate(chans, axis=1)), key + ".chan"), any(n + ".bias" in t for n in names))

    def _linear(self, t, name):
        """(kind, N, K, weights, channel constants, groups, has bias) of linear
        ``name`` on the device; MoE experts ([E, N, K] tensors) stacked,
        expert by expert, in each buffer."""
        up = self.pool.storage
        bias = t.get(name + ".bias")
        mant = np.asarray(t[name + ".mant"], np.int64).reshape(-1, t[name + ".mant"].shape[-1])  # [E or 1, N]
        shift = np.asarray(t[name + ".shift"], np.int64).reshape(mant.shape)
        N = mant.shape[1]
        b = np.zeros(mant.shape, np.int64) if bias is None else np.asarray(bias, np.int64).reshape(mant.shape)
        if name + ".q4" in t:
            codes = np.asarray(t[name + ".q4"]).reshape((-1, N) + t[name + ".q4"].shape[-1:])
            K = 2 * codes.shape[2]
            grp = np.stack([np.asarray(t[name + ".gd"], np.int32), np.asarray(t[name + ".gm"], np.int32)], axis=-1)
            chan = np.stack([mant, shift, b], axis=1)  # [E, 3, N]
            self._fits(name, codes.nbytes)
            return ("4", N, K, up(np.stack([pack.pack_int4(c) for c in codes]), name), up(_i32(chan), name + ".chan"),
                    up(np.ascontiguousarray(grp), name + ".groups"), bias is not None)
        w = np.asarray(t[name + ".q"]).reshape((-1, N) + t[name + ".q"].shape[-1:])
        K = w.shape[2]
        chan = np.stack([w.astype(np.int64).sum(2), mant, shift, b], axis=1)  # [E, 4, N]
        row = 4 * pack.words(K)
        if w.shape[0] == 1 and N * row > self.chunk_bytes:  # a dense matrix over the limit: buffers of whole rows
            return ("8", N, K, [(r0, r1, up(pack.pack_i8_rows(w[0, r0:r1]), f"{name}[{r0}:{r1}]"),
                                 up(_i32(chan[0][:, r0:r1]), f"{name}.chan[{r0}:{r1}]"))
                                for r0, r1 in _row_chunks(N, row, self.chunk_bytes)], bias is not None)
        self._fits(name, w.shape[0] * N * row)
        return ("8", N, K, [(0, N, up(pack.pack_i8_rows(w), name), up(_i32(chan), name + ".chan"))], bias is not None)

    def _fits(self, name: str, nbytes: int) -> None:
        """ValueError naming tensor ``name`` when its buffer (nbytes) is over
        the adapter's binding limit (stacked experts and int4 matrices are
        not cut into row buffers)."""
        if nbytes > self.chunk_bytes:
            raise ValueError(f"--device webgpu: tensor {name} needs {nbytes} bytes in one buffer, over this "
                             f"adapter's {self.chunk_bytes}-byte buffer binding limit")


class State:
    """One sequence's int8 KV cache on the GPU: per layer K and V rows of
    ``max_len`` positions ([2, max_len, nkv, D/4] words) and their absmax
    scales. ``n_past``: the positions it holds."""

    def __init__(self, model: Model, max_len: int):
        if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or not 1 <= max_len <= model.ctx:
            raise ValueError(f"max_len: {max_len!r} must be in [1, {model.ctx}] (the model's context_length)")
        self.model = model
        self.max_len = int(max_len)
        self.n_past = 0
        m = model
        self.kv = [m.pool.zeros(2 * self.max_len * m.nkv * m.dw * 4, f"kv{i}") for i in range(m.L)]
        self.sc = [m.pool.zeros(2 * self.max_len * m.nkv * 4, f"kv_scale{i}") for i in range(m.L)]

    def __del__(self):
        try:
            self.model.pool.forget(self.kv + self.sc)
        except Exception:  # interpreter shutdown
            pass

    def reset(self) -> None:
        self.n_past = 0

    def truncate(self, n: int) -> None:
        """Keep positions [0, n) (rows are indexed by position: later ones are rewritten)."""
        if not 0 <= n <= self.n_past:
            raise ValueError(f"truncate: {n} is outside [0, {self.n_past}]")
        self.n_past = int(n)

    def copy_prefix(self, src: "State", n: int) -> None:
        """The K/V rows and scales of positions [0, n) from ``src`` (a state of the same model)."""
        if src.model is not self.model:
            raise ValueError("copy_prefix: the source belongs to another model")
        if not 0 <= n <= min(src.n_past, self.max_len):
            raise ValueError(f"copy_prefix: {n} is outside [0, {min(src.n_past, self.max_len)}]")
        m = self.model
        rec = Recorder(m.kernels, m.pool)
        row = m.nkv * m.dw * 4
        srow = m.nkv * 4
        if n:
            for i in range(m.L):
                for half in (0, 1):
                    rec.copy(src.kv[i], half * src.max_len * row, self.kv[i], half * self.max_len * row, n * row)
                    rec.copy(src.sc[i], half * src.max_len * srow, self.sc[i], half * self.max_len * srow, n * srow)
            rec.run()
        self.n_past = int(n)


class _Step:
    """The per-step scratch buffers, sized for ``rows`` tokens of one pass
    and ``span`` cached positions."""

    def __init__(self, m: Model, rows: int, span: int):
        s = m.pool.scratch
        H, nhD, nkvD, F = m.H, m.nh * m.D, m.nkv * m.D, m.F
        self.x = s("x", rows * H * 4)
        self.h = s("h", rows * H * 4)
        self.y = s("y", rows * H * 4)
        self.act = s("act", rows * max(m.nh, 1) * 2 * max(m.kw_max, m.dw) * 4)
        self.ex = s("ex", rows * m.nh * 4)
        self.q = s("q", rows * nhD * 4)
        self.k = s("k", rows * nkvD * 4)
        self.v = s("v", rows * nkvD * 4)
        self.qn = s("qn", rows * nhD * 4)
        self.kn = s("kn", rows * nkvD * 4)
        self.o = s("o", rows * max(nhD, F) * 8)
        self.gate = s("gate", rows * F * 4)
        self.up = s("up", rows * F * 4)
        self.scr = s("scores", rows * m.nh * span * 4)
        self.nomask = s("nomask", 16)
        self.noout = s("noout", 16)  # the third output of a two-part segments dispatch
        if m.E:
            self.z = s("router", rows * m.E * 4)
            self.wexp = s("expert_weights", rows * m.E * 4)
            self.acc = s("moe_acc", rows * H * 8)
            self.act2 = s("act2", rows * 2 * pack.words(F) * 4)
            self.ex2 = s("ex2", rows * 4)
            self.dummy = s("moe_unused", 16)


def _check_out(out, rows: int, V: int):
    if out is None:
        return np.empty((rows, V), np.int32)
    if not isinstance(out, np.ndarray) or out.dtype != np.int32:
        raise ValueError("out: an int32 numpy array expected")
    if out.shape != (rows, V):
        raise ValueError(f"out: shape [{rows}, {V}] expected")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out: a writable C-contiguous array expected")
    return out


def _tokens(m: Model, state: State, tokens, start: int) -> np.ndarray:
    tok = np.ascontiguousarray(tokens, dtype=np.int32).ravel()
    if tok.size == 0:
        raise ValueError("tokens: at least one token expected")
    if tok.min() < 0 or tok.max() >= m.V:
        raise ValueError(f"tokens: ids must be in [0, {m.V}) (the vocabulary)")
    if not 0 <= start <= state.n_past or start + tok.size > state.max_len:
        raise ValueError(f"start {start} with {tok.size} tokens does not fit the state (n_past {state.n_past}, "
                         f"max_len {state.max_len})")
    return tok


def forward(model: Model, state: State, tokens, start: int, all_logits: bool = False, out=None) -> np.ndarray:
    """Prefill or decode ``tokens`` (int [T]) at positions start..start+T-1;
    returns int32 logits [T or 1, vocab] (Q16), into ``out`` when given."""
    return forward_batch(model, [state], [tokens], [bool(all_logits)], out, _starts=[start])[0]


class _Piece:
    """Tokens [tok0, tok0 + T) of the step's token array: one sequence's
    positions pos0.., rows row0.. of its pass; its last ``keep`` rows give
    logits rows out_row.."""

    def __init__(self, state, tok0, T, pos0, keep, out_row):
        self.state, self.tok0, self.T, self.pos0, self.keep, self.out_row = state, tok0, T, pos0, keep, out_row
        self.row0 = 0


def forward_batch(model: Model, states, tokens_list, all_logits=False, out=None, _starts=None) -> list:
    """Advance several sequences (each at its n_past) in one submission
    (several only when the logits outgrow a storage binding):
    one int32 logits array per sequence ([T_i or 1, vocab], views of one
    [sum of rows, vocab] array, ``out`` when given), each the one that
    sequence alone gives. The sequences' rows go through every row-wise
    kernel (norms, linears, GLU, lm_head) together, in passes of at most
    CHUNK rows (fewer where the attention scratch would outgrow a storage
    binding); RoPE, the KV store and attention run per sequence.
    ValueError for bad tokens, positions or ``out``."""
    m = model
    if len(states) != len(tokens_list):
        raise ValueError(f"forward_batch: {len(tokens_list)} token arrays for {len(states)} states")
    flags = [bool(all_logits)] * len(states) if isinstance(all_logits, (bool, np.bool_)) else [bool(f) for f in all_logits]
    if len(flags) != len(states):
        raise ValueError(f"forward_batch: {len(flags)} all_logits flags for {len(states)} states")
    if len({id(s) for s in states}) != len(states):
        raise ValueError("forward_batch: a state appears twice")
    starts = _starts if _starts is not None else [s.n_past for s in states]
    toks = [_tokens(m, s, t, st) for s, t, st in zip(states, tokens_list, starts)]
    nrows = [t.size if f else 1 for t, f in zip(toks, flags)]
    total = sum(nrows)
    out = _check_out(out, total, m.V)
    span = max(st + t.size for st, t in zip(starts, toks))
    limit = _binding_limit(m)
    # rows of a pass: its attention scratch (rows x heads x positions) and its logits fit a binding
    rows_cap = min(CHUNK, limit // (m.nh * span * 4), limit // (m.V * 4))
    if rows_cap < 1:
        raise ValueError(f"{span} positions need {m.nh * span * 4} bytes of attention scratch per token, over "
                         f"this device's {limit}-byte storage binding limit")
    # pieces of at most rows_cap tokens, packed in order into passes of at most rows_cap rows
    passes, cur, used, tok0, out_row = [], [], 0, 0, 0
    for s, t, st, f in zip(states, toks, starts, flags):
        for c in range(0, t.size, rows_cap):
            n = min(rows_cap, t.size - c)
            keep = n if f else (1 if c + n == t.size else 0)
            if used + n > rows_cap:
                passes.append(cur)
                cur, used = [], 0
            piece = _Piece(s, tok0 + c, n, st + c, keep, out_row)
            piece.row0 = used
            cur.append(piece)
            used += n
            out_row += keep
        tok0 += t.size
    passes.append(cur)
    tok_all = np.concatenate(toks)
    tok_buf = m.pool.scratch("tokens", tok_all.nbytes)
    m.kernels.device.queue.write_buffer(tok_buf, 0, tok_all)
    # one submission, unless the logits outgrow one binding: then one per group of passes that fits
    logit_cap = limit // (m.V * 4)
    step = _Step(m, max(sum(p.T for p in ps) for ps in passes), span)
    logits = m.pool.scratch("logits", min(total, logit_cap) * m.V * 4)
    rec = Recorder(m.kernels, m.pool)
    base = pending = 0
    for ps in passes:
        k = sum(p.keep for p in ps)
        if pending + k > logit_cap:
            _read_logits(m, rec, logits, out, base, pending)
            base, pending = base + pending, 0
        _record(m, rec, step, ps, tok_buf, logits, base)
        pending += k
    _read_logits(m, rec, logits, out, base, pending)
    for s, t, st in zip(states, toks, starts):
        s.n_past = st + t.size
    res, r = [], 0
    for k in nrows:
        res.append(out[r:r + k])
        r += k
    return res


def _binding_limit(m: Model) -> int:
    """Bytes one storage buffer binding may span on this device."""
    return int(m.kernels.device.limits["max-storage-buffer-binding-size"])


def _chunk_limit(device) -> int:
    """Bytes of one buffer of the vocabulary's matrices: what one binding and
    one buffer may span on ``device`` (tests lower it to force several)."""
    lim = device.limits
    return int(min(lim["max-storage-buffer-binding-size"], lim["max-buffer-size"]))


def _row_chunks(rows: int, row_bytes: int, limit: int) -> list:
    """[(r0, r1)]: rows 0..rows-1 cut into runs of whole rows of at most
    ``limit`` bytes each; ValueError when one row is larger."""
    per = limit // row_bytes
    if per < 1:
        raise ValueError(f"--device webgpu: a row of {row_bytes} bytes is over this adapter's "
                         f"{limit}-byte buffer binding limit")
    return [(r0, min(r0 + per, rows)) for r0 in range(0, rows, per)]


def _read_logits(m: Model, rec: Recorder, logits, out: np.ndarray, base: int, rows: int) -> None:
    """Submit what ``rec`` holds; logits rows 0..rows-1 are out's rows base.."""
    if rows == 0:
        rec.run()
        return
    raw = rec.run(read=(logits, rows * m.V * 4))
    out[base:base + rows] = np.frombuffer(raw, np.int32).reshape(rows, m.V)


def _record(m: Model, rec: Recorder, b: _Step, pieces: list, tok_buf, logits, base: int) -> None:
    """Record one pass: the forward of the pieces' rows (consecutive in
    tok_buf), their kept rows' logits into ``logits`` from row out_row - base."""
    H, nh, nkv, D, dw = m.H, m.nh, m.nkv, m.D, m.dw
    T = sum(p.T for p in pieces)
    G = groups_flat(H)
    for v0, v1, emb in m.emb_chunks:  # each row's token from the buffer that holds it
        rec.dispatch("embed", [tok_buf, emb, m.emb_sc, b.x], [H, pack.words(H), T, pieces[0].tok0, m.V, v0, v1],
                     (G[0], T, 1))
    for i in range(m.L):
        p = f"blk.{i}."
        blk = m.cfg["layers"][i]
        post = "post_attention_norm" in blk["norms"]
        pre = "attn_norm" in blk["norms"]
        if pre:
            _norm_quant16(m, rec, b, p + "attn_norm", T)
        else:
            _quant16(rec, "quant16_i32", b.x, b.act, b.ex, T, H)
        if p + "attn_qkv" in m.seg:
            _segments(m, rec, b, p + "attn_qkv", [b.q, b.k, b.v], T)
        else:
            _linear(m, rec, p + "attn_q", b.act, b.ex, b.q, T)
            _linear(m, rec, p + "attn_k", b.act, b.ex, b.k, T)
            _linear(m, rec, p + "attn_v", b.act, b.ex, b.v, T)
        q, k = b.q, b.k
        if blk["qk_norm"] and blk.get("qk_norm_span") == "projection":
            _norm(m, rec, b.q, p + "attn_q_norm", b.qn, T, nh * D, m.eps_q, 16)
            _norm(m, rec, b.k, p + "attn_k_norm", b.kn, T, nkv * D, m.eps_k, 16)
            q, k = b.qn, b.kn
        elif blk["qk_norm"]:
            _norm(m, rec, b.q, p + "attn_q_norm", b.qn, T * nh, D, m.eps_d, 16)
            _norm(m, rec, b.k, p + "attn_k_norm", b.kn, T * nkv, D, m.eps_d, 16)
            q, k = b.qn, b.kn
        for pc in pieces:
            st = pc.state
            if blk["rope"] != "none":  # q's heads and k's in one dispatch
                cos, sin = m.rope[blk["rope"]]
                rec.dispatch("rope", [q, cos, sin, k], [pc.T, nh, D, pc.pos0, pc.row0, nkv],
                             (groups_flat((nh + nkv) * D // 2)[0], pc.T, 1))
            rec.dispatch("kv_store", [k, st.kv[i], st.sc[i], b.v],  # K rows then V rows
                         [D, dw, nkv, st.max_len, pc.pos0, 0, pc.T * nkv, pc.row0 * nkv], groups_rows(2 * pc.T * nkv))
        _quant16(rec, "quant16_i32", q, b.act, b.ex, T * nh, D)
        capped = bool(blk.get("attn_softcap"))
        cap = [m.scalar[p + f"attn_softcap.{c}"] for c in ("cap", "inv_mant", "inv_shift")] if capped else [0, 0, 0]
        for pc in pieces:
            st = pc.state
            rec.dispatch("attention", [b.act, b.ex, st.kv[i], st.sc[i], b.scr, b.o],
                         [nh, nkv, D, dw, st.max_len, pc.pos0, blk["attention_window"],
                          m.scalar[p + "attn_score.mant"], m.scalar[p + "attn_score.shift"], int(capped), *cap,
                          pc.T * nh, pc.pos0 + pc.T, pc.row0 * nh], groups_rows(pc.T * nh))
        _quant16(rec, "quant16_i64", b.o, b.act, b.ex, T, nh * D)
        _residual(m, rec, b, p + "attn_output", p + "post_attention_norm" if post else None, T)
        if pre:
            _norm_quant16(m, rec, b, p + "ffn_norm", T)
        else:
            _quant16(rec, "quant16_i32", b.x, b.act, b.ex, T, H)
        if "moe" in blk:
            _moe(m, rec, b, p, blk["moe"], T)
            continue
        if p + "ffn_gate_up" in m.seg:
            _segments(m, rec, b, p + "ffn_gate_up", [b.gate, b.up, b.noout], T)
        else:
            _linear(m, rec, p + "ffn_gate", b.act, b.ex, b.gate, T)
            _linear(m, rec, p + "ffn_up", b.act, b.ex, b.up, T)
        F = m.lin[p + "ffn_gate"][1]
        rec.dispatch("glu", [b.gate, b.up, b.o], [T * F, int(blk["activation"] == "gelu_tanh")], groups_flat(T * F))
        _quant16(rec, "quant16_i64", b.o, b.act, b.ex, T, F)
        _residual(m, rec, b, p + "ffn_down", p + "post_ffw_norm" if post else None, T)
    kept = [pc for pc in pieces if pc.keep]
    if not kept:
        return
    nk = 0
    for pc in kept:  # the kept rows, gathered into rows 0.. of h (and of act)
        _norm_quant16(m, rec, b, "output_norm", pc.keep, in0=pc.row0 + pc.T - pc.keep, out0=nk)
        nk += pc.keep
    row = kept[0].out_row - base
    _linear(m, rec, "output", b.act, b.ex, logits, nk, out0=row)
    if m.cfg.get("final_logit_softcap"):
        cap = [m.scalar[f"output_softcap.{c}"] for c in ("cap", "inv_mant", "inv_shift")]
        rec.dispatch("softcap", [logits], [nk * m.V, *cap, row * m.V], groups_flat(nk * m.V))


def _norm(m, rec, src, name, dst, rows, n, eps, in_frac, mode=0, shift=0, in0=0, out0=0):
    rec.dispatch("rms_norm", [src, m.g[name], dst], [n, rows, in_frac, *_lo_hi(eps), mode, shift, in0, out0],
                 groups_rows(rows))


def _norm_quant16(m, rec, b, name, rows, in0=0, out0=0):
    """RMSNorm of the residual rows b.x[in0..] (gamma ``name``) into b.h[out0..] and their quant16
    into b.act / b.ex rows out0.., one dispatch (the pre-norms and output_norm)."""
    H = m.H
    rec.dispatch("rms_norm_quant16", [b.x, m.g[name], b.h, b.act, b.ex],
                 [H, rows, m.R, *_lo_hi(m.eps_h), 0, 0, in0, out0, pack.words(H)], groups_rows(rows))


def _quant16(rec, kind, src, act, ex, rows, n):
    rec.dispatch(kind, [src, act, ex], [n, rows, pack.words(n), 0, 0], groups_rows(rows))


def _linear(m, rec, name, act, ex, dst, rows, mode=0, out0=0, expert=-1, mask=None):
    """The linear ``name`` (expert ``expert`` of an MoE tensor, then only on
    the rows whose ``mask`` [rows, E] entry is nonzero)."""
    L = m.lin[name]
    kind, N, K = L[0], L[1], L[2]
    e = max(expert, 0)
    mask_buf = m.pool.scratch("nomask", 16) if mask is None else mask
    tail = [expert, m.E if mask is not None else 0]
    if kind == "8":
        _, _, _, chunks, has_bias = L
        coop = m.kernels.coop
        for n0, n1, w, chan in chunks:  # one buffer, or whole-row buffers: channels n0..n1-1 of N-long out rows
            Nc = n1 - n0
            rec.dispatch("linear8_coop" if coop else "linear8", [act, ex, w, chan, dst, mask_buf],
                         [Nc, pack.words(K), rows, mode, int(has_bias), 0, out0, e * Nc * pack.words(K), e * 4 * Nc]
                         + tail + [N, n0], groups_coop(Nc, rows) if coop else _groups_linear(Nc, rows))
    else:
        _, _, _, w, chan, grp, has_bias = L
        G = K // 32
        rec.dispatch("linear4", [act, ex, w, grp, chan, dst, mask_buf],
                     [N, G, rows, mode, int(has_bias), 0, out0, e * N * G * 4, e * 3 * N] + tail + [e * N * G * 2],
                     _groups_linear(N, rows))


def _segments(m, rec, b, key, outs, rows):
    """The linears of m.seg[key] on rows of b.act / b.ex, each into its own buffer of ``outs``."""
    _, Ns, K, w, chan, has_bias = m.seg[key]
    Ns = tuple(Ns) + (0,) * (3 - len(Ns))
    coop = m.kernels.coop
    rec.dispatch("linear8_segments_coop" if coop else "linear8_segments",
                 [b.act, b.ex, w, chan, outs[0], b.nomask, outs[1], outs[2]],
                 [sum(Ns), pack.words(K), rows, 0, int(has_bias), 0, 0, 0, 0, -1, 0, Ns[0], Ns[1]],
                 groups_coop(sum(Ns), rows) if coop else _groups_linear(sum(Ns), rows))


def _groups_linear(N: int, rows: int) -> tuple:
    """linear8/linear4 workgroups: 64 channels by one row each."""
    return (-(-N // 64), rows, 1)


def _moe(m, rec, b, p, moe, T):
    """Mixture of experts on the FFN input (b.act / b.ex) into the residual b.x
    (ref model.py _moe): the router, the top-k weights, then each expert on
    the rows routed to it, its down output weighted into an int64 sum."""
    E, H = moe["experts"], m.H
    _linear(m, rec, p + "ffn_gate_inp", b.act, b.ex, b.z, T)
    rec.dispatch("moe_route", [b.z, b.wexp, b.dummy, b.acc], [T, E, moe["experts_per_token"],
                                                             int(moe["norm_topk_prob"])], groups_flat(T))
    Fm = moe["expert_ffn_size"]
    for e in range(E):
        _linear(m, rec, p + "ffn_gate_exps", b.act, b.ex, b.gate, T, expert=e, mask=b.wexp)
        _linear(m, rec, p + "ffn_up_exps", b.act, b.ex, b.up, T, expert=e, mask=b.wexp)
        rec.dispatch("glu", [b.gate, b.up, b.o], [T * Fm, 0], groups_flat(T * Fm))
        _quant16(rec, "quant16_i64", b.o, b.act2, b.ex2, T, Fm)
        _linear(m, rec, p + "ffn_down_exps", b.act2, b.ex2, b.y, T, expert=e, mask=b.wexp)
        rec.dispatch("moe_accumulate", [b.dummy, b.wexp, b.acc, b.y], [T, H, E, e, int(e == 0)], groups_flat(T * H))
    rec.dispatch("moe_finish", [b.dummy, b.wexp, b.acc, b.x], [T * H], groups_flat(T * H))


def _residual(m, rec, b, name, post_norm, T):
    """x = sat32(x + linear) or, with a post-norm, x = sat32(x + shift_round_sat32(rms_norm(linear), shift))."""
    if post_norm is None:
        _linear(m, rec, name, b.act, b.ex, b.x, T, mode=1)
        return
    _linear(m, rec, name, b.act, b.ex, b.y, T)
    _norm(m, rec, b.y, post_norm, b.x, T, m.H, m.eps_h, 16, mode=1, shift=m.scalar[post_norm + ".shift"])
