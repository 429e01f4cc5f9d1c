#!/usr/bin/env bash
# Makes the off-grid copies of the test model and llama.cpp's quantizations of each.
# Called at the end of scripts/setup-model.sh (which makes the float32 GGUF they come from);
# idempotent: files already made with the same parameters are reused.
#
#   scripts/setup-offgrid.sh            # prints the model directory on the last line
#   scripts/setup-offgrid.sh --heldout SEED [FRACTION] [LO:HI]
#                                       # one more rot-outlier copy, NAME-heldout-sSEED-*.gguf,
#                                       # with its own seed, outlier fraction and spread
#   scripts/setup-offgrid.sh --wide-seed SEED
#                                       # one more widened copy, NAME-offgrid-wide-sSEED-*.gguf
#                                       # and its -hf folder, rotated with another seed
#                                       # (docs/quality.md's second copy is seed 11)
#   scripts/setup-offgrid.sh --gemma [SEED]
#                                       # the off-grid copy of Gemma 3 270M (default seed 5),
#                                       # gemma-3-270m-offgrid-sSEED-F32.gguf beside its F32
#                                       # (scripts/make-offgrid-gemma.py; kwk-eval's ladder
#                                       # makes llama.cpp's types from it); prints its path
#
# Why: SmolLM2-135M-Instruct ships as Q4_1, so its float32 file has every weight on a 4-bit
# grid of 32-weight groups, which flatters any 4-bit format with the same groups. The copies
# compute the same function (float32 perplexity equal within 1e-4) with no weight on a grid;
# scripts/make-offgrid.py describes the transforms and checks each copy's logits:
#   SmolLM2-135M-Instruct-offgrid-rot-F32.gguf           residual stream rotated by a seeded
#                                                        random orthogonal matrix, RMSNorm
#                                                        weights folded in (seed 1)
#   SmolLM2-135M-Instruct-offgrid-rot-outlier-F32.gguf   the same kind of rotation (seed 2)
#                                                        plus heavy-tailed per-channel scales:
#                                                        3% of the channels into every linear
#                                                        carry 6-12x larger activations
#   SmolLM2-135M-Instruct-offgrid-wide-F32.gguf          widened so that llama.cpp's k-quant
#                                                        and IQ types apply to every tensor
#                                                        (their rows are super-blocks of 256;
#                                                        576 is not a multiple): residual
#                                                        stream zero-padded 576 -> 768, heads
#                                                        9/3 -> 12/4 (new heads zero), norms
#                                                        folded with their d/D mean-square
#                                                        change, then rotated as rot (seed 3)
#   SmolLM2-135M-Instruct-offgrid-wide-hf/               the wide copy as a Hugging Face
#                                                        folder (scripts/make-hf-folder.py)
#   ...-offgrid-{rot,rot-outlier,wide}-{Q8_0,Q4_K_M,Q4_1,Q4_0}.gguf   llama-quantize of each F32
#   ...-offgrid-{rot,rot-outlier,wide}-Q4_K_M-imatrix.gguf   Q4_K_M with llama-imatrix's importance
#                                                        matrix from the calibration text
#   $KWK_CACHE/calib/wiki-test-tail-120k.txt             that text: the last 120,000 bytes of
#                                                        wiki.test.raw, disjoint from the
#                                                        chunks a 40-chunk run scores; pass
#                                                        it to kwk-eval as --calib-text
# A quantized file older than its F32 copy is remade.
#
# scripts/setup-model.sh runs this only with KWK_OFFGRID=1 (the main job and the tests do not
# need the copies; about 30 minutes and 3.5 GB on 2 busy cores); run it directly, or through
# scripts/run-quality.sh and check-offgrid.sh, which need them. KWK_OFFGRID=0 skips it.
set -euo pipefail

NAME="SmolLM2-135M-Instruct"
VARIANTS=(rot rot-outlier wide)
DERIVED_TYPES=(Q8_0 Q4_K_M Q4_1 Q4_0)

CACHE="${KWK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kwk}"
MODELS="${KWK_MODELS_DIR:-$CACHE/models}"
DIR="$MODELS/$NAME"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/numpy-python.sh
. "$HERE/lib/numpy-python.sh"

if [ "${KWK_OFFGRID:-1}" = "0" ]; then
  echo "KWK_OFFGRID=0: off-grid copies skipped" >&2
  echo "$DIR"
  exit 0
fi

PY="$(kwk_numpy_python)"

if [ "${1:-}" = "--gemma" ]; then
  seed="${2:-5}"
  case "$seed" in
    ''|*[!0-9]*) echo "error: --gemma takes a seed, a non-negative integer (got '$seed'); usage: scripts/setup-offgrid.sh --gemma [SEED]" >&2; exit 2 ;;
  esac
  GEMMA_F32="$MODELS/gemma-3-270m/gemma-3-270m-F32.gguf"
  [ -f "$GEMMA_F32" ] || { echo "error: $GEMMA_F32 not found; run scripts/setup-gemma.sh first" >&2; exit 1; }
  "$PY" "$HERE/make-offgrid-gemma.py" "$GEMMA_F32" --seed "$seed" | tail -n1
  exit "${PIPESTATUS[0]}"
fi

