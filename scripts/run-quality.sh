#!/usr/bin/env bash
# The quality comparison of issue 7's protocol on one float32 GGUF: kwk's float32, int8 and
# int4 formats (plain, calibrated, GPTQ) beside llama.cpp's Q8_0, Q4_K_M, Q4_K_M with an
# importance matrix, Q4_1 and Q4_0 made from the same file, 40 chunks of wikitext-2 test,
# KL divergence and top-1 against kwk float32 for every row, no speed.
#
#   scripts/run-quality.sh STEM [kwk-eval arguments...]
#
# STEM is the float32 file without `-F32.gguf`; the quantized siblings STEM-Q8_0.gguf,
# STEM-Q4_K_M.gguf, STEM-Q4_K_M-imatrix.gguf, STEM-Q4_1.gguf and STEM-Q4_0.gguf are used
# when present (scripts/setup-offgrid.sh and scripts/make-heldout.sh make them). The
# calibration text is the last 120,000 bytes of wiki.test.raw, which a 40-chunk run never
# scores (kwk-eval refuses a calibration text that overlaps the scored windows).
# Environment: KWK_FORMATS (default float32,int8,int4,int4:calib,int4:gptq), KWK_CHUNKS
# (default 40), KWK_THREADS (default all cores), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

stem="${1:?usage: scripts/run-quality.sh STEM [kwk-eval arguments...] (STEM-F32.gguf must exist)}"
shift
f32="$stem-F32.gguf"
case "$(basename "$stem")" in
  # The two standard off-grid copies are made (once, then cached) when a run asks for them.
  SmolLM2-135M-Instruct-offgrid-rot | SmolLM2-135M-Instruct-offgrid-rot-outlier | SmolLM2-135M-Instruct-offgrid-wide)
    [ -f "$f32" ] || bash scripts/setup-offgrid.sh >/dev/null ;;
esac
[ -f "$f32" ] || { echo "error: $f32 not found; make it with scripts/setup-model.sh, scripts/setup-offgrid.sh or scripts/setup-offgrid.sh --heldout SEED" >&2; exit 2; }

LLAMA_BIN="$(bash scripts/setup-llama-cpp.sh | tail -n 1)"
CACHE="${KWK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kwk}"
calib="$CACHE/calib/wiki-test-tail-120k.txt"
if [ ! -f "$calib" ]; then
  mkdir -p "$(dirname "$calib")"
  tail -c 120000 datasets/wikitext-2-raw/wiki.test.raw > "$calib.tmp" && mv "$calib.tmp" "$calib"
fi

ggufs=()
for t in Q8_0 Q4_K_M Q4_K_M-imatrix Q4_1 Q4_0; do
  if [ -f "$stem-$t.gguf" ]; then
    ggufs+=(--gguf "$stem-$t.gguf")
  else
    echo "note: $stem-$t.gguf not found; its row is skipped" >&2
  fi
done

cargo build --release --bin kwk-eval
exec "${CARGO_TARGET_DIR:-target}/release/kwk-eval" \
  --llm "$f32" \
  --text datasets/wikitext-2-raw/wiki.test.raw \
  --chunks "${KWK_CHUNKS:-40}" \
  --threads "${KWK_THREADS:-$(nproc)}" \
  --formats "${KWK_FORMATS:-float32,int8,int4,int4:calib,int4:gptq}" \
  --calib-text "$calib" \
  --llama-cpp-dir "$LLAMA_BIN" --no-speed \
  "${ggufs[@]}" \
  "$@"
