#!/usr/bin/env bash
# The standalone C twin of kwk's roofline peaks (benches/peaks/peaks.c): builds it with the
# system C compiler and prints fp32 / int8 / bf16 / read peaks, to compare with
# `cargo run --release -p kwk --example peaks -- THREADS` and the machine section of a
# kwk-eval report.
# Usage: scripts/peaks-microbench.sh [amx|vnni|avx512bw|avxvnni|avx2|sse2] [THREADS] [MIB]  (sse2 = the scalar tier on x86-64)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${CARGO_TARGET_DIR:-target}/peaks-microbench"
mkdir -p "$(dirname "$out")"
cc -O2 -march=native -pthread -o "$out" benches/peaks/peaks.c
exec "$out" "$@"
