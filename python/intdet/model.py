"""Load a converted intdet model directory and run it on a backend.

``load_model(dir)`` hands config.json and the mmapped tensors to the one
loader (csrc/model/loader.cpp, through intdet._core.check_model), which
checks the config, every tensor's dtype, shape and value range, and refuses
any tensor the config does not describe. ``Engine`` wraps a backend of the
table in backends/__init__.py: ``cpu`` (the C++ core, the default),
``cuda`` (the CUDA kernels of ``intdet._cuda``, the same bits;
docs/cuda.md), ``ref`` (the numpy integer spec, slow, for cross-checking)
or ``webgpu``; every one has the API of ``intdet._core``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import backends
from .background import Background, sha256_file
from .backends.cuda import cuda_module  # noqa: F401  (the name callers and tests used)
from .errors import IntdetError
from .format import MODEL_SHA256_KEY, SKIP_SHA256_ENV
from .safetensors_io import SafetensorsFile
from .sampling import draw_u64

if TYPE_CHECKING:
    from tokenizers import Tokenizer

DEVICES = backends.names()  # every --device name (backends/__init__.py's table)


@dataclass
class LoadedModel:
    path: str
    cfg: dict
    tensors: dict  # name -> read-only numpy view into the mmapped file
    tokenizer: Tokenizer
    tok_meta: dict
    sha256_job: object  # model.safetensors' sha256: a str, or a background.Background computing it
    st: object = None  # the SafetensorsFile the tensors view
    cfg_path: str = ""
    st_path: str = ""

    @property
    def model_sha256(self) -> str:
        """sha256 of model.safetensors (hex). It is computed on a thread from
        load_model on, beside the engine's checks and packing (which release
        the GIL); the first use waits for it (Engine's constructor, after
        packing) and compares it with the one config.json recorded at
        conversion (check_recorded_sha256: IntdetError on a mismatch)."""
        if not isinstance(self.sha256_job, str):
            got = self.sha256_job.result()
            check_recorded_sha256(self.cfg, got, self.st_path or os.path.join(self.path, "model.safetensors"))
            self.sha256_job = got
        return self.sha256_job

    def check_sha256(self) -> str:
        """Wait for model_sha256 (and so its check against config.json's
        record); returns it. Raises IntdetError on a mismatch."""
        return self.model_sha256


def check_recorded_sha256(cfg: dict, got: str, st_path: str) -> None:
    """IntdetError (field "model") when config.json records a sha256 of
    model.safetensors (``model_sha256``, written by convert) that differs
    from ``got``, the file's sha256 now: it was damaged or changed after
    conversion. Models converted before the record existed pass, as does
    any model with INTDET_SKIP_SHA256_CHECK=1."""
    recorded = cfg.get(MODEL_SHA256_KEY)
    if recorded is None or recorded == got or os.environ.get(SKIP_SHA256_ENV, "") not in ("", "0"):
        return
    raise IntdetError(f"{st_path}: sha256 {got} does not match the {recorded} recorded in config.json at "
                      f"conversion (the file is damaged or was changed; {SKIP_SHA256_ENV}=1 loads it anyway)",
                      field="model")


def load_model(path: str) -> LoadedModel:
    """Open a converted model directory. Raises IntdetError naming the file
    for a missing file, a foreign or other-version format, a bad config
    value, or a tensor that is missing, extra, or not of the dtype, shape or
    value range the config implies (all checked by the C++ loader)."""
    from . import _core
    from .tokenizer import load_tokenizer

    cfg_path = os.path.join(path, "config.json")
    st_path = os.path.join(path, "model.safetensors")
    for p in (cfg_path, st_path):
        if not os.path.isfile(p):
            raise IntdetError(f"{path}: not an intdet model directory (missing {os.path.basename(p)})")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            text = f.read()
        cfg = json.loads(text)
    except (OSError, ValueError) as e:
        raise IntdetError(f"{cfg_path}: cannot read JSON ({e})") from None
    recorded = cfg.get(MODEL_SHA256_KEY) if isinstance(cfg, dict) else None
    if recorded is not None and not (isinstance(recorded, str) and re.fullmatch(r"[0-9a-f]{64}", recorded)):
        raise IntdetError(f"{cfg_path}: {MODEL_SHA256_KEY} must be 64 lowercase hex digits, not {recorded!r:.80}",
                          field=MODEL_SHA256_KEY)
    st = SafetensorsFile(st_path)
    job = Background(sha256_file, st_path)  # reads the whole file: alongside the checks below
    tensors = {name: st.get(name) for name in st.names()}
    try:
        # mapped: each weight's pages are dropped once checked, until the engine reads (or packs) it.
        _core.check_model(text, tensors, cfg_path, st_path, mapped=True)
    except ValueError as e:
        raise IntdetError(str(e)) from None
    try:
        tok, meta = load_tokenizer(path)
    except (OSError, ValueError) as e:  # missing or malformed tokenizer files
        raise IntdetError(str(e) if str(path) in str(e) else f"{path}: {e}") from None
    return LoadedModel(path=path, cfg=cfg, tensors=tensors, tokenizer=tok, tok_meta=meta,
                       sha256_job=job, st=st, cfg_path=cfg_path, st_path=st_path)


class State:
    """One sequence's state on a backend: its KV cache and the positions it
    holds (the backend's ``State``, e.g. ``intdet._core.State``).
    ``forward(tokens, all_logits)`` appends tokens (int [T]) and returns
    int32 logits [T or 1, vocab] (Q16); ``out`` (a writable C-contiguous
    int32 array of that shape) receives them instead of a new array, so a
    caller that runs many pieces reuses one buffer."""

    def __init__(self, engine: "Engine", max_len: int):
        self.engine = engine
        self.max_len = max_len
        self.n_past = 0
        self._state = engine.backend.State(engine._model, max_len)

    def forward(self, tokens, all_logits: bool = False, out: np.ndarray | None = None) -> np.ndarray:
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        if self.n_past + len(tokens) > self.max_len:
            raise IntdetError(f"sequence of {self.n_past + len(tokens)} tokens exceeds the context ({self.max_len})")
        out = self.engine.backend.forward(self.engine._model, self._state, tokens, self.n_past, all_logits, out)
        self.n_past += len(tokens)
        return out

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` cached positions (0 <= n <= n_past) and drop
        the rest: the next forward continues at position n, writing over
        them (speculative decoding's rejected drafts). A sliding-window
        layer's ring holds window + 512 rows (csrc kForwardRows), so rolling
        back fewer than 512 positions never loses a row the window still
        needs (the scheduler drafts at most 64). IntdetError for n outside
        that range."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.n_past:
            raise IntdetError(f"truncate: {n!r} is outside [0, {self.n_past}] (the cached positions)")
        self._state.truncate(n)
        self.n_past = n

    @property
    def can_copy_prefix(self) -> bool:
        """Whether ``copy_prefix`` is available (the backend's State has it:
        CPU, CUDA and the numpy spec do)."""
        return hasattr(self._state, "copy_prefix")

    def copy_prefix(self, src: "State", n: int) -> None:
        """Start this empty sequence from the first ``n`` cached positions of
        ``src`` (a sequence of the same engine): their K/V rows and scales
        are copied, so the next forward continues at position n exactly as
        after a prefill of those tokens (the prefix cache). IntdetError if
        this sequence is not empty, n is outside [0, min(src.n_past,
        max_len)], or the backend cannot copy."""
        if self.n_past != 0 or src.engine is not self.engine:
            raise IntdetError("copy_prefix: needs an empty sequence and a source of the same engine")
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= min(src.n_past, self.max_len):
            raise IntdetError(f"copy_prefix: {n!r} is outside [0, {min(src.n_past, self.max_len)}]")
        if not self.can_copy_prefix:
            raise IntdetError(f"copy_prefix: not available on --device {self.engine.device}")
        self._state.copy_prefix(src._state, n)
        self.n_past = n

    @property
    def device_pick(self) -> bool:
        """Whether this backend chooses tokens on the device (submit_pick /
        wait_pick; the table's ``device_pick`` capability, e.g. CUDA)."""
        return self.engine.spec.device_pick and hasattr(self.engine.backend, "submit_pick")

    def submit_pick(self, tokens=None, sampler=None) -> None:
        """device_pick backends only: enqueue a forward of ``tokens`` (int
        [T]; None: one row whose token is the one the previous submit chose,
        never copied to the host first), the choice of the next token on the
        device from the last row's logits (``sampler`` None or greedy: the
        largest logit, the lowest id on ties; else temperature sampling with
        top-k, top-p and min-p, which needs the repetition penalty off:
        ``Sampler.pick``'s token for the same seed and position) and the copy
        of those logits into pinned memory; returns at once. Raises
        IntdetError when the tokens do not fit the context or the sampler
        needs the host."""
        n = 1 if tokens is None else len(tokens)
        if self.n_past + n > self.max_len:
            raise IntdetError(f"sequence of {self.n_past + n} tokens exceeds the context ({self.max_len})")
        cuts = dict(t_num=0, t_den=1, draw=0)
        if sampler is not None and not sampler.device_ok:
            raise IntdetError("submit_pick: the repetition penalty is applied on the host")
        if sampler is not None and not sampler.greedy:
            cuts = dict(t_num=sampler.t_num, t_den=sampler.t_den, draw=draw_u64(sampler.seed, self.n_past + n),
                        top_k=sampler.top_k, p_num=sampler.p_num, p_den=sampler.p_den, m_num=sampler.m_num,
                        m_den=sampler.m_den)
        toks = None if tokens is None else np.ascontiguousarray(tokens, dtype=np.int32)
        self.engine.backend.submit_pick(self.engine._model, self._state, toks, self.n_past, **cuts)
        self.n_past += n

    def wait_pick(self) -> tuple[int, np.ndarray]:
        """Wait for the last submit_pick: (token, int32 logits [V] of the
        row it was chosen from). The logits are a read-only view of pinned
        memory, valid until the second submit_pick after this one."""
        tok, logits = self.engine.backend.wait_pick(self.engine._model)
        return int(tok), logits


def _refused(e: ValueError) -> IntdetError:
    """The loader's refusal of an updated model (a value outside what the
    integer format holds: weights far from any trained model's), said as
    the weights' fault."""
    msg = str(e)
    if msg.startswith("update_weights: "):
        msg = msg[len("update_weights: "):]
    return IntdetError(f"weights: the quantized weights are out of the format's range ({msg})", field="weights")


def default_threads() -> int:
    """Cores this process may run on (the machines here have no SMT; on SMT
    machines OpenMP's default of one thread per logical CPU applies)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Engine:
    """A loaded model on one backend of the table (backends/__init__.py:
    ``cpu``: C++ core; ``cuda``: GPU kernels; ``ref``: numpy spec;
    ``webgpu``: WebGPU). ``cuda_graphs`` (backends with that capability):
    replay decode steps from CUDA graphs (None: the INTDET_CUDA_GRAPHS
    environment variable). ``self.backend`` is the backend's API object,
    ``self.spec`` its table row; nothing here depends on the device name."""

    def __init__(self, lm: LoadedModel, device: str = "cpu", threads: int | None = None,
                 cuda_graphs: bool | None = None):
        self.spec = backends.spec(device)
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, (int, np.integer))
                                    or not 0 <= threads <= 1024):
            raise IntdetError(f"threads: {threads!r} must be in [0, 1024] (0 = auto)", field="threads")
        self.lm = lm
        self.device = device
        self.backend = api = backends.load(device)
        try:
            api.kernels_ready()
        except ValueError as e:  # INTDET_ISA names a kernel set this CPU or build lacks
            raise IntdetError(str(e)) from None
        if threads is not None:  # 0: auto (all cores, fewer while others keep some busy)
            api.set_num_threads(threads)
        if hasattr(api, "preflight"):  # before packing: a refusal, not an OOM kill
            api.preflight(lm.cfg, lm.tensors, lm.st_path or "model.safetensors")
        # mapped: the tensors are views of the read-only file mapping, so the
        # backend may drop each weight's pages once it has packed it.
        self._model = self._build(lm.cfg, lm.tensors, mapped=lm.st is not None, config_path=lm.cfg_path or "config.json",
                                  tensors_path=lm.st_path or "model.safetensors", cuda_graphs=cuda_graphs,
                                  refused=lambda e: IntdetError(str(e)))  # the loader's message names the file
        # model.safetensors' sha256, read beside the packing, against config.json's record
        lm.check_sha256()

    def _build(self, cfg: dict, tensors: dict, mapped: bool, config_path: str, tensors_path: str,
               cuda_graphs: bool | None, refused):
        """The backend's Model; ``refused(ValueError)`` gives the error for
        a model the loader refuses; a RuntimeError (out of device memory, a
        driver error) is "device NAME: ..."."""
        options = {"cuda_graphs": cuda_graphs} if self.spec.cuda_graphs else {}
        try:
            return self.backend.Model(cfg, tensors, mapped=mapped, config_path=config_path,
                                      tensors_path=tensors_path, **options)
        except ValueError as e:
            raise refused(e) from None
        except RuntimeError as e:
            raise IntdetError(f"device {self.device}: {e}", field="device") from None

    def replace_weights(self, cfg: dict, tensors: dict, sha256: str) -> None:
        """Run from now on the model of ``tensors`` (name -> int array, the
        loader's dtypes and shapes) and ``cfg`` whose model.safetensors
        would have ``sha256`` (a str, or a background.Background computing
        it; update.plan_update, update.file_sha256). The backend's model is
        built (checked, packed, uploaded) before anything is replaced, so
        an error leaves the old one whole. States made before belong to
        the old model: drop them first (the scheduler does)."""
        model = self._build(cfg, tensors, mapped=False, config_path="update_weights", tensors_path="update_weights",
                            cuda_graphs=self.cuda_graphs, refused=_refused)
        sha = sha256 if isinstance(sha256, str) else sha256.result()  # a background.Background, hashing meanwhile
        cfg["model_sha256"] = sha
        self._model = model
        self.lm.cfg, self.lm.tensors, self.lm.sha256_job = cfg, tensors, sha

    def forward_batch(self, seqs, tokens, all_logits=False, out: np.ndarray | None = None):
        """Advance several sequences in one call (their rows share every linear
        layer); returns one int32 logits array per sequence, bit-identical to
        ``seq.forward(tokens_i, all_logits_i)`` run alone. ``all_logits``: one
        bool for all sequences or a list of one per sequence. ``out``: a
        writable C-contiguous int32 array of [rows, vocab] (rows: the logits
        rows of the call, in sequence order) that the results are views of,
        reused instead of a new one."""
        flags = [bool(all_logits)] * len(seqs) if isinstance(all_logits, bool) else [bool(f) for f in all_logits]
        if len(flags) != len(seqs):
            raise IntdetError(f"forward_batch: {len(flags)} all_logits flags for {len(seqs)} sequences")
        for s, t in zip(seqs, tokens):
            if s.n_past + len(t) > s.max_len:
                raise IntdetError(f"sequence of {s.n_past + len(t)} tokens exceeds the context ({s.max_len})")
        outs = self.backend.forward_batch(self._model, [s._state for s in seqs],
                                          [np.ascontiguousarray(t, dtype=np.int32) for t in tokens], flags, out)
        for s, t in zip(seqs, tokens):
            s.n_past += len(t)
        return outs

    # ------------------------------------------------ the backend's controls
    # (callers use these; none reaches into the backend or _model)

    @property
    def isa(self) -> str:
        """The kernel set in use: a CPU set name ("scalar", "avx2", ...),
        or the backend's one set ("cuda", "ref", ...)."""
        return str(self.backend.isa())

    def available_isas(self) -> list:
        """The kernel sets this backend can run on this machine (cpu: this
        build's sets the CPU runs, slowest first; else [isa])."""
        return list(self.backend.available_isas())

    def set_isa(self, name: str) -> None:
        """Switch the kernel set (cpu: process-wide, the core has one; any
        set gives the same bits). IntdetError for an unknown set or a
        backend with one set."""
        if not self.spec.set_isa:
            raise IntdetError(f"set_isa: the {self.device} backend has one kernel set")
        try:
            self.backend.set_isa(name)
        except ValueError as e:
            raise IntdetError(str(e)) from None

    @property
    def threads(self) -> int:
        """Threads a forward call may use now (cpu; 1 elsewhere: the GPU or
        numpy decide)."""
        return int(self.backend.num_threads())

    @property
    def thread_setting(self) -> int:
        """The thread count as set (0 = auto: all cores, fewer while others
        keep some busy); cpu only, else 0."""
        return int(self.backend.thread_setting())

    def set_threads(self, n: int) -> None:
        """Set the CPU core's thread count (process-wide; 0 = auto; any count
        gives the same bits). No-op on other backends."""
        self.backend.set_num_threads(int(n))

    def last_forward_threads(self) -> int:
        """Threads the latest forward call used (cpu; auto may use fewer)."""
        return int(self.backend.last_forward_threads())

    @property
    def device_name(self) -> str:
        """The GPU's or adapter's name, else the backend and kernel set."""
        return str(self.backend.device_name())

    @property
    def cuda_graphs(self) -> bool:
        """Whether decode steps replay CUDA graphs (backends with CUDA graphs; False elsewhere)."""
        return bool(self._model.cuda_graphs) if self.spec.cuda_graphs else False

    @cuda_graphs.setter
    def cuda_graphs(self, on: bool) -> None:
        if not self.spec.cuda_graphs:
            raise IntdetError(f"cuda_graphs: the {self.device} backend has no CUDA graphs")
        self._model.cuda_graphs = bool(on)

    def trace(self, ids, isa: str | None = None) -> dict:
        """name -> int array of every traced intermediate of one forward of
        ``ids`` from position 0 (cpu: on kernel set ``isa``, default the
        active one, for this call only). trace.py compares them."""
        if not (self.spec.trace and hasattr(self.backend, "forward_trace")):
            raise IntdetError(f"trace: the {self.device} backend has no trace")
        state = self.backend.State(self._model, len(ids))
        _logits, named, _used = self.backend.forward_trace(self._model, state, np.ascontiguousarray(ids, np.int32), 0,
                                                           isa)
        return dict(named)

    @property
    def vocab_size(self) -> int:
        return self.lm.cfg["vocab_size"]

    @property
    def context_length(self) -> int:
        return self.lm.cfg["context_length"]

    def new_state(self, max_len: int | None = None) -> State:
        return State(self, min(max_len or self.context_length, self.context_length))
