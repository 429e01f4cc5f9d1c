#!/usr/bin/env python3
"""Makes an off-grid copy of a float32 Gemma 3 GGUF: function-preserving moves for every
linear layer, and a dither of the embedding table one Q8_0 step wide.

Gemma 3 270M installs as its published Q4_K_M file, so the F32 GGUF scripts/setup-gemma.sh
derives from it holds weights on Q4_K, Q5_0, Q6_K and Q8_0 grids: llama.cpp's types re-land
on them (Q4_K_M loses nothing by construction) and a quantizer that copies the source's grid
looks as good as the file it was made from. scripts/make-offgrid.py takes SmolLM2 off its grid
by rotating the residual stream; Gemma's norms after attention and after the FFN forbid that
(a rotation Q passes through x -> g * x / rms(x) only if it commutes with diag(g)). What does
keep Gemma's function, each drawn from the seed, per layer:

  fold         a random per-channel factor t (log-normal, sigma --fold-sigma) moved from
               each pre-norm's weight into the columns of the linears that read it:
               attn_norm g <- g / t and attn_q/k/v W <- W diag(t); ffn_norm likewise with
               ffn_gate/up. RMSNorm's weight acts after the normalisation, so this is exact.
  v/o rotation each KV head's value channels rotated by a Haar-random orthogonal R
               (head_dim x head_dim): attn_v rows R W_v, and for every query head of its
               group attn_output's columns W_o R^T. The attention weights mix positions, not
               channels, so o = R (P V) and W_o R^T R = W_o.
  ffn scale    a random factor s (log-normal, --ffn-sigma) per FFN channel: ffn_up row i
               times s_i, ffn_down column i divided by s_i (GeGLU is linear in up).

Every linear then holds products of grid values and non-grid factors that differ within
each quantization block (a fold changes each column, a rotation mixes rows), so no grid is
left in any of them. Two things have no exact move: the embedding (read through
sqrt(d) into the residual stream, where a per-channel factor would not pass the pre-norms,
and tied to the output) and the norms (kept float32 by every engine). The embedding gets a
dither instead: uniform noise of +-DITHER/2 of its own Q8_0 step (the block's max |w| / 127,
blocks of 32 along a row; --dither, default 1, a whole step wide, so each weight's place in
its grid cell is random). That moves the function as much as rounding the table to Q8_0
would: the check prints the KLD it costs on seeded random tokens (0.008 on Gemma 3 270M,
where those tokens make every difference larger than on text), and the record keeps it;
kwk-eval's float32 perplexity of the copy against the source's says what it costs on text.

Output: <name>-F32.gguf beside the source (name defaults to the source's name without -F32
plus -offgrid-s<seed>), written under a temporary name, checked, then renamed, with
<name>-F32.gguf.json recording the parameters; a file whose record matches is reused.

Check: a float64 numpy Gemma 3 forward (scripts/lib/gemma_ref.py) of the source and of the
copy before the dither on the same seeded tokens must agree within float32 rounding (the
bounds of scripts/lib/llama_ref.py); the dithered copy's KLD from the source must stay under
MAX_DITHER_KLD. Otherwise nothing is written and the exit status is 1.

Usage:
  scripts/make-offgrid-gemma.py SRC-F32.gguf [--seed N] [--name NAME] [--fold-sigma S]
      [--ffn-sigma S] [--dither D]
  scripts/make-offgrid-gemma.py --verify SRC-F32.gguf OTHER.gguf   (the exact logits check)
The path of the result is printed on the last line of stdout.
"""
import argparse
import copy
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import gguf_io  # noqa: E402  (scripts/lib: numpy-only GGUF reading and writing)
from copy_files import copy_path, random_orthogonal, reuse, source_identity, write_checked  # noqa: E402
from gemma_ref import GemmaModel, forward  # noqa: E402
from llama_ref import MAX_KLD, MAX_LOGIT_DIFF, as_f64, compare_logits, fail, seeded_tokens  # noqa: E402

