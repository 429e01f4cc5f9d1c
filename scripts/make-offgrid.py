#!/usr/bin/env python3
"""Makes a function-preserving off-grid copy of a float32 Llama GGUF.

SmolLM2-135M-Instruct ships as Q4_1, so the float32 file scripts/setup-model.sh derives from
it holds weights that sit exactly on a 4-bit grid of 32-weight groups: a quantizer with the
same groups reproduces them and looks better than it would on a real (bf16) checkpoint.
This script computes the same network in other coordinates, so that no weight is on a grid
any more while every output is unchanged (up to float32 rounding):

  rot          The residual stream is rotated by a random orthogonal Q (d x d; QR of a
               seeded Gaussian matrix, column signs fixed by R's diagonal, so Q is Haar
               distributed). First each RMSNorm weight g is folded into the linears that
               read the normalised stream (attn_norm into attn_q/k/v, ffn_norm into
               ffn_gate/up, output_norm into the output matrix) and set to 1. Then, with
               GGUF's row layout W[out][in] (y = W x for column vectors x):
                 token_embd          E <- E Q              (rows are the residual vectors)
                 attn_q/k/v, ffn_gate/up, output
                                     W <- W diag(g) Q      (input side)
                 attn_output, ffn_down
                                     W <- Q^T W            (output side)
               RMSNorm commutes with Q (the mean square of a vector is rotation invariant),
               and the llama q/k row permutation llama.cpp's converter applies acts on the
               output rows, so the input-side product commutes with it. A tied model gets
               an explicit output.weight = E diag(g_out) Q, because the input side needs
               E Q. Metadata (tokenizer, hyperparameters) is copied byte for byte.

  rot-outlier  rot, then heavy-tailed per-channel scales s (most near 1, a fraction of
               channels 6-12x) folded so that those channels carry that much larger
               activations into the linears (what real checkpoints have):
                 residual stream     one s over the d channels, shared by every layer:
                                     attn_norm, ffn_norm, output_norm g <- s, and the
                                     input columns of q/k/v, gate/up, output divided by s
                 attention           per layer: attn_v row i times s_i, attn_output column
                                     h*head_dim + c divided by s of kv head h // (n_head /
                                     n_head_kv), channel c (every q head of a GQA group
                                     reads the same v channel)
                 feed-forward        per layer: ffn_up row i times s_i, ffn_down column i
                                     divided by s_i (SwiGLU is linear in up)

Each variant draws Q and s from its own seed (numpy's PCG64 default_rng: stable across
numpy versions; the QR itself goes through LAPACK, so the last bits of Q may differ between
machines). The transform is computed in float64 and rounded to float32 once.

Output: <name>-F32.gguf beside the source (name defaults to the source's name without
-F32 plus -offgrid-<variant>), written under a temporary name, checked, then renamed, with
<name>-F32.gguf.json recording the parameters. A file whose record matches the request is
reused (nothing is recomputed), so the script is idempotent.

Check: before the rename, a float64 numpy forward pass of the source and of the new file on
the same seeded token sequence must give the same logits (the maximum |difference| and the
KL divergence are printed; a difference beyond float32 rounding is an error and nothing is
written). The end-to-end check is float32 perplexity equal to the source's within 1e-4
relative, by the in-tree runner and by llama.cpp, each against its own figure for the
source; scripts/check-offgrid.sh runs it for the copies setup-offgrid.sh makes. By hand:
  target/release/kwk-eval --llm FILE --text datasets/wikitext-2-raw/wiki.test.raw \\
      --formats float32 --no-speed --chunks 20 --out /tmp/offgrid-check
  $BIN/llama-perplexity -m FILE -f datasets/wikitext-2-raw/wiki.test.raw -c 512 \\
      --chunks 20 -b 512 -ctk f32 -ctv f32 -t 2

Usage:
  scripts/make-offgrid.py SRC-F32.gguf --variant rot [--seed N] [--name NAME]
  scripts/make-offgrid.py SRC-F32.gguf --variant rot-outlier [--seed N]
      [--outlier-frac F] [--outlier-spread LO:HI] [--outlier-jitter SIGMA]
  scripts/make-offgrid.py --verify SRC-F32.gguf OTHER.gguf   (the logits check alone)
The path of the result is printed on the last line of stdout.
"""
import argparse
import json
import os
import subprocess
import sys

