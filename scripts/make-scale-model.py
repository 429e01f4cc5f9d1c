#!/usr/bin/env python3
"""Writes a random-weight BF16 GGUF with the exact shapes of SmolLM2-1.7B, for speed,
load-time and memory measurements at a size users actually run.

Shapes (SmolLM2-1.7B's config.json): hidden 2048, 24 layers, 32 heads, 32 KV heads (head
dim 64), FFN 8192, vocabulary 49152, tied embeddings, rope theta 130000, RMS eps 1e-5,
context 8192; 1,711,376,384 parameters, 3.42 GB of BF16 tensor data.

The tokenizer is SmolLM2-135M's (same vocabulary): every `tokenizer.*` metadata entry is
copied byte for byte from a SmolLM2-135M GGUF (default: the first
~/.cache/kwk/models/SmolLM2-135M-Instruct/*BF16*.gguf, else any *.gguf there). The other
metadata is written here.

Weights: each linear and the embedding are independent N(0, 0.02^2) draws rounded to
bfloat16 (round to nearest even), norms are 1 (stored F32, as llama.cpp's converter does);
tensor i draws from numpy's PCG64 `default_rng([seed, i])`, so the file is the same on
every machine and numpy version. Its perplexity is meaningless: never report it as quality.

Output: ~/.cache/kwk/models/SmolLM2-1.7B-shape-random/SmolLM2-1.7B-shape-random-BF16.gguf
(or --out), written under a temporary name and renamed when complete; an existing file of
the expected size is kept (the script is idempotent; --force rewrites it). Needs numpy and
about 3.5 GB of free disk; memory stays under ~0.5 GB (one tensor at a time).

Usage: scripts/make-scale-model.py [--tokenizer-from FILE.gguf] [--out FILE] [--seed N] [--force]
"""

import argparse
import glob
import os
import shutil
import struct
import sys

try:
    import numpy as np
except ImportError:
    sys.exit("make-scale-model.py needs numpy: pip install numpy")

D, LAYERS, HEADS, KV_HEADS, FFN, VOCAB = 2048, 24, 32, 32, 8192, 49152
HEAD_DIM = D // HEADS
CONTEXT, ROPE_THETA, RMS_EPS = 8192, 130000.0, 1e-5
ALIGN = 32
GGML_F32, GGML_BF16 = 0, 30

# GGUF value types.
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
SCALAR_SIZE = {T_U8: 1, T_I8: 1, T_U16: 2, T_I16: 2, T_U32: 4, T_I32: 4, T_F32: 4, T_BOOL: 1,
               T_U64: 8, T_I64: 8, T_F64: 8}


def skip_value(buf, at, vtype):
    """Offset just past a value of `vtype` starting at `at`."""
    if vtype in SCALAR_SIZE:
        return at + SCALAR_SIZE[vtype]
    if vtype == T_STR:
        (n,) = struct.unpack_from("<Q", buf, at)
        return at + 8 + n
    if vtype == T_ARR:
        etype, n = struct.unpack_from("<IQ", buf, at)
        at += 12
        if etype in SCALAR_SIZE:
            return at + n * SCALAR_SIZE[etype]
        for _ in range(n):
            at = skip_value(buf, at, etype)
        return at
    raise ValueError(f"unknown GGUF value type {vtype}")


def read_kvs(path):
    """The metadata of a GGUF file as (key, raw bytes of type + value) pairs."""
    with open(path, "rb") as f:
        head = f.read(24)
        if head[:4] != b"GGUF":
            sys.exit(f"{path} is not a GGUF file (bad magic)")
        version, _n_tensors, n_kv = struct.unpack_from("<IQQ", head, 4)
        if version != 3:
            sys.exit(f"{path}: GGUF version {version}, this script reads version 3")
        size = 1 << 20
        while True:
            f.seek(0)
            buf = f.read(size)
            try:
                at, out = 24, []
                for _ in range(n_kv):
                    (n,) = struct.unpack_from("<Q", buf, at)
                    key = buf[at + 8:at + 8 + n].decode()
                    at += 8 + n
                    (vtype,) = struct.unpack_from("<I", buf, at)
                    end = skip_value(buf, at + 4, vtype)
                    if end > len(buf):
                        raise struct.error("past the buffer")
                    out.append((key, buf[at:end]))
                    at = end
                return out
            except struct.error:
                if len(buf) < size:
                    sys.exit(f"{path}: truncated metadata")
                size *= 4


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    raw = {T_U32: "<I", T_F32: "<f"}
    if vtype == T_STR:
        body = gguf_str(value)
    else:
        body = struct.pack(raw[vtype], value)
    return key, struct.pack("<I", vtype) + body


def tensors():
    """(name, ggml dims (innermost first), ggml type) in llama.cpp's order."""
    out = [("token_embd.weight", [D, VOCAB], GGML_BF16)]
    for i in range(LAYERS):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", [D], GGML_F32),
            (b + "attn_q.weight", [D, HEADS * HEAD_DIM], GGML_BF16),
            (b + "attn_k.weight", [D, KV_HEADS * HEAD_DIM], GGML_BF16),
            (b + "attn_v.weight", [D, KV_HEADS * HEAD_DIM], GGML_BF16),
            (b + "attn_output.weight", [HEADS * HEAD_DIM, D], GGML_BF16),
            (b + "ffn_norm.weight", [D], GGML_F32),
            (b + "ffn_gate.weight", [D, FFN], GGML_BF16),
            (b + "ffn_up.weight", [D, FFN], GGML_BF16),
            (b + "ffn_down.weight", [FFN, D], GGML_BF16),
        ]
    out.append(("output_norm.weight", [D], GGML_F32))
    return out