# Bumped when the transform changes, so that files made by an older script are remade.
TRANSFORM_VERSION = 1
DEFAULT_SEED = 5
# Q8_0's block (ggml-common.h QK8_0) and code range: the dither's step is the block's max |w| / 127.
Q8_BLOCK = 32
# A dithered table whose KLD from the source (seeded random tokens) exceeds this is refused:
# a whole Q8_0 step of noise measured 0.008 on Gemma 3 270M; a table the dither broke would
# be far beyond.
MAX_DITHER_KLD = 0.05


def log_normal(rng, n, sigma):
    return np.exp(sigma * rng.standard_normal(n))


def dither_table(rng, e, width):
    """e plus uniform noise of `width` Q8_0 steps (per block of 32 along each row; a row
    whose length is not a multiple of 32 ends in a shorter block, padded with zeros that
    change no block's max |w| and are dropped)."""
    rows, cols = e.shape
    pad = -cols % Q8_BLOCK
    blocks = np.pad(np.asarray(e, dtype=np.float64), ((0, 0), (0, pad))).reshape(rows, -1, Q8_BLOCK)
    step = np.abs(blocks).max(axis=2, keepdims=True) / 127.0
    blocks += (rng.random(blocks.shape) - 0.5) * width * step
    return blocks.reshape(rows, -1)[:, :cols]


def transform(m, seed, fold_sigma, ffn_sigma):
    """The exact part: {name: float32 array} for every tensor (the table untouched)."""
    rng = np.random.default_rng(seed)
    out = {}
    hd, group = m.head_dim, m.n_head // m.n_kv

    def w(name):
        return as_f64(m, name)

    for i in range(m.n_layer):
        p = f"blk.{i}."
        t_attn = log_normal(rng, m.d, fold_sigma)
        t_ffn = log_normal(rng, m.d, fold_sigma)
        rots = [random_orthogonal(rng, hd) for _ in range(m.n_kv)]
        s = log_normal(rng, m.w(p + "ffn_up.weight").shape[0], ffn_sigma)
        out[p + "attn_norm.weight"] = w(p + "attn_norm.weight") / t_attn
        for n in ("attn_q", "attn_k"):
            out[p + n + ".weight"] = w(p + n + ".weight") * t_attn[None, :]
        v = w(p + "attn_v.weight") * t_attn[None, :]
        o = w(p + "attn_output.weight").copy()
        for g, r in enumerate(rots):
            v[g * hd : (g + 1) * hd] = r @ v[g * hd : (g + 1) * hd]
            for h in range(g * group, (g + 1) * group):
                o[:, h * hd : (h + 1) * hd] = o[:, h * hd : (h + 1) * hd] @ r.T
        out[p + "attn_v.weight"], out[p + "attn_output.weight"] = v, o
        out[p + "ffn_norm.weight"] = w(p + "ffn_norm.weight") / t_ffn
        out[p + "ffn_gate.weight"] = w(p + "ffn_gate.weight") * t_ffn[None, :]
        out[p + "ffn_up.weight"] = w(p + "ffn_up.weight") * t_ffn[None, :] * s[:, None]
        out[p + "ffn_down.weight"] = w(p + "ffn_down.weight") / s[None, :]
    for n in m.order:
        if n not in out:
            out[n] = m.w(n)
    return {n: np.asarray(a, dtype=np.float32) for n, a in out.items()}, rng


def with_tensors(m, tensors):
    """A view of `m` holding `tensors` instead (for the forward pass)."""
    view = copy.copy(m)
    view.tensors = tensors
    return view