try:
    import numpy as np
    import gguf
except ImportError:
    print("installing numpy and gguf from PyPI", file=sys.stderr)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "numpy", "gguf==0.19.0"],
        check=True,
        stdout=sys.stderr,
    )
    import numpy as np
    import gguf

# Bumped when the transform changes, so that files made by an older script are remade.
TRANSFORM_VERSION = 1
DEFAULT_SEEDS = {"rot": 1, "rot-outlier": 2}

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
GLOBAL = ("token_embd.weight", "output_norm.weight", "output.weight")


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------- reading


class Model:
    """A llama-architecture GGUF: hyperparameters, raw metadata bytes and float32 tensors."""

    def __init__(self, path):
        self.path = path
        try:
            r = gguf.GGUFReader(path)
        except (OSError, ValueError) as e:
            fail(f"cannot read {path} as GGUF ({e}); give the float32 GGUF scripts/setup-model.sh makes")
        self.reader = r
        arch = self._str("general.architecture")
        if arch != "llama":
            fail(f"{path}: architecture '{arch}'; only 'llama' models are supported")
        self.arch = arch
        self.d = self._int(f"{arch}.embedding_length")
        self.n_layer = self._int(f"{arch}.block_count")
        self.n_head = self._int(f"{arch}.attention.head_count")
        self.n_kv = self._int(f"{arch}.attention.head_count_kv", self.n_head)
        self.eps = self._float(f"{arch}.attention.layer_norm_rms_epsilon")
        self.rope_base = self._float(f"{arch}.rope.freq_base", 10000.0)
        self.head_dim = self.d // self.n_head
        self.rope_dim = self._int(f"{arch}.rope.dimension_count", self.head_dim)
        if self.n_head % self.n_kv:
            fail(f"{path}: head_count {self.n_head} is not a multiple of head_count_kv {self.n_kv}")
        self.tensors = {}
        self.order = []
        for t in r.tensors:
            if t.tensor_type != gguf.GGMLQuantizationType.F32:
                fail(
                    f"{path}: tensor {t.name} is {t.tensor_type.name}, not F32; give the F32 GGUF "
                    "(scripts/setup-model.sh makes <model>-F32.gguf)"
                )
            self.tensors[t.name] = t.data
            self.order.append(t.name)
        expected = {f"blk.{i}.{n}.weight" for i in range(self.n_layer) for n in PER_LAYER}
        expected |= {"token_embd.weight", "output_norm.weight"}
        unknown = set(self.tensors) - expected - {"output.weight"}
        missing = expected - set(self.tensors)
        if unknown or missing:
            fail(
                f"{path}: unsupported tensor set (unknown {sorted(unknown)[:5]}, missing "
                f"{sorted(missing)[:5]}); the transform covers plain llama blocks only"
            )
        self.tied = "output.weight" not in self.tensors
        # The key/value section, copied verbatim into the output.
        kv_start = r.fields["GGUF.kv_count"].offset + 8
        kv_end = r.tensors[0].field.offset if r.tensors else r.data_offset
        self.kv_bytes = bytes(r.data[kv_start:kv_end])
        self.kv_count = int(r.fields["GGUF.kv_count"].parts[0][0])
        self.version = int(r.fields["GGUF.version"].parts[0][0])
        self.alignment = int(r.alignment)

    def _field(self, key):
        return self.reader.fields.get(key)

    def _str(self, key):
        f = self._field(key)
        if f is None:
            fail(f"{self.path}: metadata key {key} missing")
        return f.contents()

    def _int(self, key, default=None):
        f = self._field(key)
        if f is None:
            if default is None:
                fail(f"{self.path}: metadata key {key} missing")
            return default
        return int(f.contents())

    def _float(self, key, default=None):
        f = self._field(key)
        if f is None:
            if default is None:
                fail(f"{self.path}: metadata key {key} missing")
            return default
        return float(f.contents())

    def w(self, name):
        return self.tensors[name]

    def output_matrix(self):
        return self.tensors["token_embd.weight" if self.tied else "output.weight"]


