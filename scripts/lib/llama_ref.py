"""A float32 llama-architecture GGUF as numpy arrays (hyperparameters, metadata, tensors),
its float64 reference forward pass, and the logits check that the off-grid and widened
copies (scripts/make-offgrid.py) and the Hugging Face folder (scripts/make-hf-folder.py)
must pass: the same logits as the source up to float32 rounding.
"""
import sys

import numpy as np

import gguf_io

PER_LAYER = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def open_f32_gguf(path, arch, setup):
    """(the GGUF, {name: float32 array} in file order) of a float32 GGUF of architecture
    `arch`; any other file is an error naming `setup`, the script that makes the right one."""
    try:
        g = gguf_io.GGUF(path)
    except (OSError, ValueError, gguf_io.GGUFError) as e:
        fail(f"cannot read {path} as GGUF ({e}); give the float32 GGUF {setup} makes")
    found = g.get("general.architecture")
    if found != arch:
        fail(f"{path}: architecture '{found}'; only '{arch}' models are supported here")
    tensors = {}
    for name in g.order:
        if g.tensors[name][0] != gguf_io.GGML_F32:
            fail(f"{path}: tensor {name} is not F32; give the F32 GGUF ({setup} makes it)")
        tensors[name] = g.array(name)
    return g, tensors


class Model:
    """A llama-architecture float32 GGUF: hyperparameters, metadata and tensors."""

    def __init__(self, path):
        self.path = path
        g, self.tensors = open_f32_gguf(path, "llama", "scripts/setup-model.sh")
        self.gguf = g
        self.arch = "llama"
        self.d = self._int("embedding_length")
        self.n_layer = self._int("block_count")
        self.n_head = self._int("attention.head_count")
        self.n_kv = self._int("attention.head_count_kv", self.n_head)
        self.eps = self._float("attention.layer_norm_rms_epsilon")
        self.rope_base = self._float("rope.freq_base", 10000.0)
        self.head_dim = self.d // self.n_head
        self.rope_dim = self._int("rope.dimension_count", self.head_dim)
        if self.n_head % self.n_kv:
            fail(f"{path}: head_count {self.n_head} is not a multiple of head_count_kv {self.n_kv}")
        for key in ("attention.key_length", "attention.value_length"):
            v = g.get(f"llama.{key}")
            if v is not None and int(v) != self.head_dim:
                fail(f"{path}: llama.{key} = {v} differs from embedding_length / head_count; not supported")
        if g.get("llama.rope.scaling.type", "none") not in ("none",):
            fail(f"{path}: rope scaling '{g.get('llama.rope.scaling.type')}' is not supported")
        self.order = list(g.order)
        expected = {f"blk.{i}.{n}.weight" for i in range(self.n_layer) for n in PER_LAYER}
        expected |= {"token_embd.weight", "output_norm.weight"}
        unknown = set(self.tensors) - expected - {"output.weight"}
        missing = expected - set(self.tensors)
        if unknown or missing:
            fail(
                f"{path}: unsupported tensor set (unknown {sorted(unknown)[:5]}, missing "
                f"{sorted(missing)[:5]}); plain llama blocks only"
            )
        self.tied = "output.weight" not in self.tensors
        self.meta = g.meta
        self.version = g.version
        self.alignment = g.alignment

    def _int(self, key, default=None):
        v = self.gguf.get(f"{self.arch}.{key}")
        if v is None:
            if default is None:
                fail(f"{self.path}: metadata key {self.arch}.{key} missing")
            return default
        return int(v)

    def _float(self, key, default=None):
        v = self.gguf.get(f"{self.arch}.{key}")
        if v is None:
            if default is None:
                fail(f"{self.path}: metadata key {self.arch}.{key} missing")
            return default
        return float(v)

    def w(self, name):
        return self.tensors[name]

    def output_matrix(self):
        return self.tensors["token_embd.weight" if self.tied else "output.weight"]


def as_f64(m, name):
    """Tensor `name` of model `m` in float64 (what the reference forwards compute in)."""
    return np.asarray(m.w(name), dtype=np.float64)