def check(src, new, label, exact, n_tokens=32, seed=0):
    tokens = seeded_tokens(src.vocab(), n_tokens, seed)
    diff, kld, top1, spread = compare_logits(forward(src, tokens), forward(new, tokens))
    what = "exact part" if exact else "with the dithered table"
    print(
        f"logits check, {what} ({n_tokens} seeded tokens, float64 forward): max |diff| {diff:.3g} "
        f"(logit range {spread:.3g}), mean KLD {kld:.3g}, top-1 agreement {top1:.3f}",
        file=sys.stderr,
    )
    if exact and not (diff <= MAX_LOGIT_DIFF and kld <= MAX_KLD):
        fail(
            f"{label} does not compute the same function as {src.path} (max |logit diff| "
            f"{diff:.3g} > {MAX_LOGIT_DIFF} or KLD {kld:.3g} > {MAX_KLD})"
        )
    if not exact and not kld <= MAX_DITHER_KLD:
        fail(f"{label}: the dithered table moves the logits by KLD {kld:.3g} > {MAX_DITHER_KLD}; use a smaller --dither")
    return kld


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="the float32 Gemma 3 GGUF (e.g. gemma-3-270m-F32.gguf)")
    ap.add_argument("other", nargs="?", help="with --verify: the file to compare with the source")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"seed of every factor (default {DEFAULT_SEED})")
    ap.add_argument("--name", help="output name without -F32.gguf (default <source>-offgrid-s<seed>)")
    ap.add_argument("--fold-sigma", type=float, default=0.3, help="log-normal sigma of the pre-norm folds (0.3)")
    ap.add_argument("--ffn-sigma", type=float, default=0.3, help="log-normal sigma of the FFN channel scales (0.3)")
    ap.add_argument("--dither", type=float, default=1.0, help="embedding dither width in Q8_0 steps (1; 0 = none)")
    ap.add_argument("--verify", action="store_true", help="only compare the logits of source and other")
    args = ap.parse_args()

    if args.verify:
        if not args.other:
            fail("--verify needs two files: SOURCE OTHER")
        src, other = GemmaModel(args.source), GemmaModel(args.other)
        check(src, other, args.other, exact=True)
        return
    if args.other:
        fail(f"unexpected argument '{args.other}' (two files only with --verify)")
    if not os.path.isfile(args.source):
        fail(f"{args.source} not found; scripts/setup-gemma.sh makes the F32 GGUF")
    for flag, v in (("--fold-sigma", args.fold_sigma), ("--ffn-sigma", args.ffn_sigma), ("--dither", args.dither)):
        if not (0.0 <= v <= 4.0):
            fail(f"{flag} {v}: need 0 <= value <= 4")
    if args.seed < 0:
        fail(f"--seed {args.seed}: need a non-negative integer")

    out = copy_path(args.source, args.name, f"-offgrid-s{args.seed}")
    record = {
        "transform_version": TRANSFORM_VERSION,
        "seed": args.seed,
        "fold_sigma": args.fold_sigma,
        "ffn_sigma": args.ffn_sigma,
        "dither": args.dither,
        **source_identity(args.source),
    }
    if reuse(out, record, measured=("dither_kld",)):
        print(out)
        return

    m = GemmaModel(args.source)
    print(
        f"making {out}: seed {args.seed}, fold sigma {args.fold_sigma}, ffn sigma {args.ffn_sigma}, "
        f"dither {args.dither} Q8_0 steps, {m.n_layer} layers, d {m.d}",
        file=sys.stderr,
    )
    tensors, rng = transform(m, args.seed, args.fold_sigma, args.ffn_sigma)
    check(m, with_tensors(m, tensors), out, exact=True)
    if args.dither > 0:
        table = "token_embd.weight"
        tensors[table] = dither_table(rng, m.w(table), args.dither).astype(np.float32)
        record["dither_kld"] = check(m, with_tensors(m, tensors), out, exact=False)
    shapes = {n: tuple(m.w(n).shape) for n in m.order}
    write_checked(
        out, record, lambda tmp: gguf_io.write(tmp, m.meta, shapes, ((n, tensors[n]) for n in m.order), m.version, m.alignment)
    )
    print(out)


if __name__ == "__main__":
    main()