# ---------------------------------------------------------------- the transform


def random_orthogonal(rng, d):
    g = rng.standard_normal((d, d))
    q, r = np.linalg.qr(g)
    return q * np.sign(np.diag(r))[None, :]


def outlier_scales(rng, n, frac, lo, hi, jitter):
    """Heavy-tailed positive scales: log-normal bulk near 1, round(frac*n) channels log-uniform in [lo, hi]."""
    s = np.exp(jitter * rng.standard_normal(n))
    k = int(round(frac * n))
    if k:
        idx = rng.choice(n, size=k, replace=False)
        s[idx] = np.exp(rng.uniform(np.log(lo), np.log(hi), size=k))
    return s


def transform(m, variant, seed, frac, lo, hi, jitter):
    """Yields (name, float32 array) for every output tensor, in the source's order (output.weight
    appended when the source is tied)."""
    rng = np.random.default_rng(seed)
    q = random_orthogonal(rng, m.d)
    outlier = variant == "rot-outlier"
    if outlier:
        s_res = outlier_scales(rng, m.d, frac, lo, hi, jitter)
        kv_dim = m.n_kv * m.head_dim
        group = m.n_head // m.n_kv
        # Per-layer scales drawn up front in layer order, so they depend on the seed alone.
        s_v = [outlier_scales(rng, kv_dim, frac, lo, hi, jitter) for _ in range(m.n_layer)]
        n_ff = m.w("blk.0.ffn_up.weight").shape[0]
        s_up = [outlier_scales(rng, n_ff, frac, lo, hi, jitter) for _ in range(m.n_layer)]
    else:
        s_res = np.ones(m.d)

    def f64(name):
        return np.asarray(m.w(name), dtype=np.float64)

    def input_side(w, g):
        # W diag(g) Q, then the residual outlier columns divided by s_res.
        return ((w * g[None, :]) @ q) / s_res[None, :]

    def out(a):
        return np.ascontiguousarray(a, dtype=np.float32)

    names = list(m.order) + (["output.weight"] if m.tied else [])
    for name in names:
        if name == "token_embd.weight":
            yield name, out(f64(name) @ q)
        elif name == "output.weight":
            yield name, out(input_side(np.asarray(m.output_matrix(), dtype=np.float64), f64("output_norm.weight")))
        elif name == "output_norm.weight" or name.endswith((".attn_norm.weight", ".ffn_norm.weight")):
            yield name, out(s_res)
        else:
            layer = int(name.split(".")[1])
            kind = name.split(".")[2]
            if kind in ("attn_q", "attn_k", "attn_v"):
                w = input_side(f64(name), f64(f"blk.{layer}.attn_norm.weight"))
                if kind == "attn_v" and outlier:
                    w = w * s_v[layer][:, None]
                yield name, out(w)
            elif kind in ("ffn_gate", "ffn_up"):
                w = input_side(f64(name), f64(f"blk.{layer}.ffn_norm.weight"))
                if kind == "ffn_up" and outlier:
                    w = w * s_up[layer][:, None]
                yield name, out(w)
            elif kind == "attn_output":
                w = q.T @ f64(name)
                if outlier:
                    # Column h*head_dim + c reads v channel (h // group)*head_dim + c.
                    heads = np.arange(m.n_head)[:, None] // group
                    cols = (heads * m.head_dim + np.arange(m.head_dim)[None, :]).reshape(-1)
                    w = w / s_v[layer][cols][None, :]
                yield name, out(w)
            elif kind == "ffn_down":
                w = q.T @ f64(name)
                if outlier:
                    w = w / s_up[layer][None, :]
                yield name, out(w)
            else:
                raise AssertionError(name)