def rms_norm(x, g, eps):
    """RMSNorm over the last axis, times the weight g."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def forward(m, tokens):
    """Logits of a llama model for a token sequence (float64, causal, one sequence).
    llama.cpp's NORM rope: adjacent pairs (2i, 2i+1) of each head, as stored in GGUF."""
    hd, nh, nkv = m.head_dim, m.n_head, m.n_kv
    t_len = len(tokens)

    def w(name):
        return as_f64(m, name)

    def rms(x, g):
        return rms_norm(x, g, m.eps)

    half = m.rope_dim // 2
    inv = m.rope_base ** (-np.arange(half) * 2.0 / m.rope_dim)
    ang = np.arange(t_len)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):  # x: [t][heads][hd]
        x = x.copy()
        a = x[..., 0 : m.rope_dim : 2].copy()
        b = x[..., 1 : m.rope_dim : 2].copy()
        x[..., 0 : m.rope_dim : 2] = a * cos - b * sin
        x[..., 1 : m.rope_dim : 2] = a * sin + b * cos
        return x

    mask = np.triu(np.full((t_len, t_len), -np.inf), k=1)
    h = w("token_embd.weight")[tokens]
    for i in range(m.n_layer):
        p = f"blk.{i}."
        x = rms(h, w(p + "attn_norm.weight"))
        qh = rope((x @ w(p + "attn_q.weight").T).reshape(t_len, nh, hd))
        kh = rope((x @ w(p + "attn_k.weight").T).reshape(t_len, nkv, hd))
        vh = (x @ w(p + "attn_v.weight").T).reshape(t_len, nkv, hd)
        att = np.empty((t_len, nh, hd))
        for head in range(nh):
            kv = head // (nh // nkv)
            sc = qh[:, head, :] @ kh[:, kv, :].T / np.sqrt(hd) + mask
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            att[:, head, :] = (sc / sc.sum(axis=1, keepdims=True)) @ vh[:, kv, :]
        h = h + att.reshape(t_len, nh * hd) @ w(p + "attn_output.weight").T
        x = rms(h, w(p + "ffn_norm.weight"))
        gate = x @ w(p + "ffn_gate.weight").T
        up = x @ w(p + "ffn_up.weight").T
        h = h + (gate / (1.0 + np.exp(-gate)) * up) @ w(p + "ffn_down.weight").T
    x = rms(h, w("output_norm.weight"))
    return x @ np.asarray(m.output_matrix(), dtype=np.float64).T


# Logit differences allowed between two models that should compute the same function.
# Measured on SmolLM2-135M (logits spanning about 39): the float32 rounding of the transformed
# weights moves them by at most 1.4e-5 (rot) and 8e-6 (rot-outlier), mean KLD about 3e-13. A
# wrong transform moves them by far more (a wrong GQA head mapping on a toy model: 2.0; norm
# weights off by 0.1 %: 0.08).
MAX_LOGIT_DIFF = 2e-3
MAX_KLD = 1e-7


def seeded_tokens(vocab, n_tokens=32, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, size=n_tokens)


def compare_logits(a, b):
    """(max |a - b|, mean KL(softmax a || softmax b), top-1 agreement, logit range of a)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    diff = float(np.max(np.abs(a - b)))
    la = a - a.max(axis=1, keepdims=True)
    la -= np.log(np.exp(la).sum(axis=1, keepdims=True))
    lb = b - b.max(axis=1, keepdims=True)
    lb -= np.log(np.exp(lb).sum(axis=1, keepdims=True))
    kld = float(np.mean(np.sum(np.exp(la) * (la - lb), axis=1)))
    top1 = float(np.mean(a.argmax(axis=1) == b.argmax(axis=1)))
    return diff, kld, top1, float(np.max(a) - np.min(a))


def verify(src, new, label=None, n_tokens=32, seed=0):
    """Fails (exit 1) unless `new` gives `src`'s logits within float32 rounding."""
    tokens = seeded_tokens(src.output_matrix().shape[0], n_tokens, seed)
    diff, kld, top1, spread = compare_logits(forward(src, tokens), forward(new, tokens))
    print(
        f"logits check ({n_tokens} seeded tokens, float64 forward): max |diff| {diff:.3g} "
        f"(logit range {spread:.3g}), mean KLD {kld:.3g}, top-1 agreement {top1:.3f}",
        file=sys.stderr,
    )
    if not (diff <= MAX_LOGIT_DIFF and kld <= MAX_KLD):
        fail(
            f"{label or new.path} does not compute the same function as {src.path} (max |logit diff| "
            f"{diff:.3g} > {MAX_LOGIT_DIFF} or KLD {kld:.3g} > {MAX_KLD})"
        )
    return diff
