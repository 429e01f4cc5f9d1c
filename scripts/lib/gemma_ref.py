"""A float32 Gemma 3 GGUF as numpy arrays and its float64 reference forward pass, for the
logits check of scripts/make-offgrid-gemma.py (the same role llama_ref.py plays for Llama
copies).

What the forward pass follows (llama.cpp's gemma3 graph, src/models/gemma3.cpp, and
transformers' Gemma3TextModel): the embedding times sqrt(d_model); per layer an RMSNorm
before and after attention and before and after the FFN; q and k RMS-normed per head; NEOX
rope (pairs i, i + head_dim/2) with base `rope.freq_base_swa` (default 10,000) on local layers
and `rope.freq_base` on global ones; queries scaled by 1/sqrt(head_dim); a sliding window on
the layers `attention.sliding_window_pattern` names (a number N: every layer but each N-th;
one bool per layer; default 6); a GeGLU FFN (tanh GELU); the output tied to the embedding,
soft-capped when `final_logit_softcapping` is set. The GGUF's norm weights are the
multipliers themselves (llama.cpp's converter adds Gemma's +1).
"""
import numpy as np

from llama_ref import as_f64, fail, open_f32_gguf, rms_norm

PER_LAYER = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_q_norm",
    "attn_k_norm",
    "attn_output",
    "post_attention_norm",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "post_ffw_norm",
)
# llama.cpp's default: layer i is global (full attention, the GGUF's rope base) when
# (i + 1) % 6 == 0.
DEFAULT_SWA_PATTERN = 6


class GemmaModel:
    """A gemma3 float32 GGUF: hyperparameters, metadata and tensors."""

    def __init__(self, path):
        self.path = path
        g, self.tensors = open_f32_gguf(path, "gemma3", "scripts/setup-gemma.sh")
        self.gguf = g

        def get(key, kind, default=None):
            v = g.get(f"gemma3.{key}", default)
            if v is None:
                fail(f"{path}: metadata key gemma3.{key} missing")
            return kind(v)

        self.d = get("embedding_length", int)
        self.n_layer = get("block_count", int)
        self.n_head = get("attention.head_count", int)
        self.n_kv = get("attention.head_count_kv", int, self.n_head)
        self.head_dim = get("attention.key_length", int)
        if get("attention.value_length", int, self.head_dim) != self.head_dim:
            fail(f"{path}: value_length differs from key_length; not supported")
        self.eps = get("attention.layer_norm_rms_epsilon", float)
        self.rope_base = get("rope.freq_base", float, 1000000.0)
        self.window = get("attention.sliding_window", int)
        self.local_rope_base = get("rope.freq_base_swa", float, 10000.0)
        self.softcap = get("final_logit_softcapping", float, 0.0)
        pattern = g.get("gemma3.attention.sliding_window_pattern", DEFAULT_SWA_PATTERN)
        if isinstance(pattern, (list, tuple, np.ndarray)):
            if len(pattern) < self.n_layer:
                fail(f"{path}: sliding_window_pattern holds {len(pattern)} entries for {self.n_layer} layers")
            self.local = [bool(x) for x in pattern[: self.n_layer]]
        else:
            n = int(pattern)
            self.local = [n != 0 and (i + 1) % n != 0 for i in range(self.n_layer)]
        if self.n_layer == 62:
            fail(f"{path}: the 62-layer 27B's query scale is not modelled here")
        if g.get("gemma3.rope.scaling.type", "none") not in ("none",):
            fail(f"{path}: rope scaling '{g.get('gemma3.rope.scaling.type')}' is not supported")
        self.order = list(g.order)
        expected = {f"blk.{i}.{n}.weight" for i in range(self.n_layer) for n in PER_LAYER}
        expected |= {"token_embd.weight", "output_norm.weight"}
        if set(self.tensors) != expected:
            extra = sorted(set(self.tensors) - expected)[:5]
            missing = sorted(expected - set(self.tensors))[:5]
            fail(f"{path}: unsupported tensor set (unknown {extra}, missing {missing}); a tied gemma3 text model only")
        self.meta = g.meta
        self.version = g.version
        self.alignment = g.alignment

    def w(self, name):
        return self.tensors[name]

    def vocab(self):
        return self.tensors["token_embd.weight"].shape[0]


def forward(m, tokens):
    """Logits of a Gemma 3 model for a token sequence (float64, causal, one sequence)."""
    hd, nh, nkv = m.head_dim, m.n_head, m.n_kv
    t_len = len(tokens)

    def w(name):
        return as_f64(m, name)

    def rms(x, g):
        return rms_norm(x, g, m.eps)

    def rope(x, base):  # x: [t][heads][hd], NEOX pairs (i, i + hd/2)
        half = hd // 2
        inv = base ** (-np.arange(half) * 2.0 / hd)
        ang = np.arange(t_len)[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)

    def gelu_tanh(x):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))

    pos = np.arange(t_len)
    causal = pos[None, :] <= pos[:, None]
    local = causal & (pos[:, None] - pos[None, :] < m.window)
    emb = w("token_embd.weight")
    h = emb[tokens] * np.sqrt(m.d)
    for i in range(m.n_layer):
        p = f"blk.{i}."
        is_global = not (m.local[i] and m.window > 0)
        base = m.rope_base if is_global else m.local_rope_base
        x = rms(h, w(p + "attn_norm.weight"))
        qh = rms((x @ w(p + "attn_q.weight").T).reshape(t_len, nh, hd), w(p + "attn_q_norm.weight"))
        kh = rms((x @ w(p + "attn_k.weight").T).reshape(t_len, nkv, hd), w(p + "attn_k_norm.weight"))
        vh = (x @ w(p + "attn_v.weight").T).reshape(t_len, nkv, hd)
        qh, kh = rope(qh, base), rope(kh, base)
        allowed = causal if is_global else local
        att = np.empty((t_len, nh, hd))
        for head in range(nh):
            kv = head // (nh // nkv)
            sc = np.where(allowed, qh[:, head, :] @ kh[:, kv, :].T / np.sqrt(hd), -np.inf)
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            att[:, head, :] = (sc / sc.sum(axis=1, keepdims=True)) @ vh[:, kv, :]
        a = att.reshape(t_len, nh * hd) @ w(p + "attn_output.weight").T
        h = h + rms(a, w(p + "post_attention_norm.weight"))
        x = rms(h, w(p + "ffn_norm.weight"))
        f = (gelu_tanh(x @ w(p + "ffn_gate.weight").T) * (x @ w(p + "ffn_up.weight").T)) @ w(p + "ffn_down.weight").T
        h = h + rms(f, w(p + "post_ffw_norm.weight"))
    logits = rms(h, w("output_norm.weight")) @ emb.T
    if m.softcap:
        logits = m.softcap * np.tanh(logits / m.softcap)
    return logits
