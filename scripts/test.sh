#!/usr/bin/env bash
# The test command: installs what the tests need (llama.cpp's tools, the SmolLM2-135M test
# model), then runs formatting, lints and the whole test suite. Idempotent; the first run
# builds llama.cpp (several minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

# A clean build of everything below takes about 7 GB under the target folder; a full disk
# shows up as a linker killed by SIGBUS, so say it plainly first.
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
mkdir -p "$TARGET_DIR"
FREE_GB="$(df -P -k "$TARGET_DIR" | awk 'NR == 2 { printf "%d", $4 / 1048576 }')"
if [ "${FREE_GB:-0}" -lt 10 ]; then
    echo "test.sh: warning: only ${FREE_GB} GB free where $TARGET_DIR is; a clean build needs about 7 GB (free space, or set CARGO_TARGET_DIR elsewhere)" >&2
fi

LLAMA_BIN="$(bash scripts/setup-llama-cpp.sh | tail -n 1)"
export KWK_LLAMA_CPP_DIR="$LLAMA_BIN"
# The tests need the model, not its off-grid copies (scripts/setup-offgrid.sh).
KWK_OFFGRID=0 bash scripts/setup-model.sh >/dev/null
# The python for llama.cpp's convert_hf_to_gguf.py (torch, transformers, sentencepiece; the
# venv test-python.sh uses too), which kwk-eval's ladder and the model-folder tests run.
KWK_PYTHON="${KWK_PYTHON:-$(bash scripts/setup-convert.sh | tail -n 1)}"
export KWK_PYTHON

# A single-node Slurm for tests/cli_sweep.rs's job-array test (about 30 s the first time,
# nothing once running): started where Debian's packages install (root, apt-get), and the
# test then must run (KWK_SLURM=1). Elsewhere, or with KWK_SLURM=0, it is skipped, loudly.
if [ "${KWK_SLURM:-}" = 0 ]; then
    echo "slurm: SKIPPED (KWK_SLURM=0): the sweep's Slurm test will be skipped"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && bash scripts/setup-slurm.sh; then
    export KWK_SLURM=1
else
    echo "slurm: SKIPPED (not root with apt-get, or scripts/setup-slurm.sh failed above): the sweep's Slurm test will be skipped"
fi

# ik_llama.cpp for tests/cli_peer.rs's ik ladder test: built with KWK_IK=1 (15-30 min on 2
# cores, then cached), used when an earlier set-up left a build, and otherwise skipped, loudly.
IK_BIN="$(ls -d "${KWK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kwk}"/ik_llama.cpp-*/build/bin 2>/dev/null | tail -n 1 || true)"
if [ "${KWK_IK:-}" = 1 ]; then
    KWK_IK_LLAMA_CPP_DIR="$(bash scripts/setup-ik-llama-cpp.sh | tail -n 1)"
    export KWK_IK_LLAMA_CPP_DIR
elif [ -n "$IK_BIN" ] && [ -f "$IK_BIN/../../.build-complete" ]; then
    export KWK_IK=1 KWK_IK_LLAMA_CPP_DIR="$IK_BIN"
else
    echo "ik_llama.cpp: SKIPPED (no build; KWK_IK=1 scripts/test.sh builds it): the ik ladder test will be skipped"
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace

# The Python package (python/): builds the wheel and runs its tests against transformers.
bash scripts/test-python.sh
