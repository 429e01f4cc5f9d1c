#!/usr/bin/env bash
# Installs the Python that llama.cpp's convert_hf_to_gguf.py needs (kwk-eval's llama.cpp
# ladder converts a Hugging Face folder with it) and prints that python's path on the last
# line. Idempotent: a venv whose recorded requirements match is reused without calling pip.
#
#   scripts/setup-convert.sh            # prints e.g. ~/.cache/kwk/python-venv/bin/python
#
# The venv is the one scripts/test-python.sh keeps (KWK_PYTHON_VENV, default
# $KWK_CACHE/python-venv), so torch and transformers are installed once for both;
# scripts/requirements-convert.txt lists what the converter imports (torch, numpy,
# transformers, safetensors, sentencepiece, protobuf; `gguf` comes from the llama.cpp tree's
# own gguf-py). kwk-eval finds this python as KWK_PYTHON, else $KWK_CACHE/python-venv/bin/python
# (docs/setup.md). The first run downloads torch (about 1 GB or more with its CUDA libraries).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

CACHE="${KWK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kwk}"
VENV="${KWK_PYTHON_VENV:-$CACHE/python-venv}"
PY="${PYTHON:-python3}"
REQ="$HERE/requirements-convert.txt"
STAMP="$VENV/.kwk-requirements-convert.sha256"

# shellcheck source=lib/step.sh
. "$HERE/lib/step.sh"

if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  kwk_step "creating the python venv $VENV" "$CACHE/logs/venv-create.log" "$PY" -m venv "$VENV"
fi

want="$(sha256sum "$REQ" | cut -d' ' -f1)"
# Found without importing them (importing torch and transformers takes seconds).
found='import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("numpy", "torch", "transformers", "safetensors", "sentencepiece", "google.protobuf")))'
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/python" -c "$found" 2>/dev/null; then
  echo "converter python present: $VENV/bin/python" >&2
else
  kwk_step "installing the converter's python packages into $VENV (scripts/requirements-convert.txt)" \
    "$CACHE/logs/pip-convert.log" "$VENV/bin/python" -m pip install -r "$REQ"
  "$VENV/bin/python" -c 'import numpy, torch, transformers, safetensors, sentencepiece, google.protobuf' || {
    echo "error: $VENV/bin/python cannot import what convert_hf_to_gguf.py needs after pip install;" \
      "see $CACHE/logs/pip-convert.log, or delete $VENV and rerun scripts/setup-convert.sh" >&2
    exit 1
  }
  echo "$want" > "$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
fi

echo "$VENV/bin/python"