F32="$DIR/$NAME-F32.gguf"
[ -f "$F32" ] || { echo "error: $F32 not found; run scripts/setup-model.sh first" >&2; exit 1; }

if [ -n "${KWK_LLAMA_CPP_DIR:-}" ] && [ -x "$KWK_LLAMA_CPP_DIR/llama-quantize" ]; then
  BIN="$KWK_LLAMA_CPP_DIR"
else
  BIN="$("$HERE/setup-llama-cpp.sh" | tail -n1)"
fi
QUANTIZE="$BIN/llama-quantize"
IMATRIX="$BIN/llama-imatrix"
[ -x "$QUANTIZE" ] || { echo "error: $QUANTIZE not found; run scripts/setup-llama-cpp.sh" >&2; exit 1; }
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Clear llama.cpp's environment overrides so they cannot change the output.
for v in $(env | grep -o '^LLAMA_ARG_[A-Za-z0-9_]*' || true); do unset "$v"; done

quantize() { # in out type
  local in="$1" out="$2" type="$3"
  if [ -f "$out" ] && [ "$out" -nt "$in" ]; then
    echo "present: $out" >&2
    return 0
  fi
  echo "making $out ($type)" >&2
  rm -f "$out.tmp"
  if ! "$QUANTIZE" "$in" "$out.tmp" "$type" >"$out.log" 2>&1; then
    tail -n 20 "$out.log" >&2
    echo "error: llama-quantize failed making $out (log: $out.log)" >&2
    rm -f "$out.tmp"
    exit 1
  fi
  mv "$out.tmp" "$out"
}

CALIB_DIR="$CACHE/calib"
CALIB="$CALIB_DIR/wiki-test-tail-120k.txt"
TEXT="$HERE/../datasets/wikitext-2-raw/wiki.test.raw"
if [ ! -f "$CALIB" ]; then
  mkdir -p "$CALIB_DIR"
  tail -c 120000 "$TEXT" > "$CALIB.tmp" && mv "$CALIB.tmp" "$CALIB"
fi

imatrix_quantize() { # in out
  local in="$1" out="$2" mat="${2%.gguf}.imatrix"
  if [ -f "$out" ] && [ "$out" -nt "$in" ] && [ "$out" -nt "$CALIB" ]; then
    echo "present: $out" >&2
    return 0
  fi
  echo "making $out (Q4_K_M, importance matrix from $CALIB)" >&2
  rm -f "$mat.tmp.gguf" "$out.tmp"
  if ! "$IMATRIX" -m "$in" -f "$CALIB" -o "$mat.tmp.gguf" -c 512 -t "$(nproc)" >"$out.log" 2>&1 \
     || ! "$QUANTIZE" --imatrix "$mat.tmp.gguf" "$in" "$out.tmp" Q4_K_M >>"$out.log" 2>&1; then
    tail -n 20 "$out.log" >&2
    echo "error: llama-imatrix/llama-quantize failed making $out (log: $out.log)" >&2
    rm -f "$mat.tmp.gguf" "$out.tmp"
    exit 1
  fi
  mv "$mat.tmp.gguf" "$mat"
  mv "$out.tmp" "$out"
}

make_copy() { # make-offgrid.py arguments: one copy and its quantizations
  local copy stem t
  copy="$("$PY" "$HERE/make-offgrid.py" "$F32" "$@" | tail -n1)"
  [ -f "$copy" ] || { echo "error: make-offgrid.py did not produce $copy" >&2; exit 1; }
  stem="${copy%-F32.gguf}"
  for t in "${DERIVED_TYPES[@]}"; do
    quantize "$copy" "$stem-$t.gguf" "$t"
  done
  imatrix_quantize "$copy" "$stem-Q4_K_M-imatrix.gguf"
}

if [ "${1:-}" = "--heldout" ]; then
  # A held-out copy for checking that nothing was tuned to the copies above: another seed
  # and outlier spread, never used while developing (issue 7's "models kept outside").
  seed="${2:?usage: setup-offgrid.sh --heldout SEED [FRACTION] [LO:HI]}"
  frac="${3:-0.03}"
  spread="${4:-6:12}"
  make_copy --variant rot-outlier --seed "$seed" --outlier-frac "$frac" \
    --outlier-spread "$spread" --name "$NAME-heldout-s$seed"
elif [ "${1:-}" = "--wide-seed" ]; then
  # Another widened copy, for checking on a rotation nobody tuned on what the seed-3 copy
  # shows (the ladder's frontier at every size).
  seed="${2:-}"
  case "$seed" in
    ''|*[!0-9]*) echo "error: --wide-seed takes a seed, a non-negative integer (got '$seed'); usage: scripts/setup-offgrid.sh --wide-seed SEED" >&2; exit 2 ;;
  esac
  make_copy --variant wide --seed "$seed" --name "$NAME-offgrid-wide-s$seed"
  "$PY" "$HERE/make-hf-folder.py" "$DIR/$NAME-offgrid-wide-s$seed-F32.gguf" >/dev/null
else
  for variant in "${VARIANTS[@]}"; do
    make_copy --variant "$variant"
  done
  "$PY" "$HERE/make-hf-folder.py" "$DIR/$NAME-offgrid-wide-F32.gguf" >/dev/null
fi

echo "$DIR"