# ---------------------------------------------------------------- writing


def gguf_string(s):
    b = s.encode("utf-8")
    return len(b).to_bytes(8, "little") + b


def write_gguf(m, path, tensors):
    """Writes a GGUF with m's metadata bytes and the given float32 tensors (name -> shape known
    up front from m; data streamed from the iterator)."""
    shapes = {n: tuple(m.w(n).shape) for n in m.order}
    if m.tied:
        shapes["output.weight"] = tuple(m.output_matrix().shape)
    names = list(m.order) + (["output.weight"] if m.tied else [])
    align = m.alignment

    def pad(n):
        return (align - n % align) % align

    info = bytearray()
    offset = 0
    offsets = {}
    for n in names:
        shape = shapes[n]
        info += gguf_string(n)
        info += len(shape).to_bytes(4, "little")
        for dim in reversed(shape):  # GGUF lists ne[0] (the contiguous dimension) first
            info += int(dim).to_bytes(8, "little")
        info += int(gguf.GGMLQuantizationType.F32).to_bytes(4, "little")
        info += offset.to_bytes(8, "little")
        offsets[n] = offset
        nbytes = int(np.prod(shape)) * 4
        offset += nbytes + pad(nbytes)
    header = bytearray()
    header += b"GGUF"
    header += m.version.to_bytes(4, "little")
    header += len(names).to_bytes(8, "little")
    header += m.kv_count.to_bytes(8, "little")
    header += m.kv_bytes
    header += info
    header += b"\0" * pad(len(header))
    with open(path, "wb") as f:
        f.write(header)
        for n, a in tensors:
            if a.shape != shapes[n]:
                raise AssertionError(f"{n}: shape {a.shape}, expected {shapes[n]}")
            if f.tell() != len(header) + offsets[n]:
                raise AssertionError(f"{n}: written out of order")
            a.tofile(f)
            f.write(b"\0" * pad(a.nbytes))
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------- the logits check


def forward(m, tokens):
    """Logits of a llama model for a token sequence (float64, causal, one sequence).
    llama.cpp's NORM rope: adjacent pairs (2i, 2i+1) of each head, as stored in GGUF."""
    hd, nh, nkv = m.head_dim, m.n_head, m.n_kv
    t_len = len(tokens)

    def w(name):
        return np.asarray(m.w(name), dtype=np.float64)

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + m.eps) * g

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


# Logit differences allowed between the two models. Measured on SmolLM2-135M (logits spanning
# about 39): the float32 rounding of the transformed weights moves them by at most 1.4e-5
# (rot) and 8e-6 (rot-outlier), mean KLD about 3e-13. A wrong transform moves them by far
# more (a wrong GQA head mapping on a toy model: 2.0; norm weights off by 0.1 %: 0.08).
MAX_LOGIT_DIFF = 2e-3
MAX_KLD = 1e-7


def verify(src, new, label=None, n_tokens=32, seed=0):
    rng = np.random.default_rng(seed)
    vocab = src.output_matrix().shape[0]
    tokens = rng.integers(0, vocab, size=n_tokens)
    a = forward(src, tokens)
    b = forward(new, tokens)
    diff = float(np.max(np.abs(a - b)))
    la = a - a.max(axis=1, keepdims=True)
    la -= np.log(np.exp(la).sum(axis=1, keepdims=True))
    lb = b - b.max(axis=1, keepdims=True)
    lb -= np.log(np.exp(lb).sum(axis=1, keepdims=True))
    kld = float(np.mean(np.sum(np.exp(la) * (la - lb), axis=1)))
    top1 = float(np.mean(a.argmax(axis=1) == b.argmax(axis=1)))
    spread = float(np.max(a) - np.min(a))
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


# ---------------------------------------------------------------- main


