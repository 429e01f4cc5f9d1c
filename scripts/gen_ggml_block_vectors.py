#!/usr/bin/env python3
"""Writes reference vectors for kwk's GGML block dequantization tests.

For each ggml type kwk reads, a few blocks of random bytes (with finite random f16/bf16
scales where the layout has them) and the float32 values that gguf-py's independent
implementation (`gguf.quants.dequantize`, a numpy port of ggml's `dequantize_row_*`) gives
for them. Output: runners/kwk/tests/data/ggml_blocks/<TYPE>.bin (raw block bytes) and
<TYPE>.f32 (little-endian float32 values), a few KB in all.

Usage (gguf-py is only needed here, at generation time):
    pip install gguf numpy
    python3 scripts/gen_ggml_block_vectors.py
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

OUT = Path(__file__).resolve().parent.parent / "runners/kwk/tests/data/ggml_blocks"
SEED = 20261129

# Byte offsets of f16 scale fields inside one block (from ggml-common.h's block_* structs).
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
BLOCKS = {T.F32: 37, T.F16: 37, T.BF16: 37}  # plain types: odd value counts
DEFAULT_BLOCKS_32 = 5  # 160 values for 32-value blocks
DEFAULT_BLOCKS_256 = 3  # 768 values for k-quant super-blocks


def random_blocks(rng: np.random.Generator, ty: T) -> np.ndarray:
    block_size, type_size = GGML_QUANT_SIZES[ty]
    if ty == T.F32:
        return rng.normal(0, 1, BLOCKS[ty]).astype("<f4").view(np.uint8)
    if ty == T.F16:
        return rng.normal(0, 1, BLOCKS[ty]).astype("<f2").view(np.uint8)
    if ty == T.BF16:
        f = rng.normal(0, 1, BLOCKS[ty]).astype("<f4")
        return (f.view("<u4") >> 16).astype("<u2").view(np.uint8)
    n_blocks = DEFAULT_BLOCKS_256 if block_size == 256 else DEFAULT_BLOCKS_32
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in F16_FIELDS[ty]:
        # Finite scales of both signs, one of them zero, as real files have.
        scales = rng.normal(0, 0.05, n_blocks).astype("<f2")
        scales[0] = 0.0 if off == F16_FIELDS[ty][-1] else scales[0]
        raw[:, off : off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    for ty in [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K]:
        raw = random_blocks(rng, ty)
        values = dequantize(raw, ty).astype("<f4").reshape(-1)
        assert np.all(np.isfinite(values)), ty.name
        (OUT / f"{ty.name}.bin").write_bytes(raw.tobytes())
        (OUT / f"{ty.name}.f32").write_bytes(values.tobytes())
        print(f"{ty.name}: {raw.size} bytes -> {values.size} values")


if __name__ == "__main__":
    main()