def nbytes(dims, ttype):
    n = 1
    for d in dims:
        n *= d
    return n * (4 if ttype == GGML_F32 else 2)


def pad_to(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def data(index, name, dims, ttype, seed):
    n = 1
    for d in dims:
        n *= d
    if ttype == GGML_F32:
        return np.ones(n, dtype="<f4").tobytes()
    rng = np.random.default_rng([seed, index])
    out = np.empty(n, dtype="<u2")
    step = 1 << 24
    for s in range(0, n, step):
        x = rng.standard_normal(min(step, n - s), dtype=np.float32) * np.float32(0.02)
        u = x.view(np.uint32)
        # bfloat16 round to nearest even.
        out[s:s + len(x)] = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return out.tobytes()


def main():
    # docs/paths.md: KWK_MODELS_DIR, else $KWK_CACHE/models, else
    # ${XDG_CACHE_HOME:-~/.cache}/kwk/models (as scripts/setup-model.sh).
    cache = (os.environ.get("KWK_CACHE")
             or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                             "kwk"))
    default_dir = os.environ.get("KWK_MODELS_DIR") or os.path.join(cache, "models")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer-from", help="a SmolLM2-135M GGUF whose tokenizer metadata is copied")
    ap.add_argument("--out", default=os.path.join(
        default_dir, "SmolLM2-1.7B-shape-random", "SmolLM2-1.7B-shape-random-BF16.gguf"))
    ap.add_argument("--seed", type=int, default=1717)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()

    src = args.tokenizer_from
    if src is None:
        found = sorted(glob.glob(os.path.join(default_dir, "SmolLM2-135M-Instruct", "*BF16*.gguf")))
        found = found or sorted(glob.glob(os.path.join(default_dir, "SmolLM2-135M-Instruct", "*.gguf")))
        if not found:
            sys.exit(f"no SmolLM2-135M GGUF in {default_dir}/SmolLM2-135M-Instruct "
                     "(run scripts/setup-model.sh, or pass --tokenizer-from FILE.gguf)")
        src = found[0]
    tok = [(k, v) for k, v in read_kvs(src) if k.startswith("tokenizer.")]
    if not any(k == "tokenizer.ggml.tokens" for k, _ in tok):
        sys.exit(f"{src} has no tokenizer.ggml.tokens metadata; pass a SmolLM2-135M GGUF")

    meta = [
        kv("general.architecture", T_STR, "llama"),
        kv("general.name", T_STR, "SmolLM2-1.7B-shape-random (random weights, not a language model)"),
        kv("general.alignment", T_U32, ALIGN),
        kv("general.file_type", T_U32, 32),  # LLAMA_FTYPE_MOSTLY_BF16
        kv("llama.block_count", T_U32, LAYERS),
        kv("llama.context_length", T_U32, CONTEXT),
        kv("llama.embedding_length", T_U32, D),
        kv("llama.feed_forward_length", T_U32, FFN),
        kv("llama.attention.head_count", T_U32, HEADS),
        kv("llama.attention.head_count_kv", T_U32, KV_HEADS),
        kv("llama.rope.freq_base", T_F32, ROPE_THETA),
        kv("llama.attention.layer_norm_rms_epsilon", T_F32, RMS_EPS),
        kv("llama.rope.dimension_count", T_U32, HEAD_DIM),
        kv("llama.vocab_size", T_U32, VOCAB),
    ] + tok

    specs = tensors()
    header = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(specs), len(meta)))
    for k, raw in meta:
        header += gguf_str(k) + raw
    offset = 0
    for name, dims, ttype in specs:
        header += gguf_str(name) + struct.pack("<I", len(dims))
        header += b"".join(struct.pack("<Q", d) for d in dims)
        header += struct.pack("<IQ", ttype, offset)
        offset = pad_to(offset + nbytes(dims, ttype))
    header += b"\0" * (pad_to(len(header)) - len(header))
    total = len(header) + offset

    if os.path.exists(args.out) and os.path.getsize(args.out) == total and not args.force:
        print(f"{args.out} exists ({total} bytes); kept (--force rewrites it)")
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(args.out))).free
    if free < total + (256 << 20):
        sys.exit(f"{total / 1e9:.2f} GB needed for {args.out}, {free / 1e9:.2f} GB free")
    tmp = f"{args.out}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            for i, (name, dims, ttype) in enumerate(specs):
                blob = data(i, name, dims, ttype, args.seed)
                f.write(blob)
                f.write(b"\0" * (pad_to(len(blob)) - len(blob)))
                print(f"\r{i + 1}/{len(specs)} tensors", end="", file=sys.stderr, flush=True)
            f.flush()
            os.fsync(f.fileno())
        print(file=sys.stderr)
        if os.path.getsize(tmp) != total:
            sys.exit(f"{tmp}: wrote {os.path.getsize(tmp)} bytes, expected {total}")
        os.replace(tmp, args.out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    n_params = sum(int(np.prod(d)) for _, d, _ in specs)
    print(f"wrote {args.out}: {n_params} parameters, {total} bytes (tokenizer from {src})")


if __name__ == "__main__":
    main()