def parse_spread(text):
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        fail(f"--outlier-spread '{text}': expected LO:HI, e.g. 6:12")
    if not (1.0 <= lo <= hi):
        fail(f"--outlier-spread '{text}': need 1 <= LO <= HI")
    return lo, hi


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="the float32 GGUF (e.g. SmolLM2-135M-Instruct-F32.gguf)")
    ap.add_argument("other", nargs="?", help="with --verify: the file to compare with the source")
    ap.add_argument("--variant", choices=sorted(DEFAULT_SEEDS), help="the transform")
    ap.add_argument("--seed", type=int, help="seed of Q and the scales (default: rot 1, rot-outlier 2)")
    ap.add_argument("--name", help="output name without -F32.gguf (default <source>-offgrid-<variant>)")
    ap.add_argument("--outlier-frac", type=float, default=0.03, help="fraction of outlier channels (0.03)")
    ap.add_argument("--outlier-spread", default="6:12", help="outlier scale range LO:HI, log-uniform (6:12)")
    ap.add_argument("--outlier-jitter", type=float, default=0.1, help="log-normal sigma of the other channels (0.1)")
    ap.add_argument("--verify", action="store_true", help="only compare the logits of source and other")
    args = ap.parse_args()

    if args.verify:
        if not args.other:
            fail("--verify needs two files: SOURCE OTHER")
        verify(Model(args.source), Model(args.other))
        return
    if args.other:
        fail(f"unexpected argument '{args.other}' (two files only with --verify)")
    if not args.variant:
        fail("--variant rot or --variant rot-outlier is required")
    if not os.path.isfile(args.source):
        fail(f"{args.source} not found; scripts/setup-model.sh makes the F32 GGUF")
    if not (0.0 <= args.outlier_frac < 1.0):
        fail(f"--outlier-frac {args.outlier_frac}: need 0 <= F < 1")
    if args.outlier_jitter < 0:
        fail(f"--outlier-jitter {args.outlier_jitter}: need >= 0")
    lo, hi = parse_spread(args.outlier_spread)
    seed = DEFAULT_SEEDS[args.variant] if args.seed is None else args.seed

    src_dir = os.path.dirname(os.path.abspath(args.source))
    base = os.path.basename(args.source)
    stem = base[: -len(".gguf")] if base.endswith(".gguf") else base
    if stem.endswith("-F32"):
        stem = stem[: -len("-F32")]
    name = args.name or f"{stem}-offgrid-{args.variant}"
    out = os.path.join(src_dir, f"{name}-F32.gguf")
    record_path = out + ".json"
    st = os.stat(args.source)
    record = {
        "transform_version": TRANSFORM_VERSION,
        "variant": args.variant,
        "seed": seed,
        "source": base,
        "source_size": st.st_size,
        "source_mtime_ns": st.st_mtime_ns,
    }
    if args.variant == "rot-outlier":
        record.update(outlier_frac=args.outlier_frac, outlier_spread=[lo, hi], outlier_jitter=args.outlier_jitter)

    if os.path.isfile(out) and os.path.isfile(record_path):
        try:
            with open(record_path) as f:
                old = json.load(f)
        except (OSError, ValueError):
            old = None
        if old == record:
            print(f"present: {out}", file=sys.stderr)
            print(out)
            return
        print(f"remaking {out}: its record {record_path} differs from this request", file=sys.stderr)

    m = Model(args.source)
    print(
        f"making {out}: {args.variant}, seed {seed}, d={m.d}, {m.n_layer} layers, "
        f"{'tied' if m.tied else 'untied'} source",
        file=sys.stderr,
    )
    tmp = f"{out}.tmp.{os.getpid()}"
    tmp_record = f"{record_path}.tmp.{os.getpid()}"
    try:
        write_gguf(m, tmp, transform(m, args.variant, seed, args.outlier_frac, lo, hi, args.outlier_jitter))
        verify(m, Model(tmp), label=out)
        with open(tmp_record, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        os.replace(tmp, out)
        os.replace(tmp_record, record_path)
    finally:
        for p in (tmp, tmp_record):
            if os.path.exists(p):
                os.remove(p)
    print(out)


if __name__ == "__main__":
    main()
