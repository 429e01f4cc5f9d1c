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

  wide         A copy whose every linear has rows (inputs) a multiple of 256, so that
               llama.cpp's k-quant and IQ types (super-blocks of 256 weights) apply to
               every tensor instead of falling back to 32-blocks (576-wide SmolLM2-135M:
               180 of 272 tensors fall back). With D = d rounded up to --multiple (256):
                 residual stream     padded with D - d zero channels, then rotated by a
                                     random orthogonal D x D matrix as in rot (so the zero
                                     channels are spread over all D and nothing is on a
                                     grid); the embedding gets zero columns before Q, the
                                     output-side matrices zero rows before Q^T
                 RMSNorm             over D channels the mean square of a padded vector is
                                     d/D of the one over d: eps is scaled by d/D in the
                                     metadata (llama.attention.layer_norm_rms_epsilon) and
                                     each norm weight g is folded into the linears reading
                                     it as g * sqrt(d/D), so x / sqrt(ms_D + eps d/D) * g
                                     sqrt(d/D) = x / sqrt(ms_d + eps) * g exactly
                 attention           head_dim kept, heads padded to D / head_dim with
                                     kv heads in the same GQA ratio (SmolLM2: 9/3 -> 12/4,
                                     attn_output's input 768): the new q, k, v rows and
                                     attn_output's new columns are zero, so the new heads
                                     add nothing; heads are appended, so every original q
                                     head keeps its kv head (h // group)
                 feed-forward        unchanged width (SmolLM2: 1536 = 6 x 256)
               The output matrix is stored untied, as in rot.

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
  scripts/make-offgrid.py SRC-F32.gguf --variant wide [--seed N] [--multiple 256]
  scripts/make-offgrid.py --verify SRC-F32.gguf OTHER.gguf   (the logits check alone)
The path of the result is printed on the last line of stdout.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import gguf_io  # noqa: E402  (scripts/lib: numpy-only GGUF reading and writing)
from copy_files import copy_path, random_orthogonal, reuse, source_identity, write_checked  # noqa: E402
from llama_ref import Model, fail, verify  # noqa: E402

# Bumped when the transform changes, so that files made by an older script are remade.
TRANSFORM_VERSION = 1
DEFAULT_SEEDS = {"rot": 1, "rot-outlier": 2, "wide": 3}
# The wide variant pads the residual stream (and attention) to a multiple of this: llama.cpp's
# k-quant and IQ types quantize rows in super-blocks of 256 weights (QK_K, ggml-common.h).
WIDE_MULTIPLE = 256

# ---------------------------------------------------------------- the transform


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


def wide_plan(m, multiple):
    """(D, n_head', n_kv') of the widened copy, or an error message."""
    width = -(-m.d // multiple) * multiple
    group = m.n_head // m.n_kv
    if m.n_head * m.head_dim != m.d or width % m.head_dim:
        return f"width {width} is not a whole number of {m.head_dim}-wide heads"
    n_head = width // m.head_dim
    if n_head % group:
        return f"{n_head} heads of {m.head_dim} do not keep the GQA ratio {group} (n_head / n_kv)"
    return width, n_head, n_head // group


def wide_meta(m, width, n_head, n_kv):
    """m's metadata with the widened hyperparameters (value types kept) and eps scaled by d/D."""
    meta = dict(m.meta)
    a = m.arch
    for key, value in (
        (f"{a}.embedding_length", width),
        (f"{a}.attention.head_count", n_head),
        (f"{a}.attention.head_count_kv", n_kv),
        (f"{a}.attention.layer_norm_rms_epsilon", float(np.float32(m.eps * m.d / width))),
    ):
        # head_count_kv may be absent (then it equals head_count): added as a u32.
        vtype = meta[key][0] if key in meta else gguf_io.U32
        meta[key] = (vtype, value)
    return meta


def wide_shapes(m, width, n_head, n_kv):
    hd = m.head_dim
    shapes = {}
    for name in list(m.order) + (["output.weight"] if m.tied else []):
        rows = m.output_matrix().shape[0] if name == "output.weight" else m.w(name).shape[0]
        if name in ("token_embd.weight", "output.weight"):
            shapes[name] = (rows, width)
        elif name.endswith("norm.weight"):
            shapes[name] = (width,)
        else:
            kind = name.split(".")[2]
            shapes[name] = {
                "attn_q": (n_head * hd, width),
                "attn_k": (n_kv * hd, width),
                "attn_v": (n_kv * hd, width),
                "attn_output": (width, n_head * hd),
                "ffn_gate": (rows, width),
                "ffn_up": (rows, width),
                "ffn_down": (width, m.w(name).shape[1]),
            }[kind]
    return shapes


def transform_wide(m, seed, width, shapes):
    """Yields the widened copy's tensors: the residual stream padded from d to D = width
    with zero channels, then rotated by a random orthogonal D x D matrix; RMSNorm's mean
    square over D channels is d/D of the one over d, so each norm weight g is folded into
    the linears as g * sqrt(d/D) (and eps scaled by d/D in the metadata); attention padded
    to D / head_dim heads with zero rows (q, k, v) and zero columns (attn_output)."""
    rng = np.random.default_rng(seed)
    q = random_orthogonal(rng, width)
    d = m.d
    fold = np.sqrt(d / width)

    def f64(name):
        return np.asarray(m.w(name), dtype=np.float64)

    def input_side(w, g, rows):
        # [W diag(g sqrt(d/D)), 0] Q, W's rows placed first among `rows`.
        p = np.zeros((rows, width))
        p[: w.shape[0], :d] = w * (g * fold)[None, :]
        return p @ q

    def out(a):
        return np.ascontiguousarray(a, dtype=np.float32)

    for name, shape in shapes.items():
        if name == "token_embd.weight":
            e = np.zeros(shape)
            e[:, :d] = f64(name)
            yield name, out(e @ q)
        elif name == "output.weight":
            w = np.asarray(m.output_matrix(), dtype=np.float64)
            yield name, out(input_side(w, f64("output_norm.weight"), shape[0]))
        elif name.endswith("norm.weight"):
            yield name, out(np.ones(width))
        else:
            layer, kind = int(name.split(".")[1]), name.split(".")[2]
            if kind in ("attn_q", "attn_k", "attn_v"):
                yield name, out(input_side(f64(name), f64(f"blk.{layer}.attn_norm.weight"), shape[0]))
            elif kind in ("ffn_gate", "ffn_up"):
                yield name, out(input_side(f64(name), f64(f"blk.{layer}.ffn_norm.weight"), shape[0]))
            else:  # attn_output, ffn_down: Q^T [W; 0] (attn_output's new head columns zero)
                w = f64(name)
                p = np.zeros(shape)
                p[:d, : w.shape[1]] = w
                yield name, out(q.T @ p)


# ---------------------------------------------------------------- writing


def write_gguf(m, path, tensors, meta=None, shapes=None):
    """Writes a GGUF with m's metadata (or `meta`) and the float32 tensors streamed from the
    iterator, shaped as m's (or as `shapes`; output.weight appended when m is tied)."""
    if shapes is None:
        shapes = {n: tuple(m.w(n).shape) for n in m.order}
        if m.tied:
            shapes["output.weight"] = tuple(m.output_matrix().shape)
    gguf_io.write(path, m.meta if meta is None else meta, shapes, tensors, m.version, m.alignment)


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
    ap.add_argument("--seed", type=int, help="seed of Q and the scales (default: rot 1, rot-outlier 2, wide 3)")
    ap.add_argument("--name", help="output name without -F32.gguf (default <source>-offgrid-<variant>)")
    ap.add_argument("--outlier-frac", type=float, default=0.03, help="fraction of outlier channels (0.03)")
    ap.add_argument("--outlier-spread", default="6:12", help="outlier scale range LO:HI, log-uniform (6:12)")
    ap.add_argument("--outlier-jitter", type=float, default=0.1, help="log-normal sigma of the other channels (0.1)")
    ap.add_argument(
        "--multiple", type=int, default=WIDE_MULTIPLE, help=f"wide: pad the width to a multiple of this ({WIDE_MULTIPLE})"
    )
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
        fail("--variant rot, rot-outlier or wide is required")
    if args.multiple < 1:
        fail(f"--multiple {args.multiple}: need >= 1")
    if not os.path.isfile(args.source):
        fail(f"{args.source} not found; scripts/setup-model.sh makes the F32 GGUF")
    if not (0.0 <= args.outlier_frac < 1.0):
        fail(f"--outlier-frac {args.outlier_frac}: need 0 <= F < 1")
    if args.outlier_jitter < 0:
        fail(f"--outlier-jitter {args.outlier_jitter}: need >= 0")
    lo, hi = parse_spread(args.outlier_spread)
    seed = DEFAULT_SEEDS[args.variant] if args.seed is None else args.seed

    out = copy_path(args.source, args.name, f"-offgrid-{args.variant}")
    record = {"transform_version": TRANSFORM_VERSION, "variant": args.variant, "seed": seed, **source_identity(args.source)}
    if args.variant == "rot-outlier":
        record.update(outlier_frac=args.outlier_frac, outlier_spread=[lo, hi], outlier_jitter=args.outlier_jitter)
    if args.variant == "wide":
        record.update(multiple=args.multiple)
    if reuse(out, record):
        print(out)
        return

    m = Model(args.source)
    if args.variant == "wide":
        plan = wide_plan(m, args.multiple)
        if isinstance(plan, str):
            fail(f"{args.source}: cannot widen d={m.d} to a multiple of {args.multiple}: {plan}")
        width, n_head, n_kv = plan
        shapes = wide_shapes(m, width, n_head, n_kv)
        meta = wide_meta(m, width, n_head, n_kv)
        tensors = transform_wide(m, seed, width, shapes)
        how = f"d {m.d} -> {width}, heads {m.n_head}/{m.n_kv} -> {n_head}/{n_kv}"
    else:
        shapes = meta = None
        tensors = transform(m, args.variant, seed, args.outlier_frac, lo, hi, args.outlier_jitter)
        how = f"d={m.d}"
    print(
        f"making {out}: {args.variant}, seed {seed}, {how}, {m.n_layer} layers, "
        f"{'tied' if m.tied else 'untied'} source",
        file=sys.stderr,
    )
    write_checked(
        out,
        record,
        lambda tmp: write_gguf(m, tmp, tensors, meta=meta, shapes=shapes),
        lambda tmp: verify(m, Model(tmp), label=out),
    )
    print(out)


if __name__ == "__main__":
    main()
