#!/usr/bin/env bash
# One-thread throughput of the AVX2 integer dot recipes against the float32 FMA
# (benches/opmix/opmix.c): the measurement behind the choice of recipe per code width in
# runners/kwk/src/kernels/x86_64/quant256.rs. Needs an AVX2 + FMA CPU and a C compiler.
# Usage: scripts/opmix-microbench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! grep -qw avx2 /proc/cpuinfo 2>/dev/null || ! grep -qw fma /proc/cpuinfo 2>/dev/null; then
  echo "opmix-microbench: this CPU lacks AVX2 or FMA (see /proc/cpuinfo); the recipes it times need both" >&2
  exit 2
fi
out="${CARGO_TARGET_DIR:-target}/opmix-microbench"
mkdir -p "$(dirname "$out")"
cc -O2 -mavx2 -mfma -o "$out" benches/opmix/opmix.c
exec "$out"
