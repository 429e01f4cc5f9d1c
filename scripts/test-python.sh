#!/usr/bin/env bash
# The Python package's tests (python/tests): a virtualenv kept under the cache folder
# (KWK_PYTHON_VENV, default $KWK_CACHE/python-venv, docs/paths.md) with maturin, pytest, numpy, torch and
# transformers from PyPI (python/requirements-test.txt; reruns find them installed), the
# kwk wheel built from python/ with maturin and installed into it, then pytest. The fixture
# models and the kwk-eval binary the tests compare with are built here (release).
# Prints the seconds each step took.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${KWK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kwk}"
VENV="${KWK_PYTHON_VENV:-$CACHE/python-venv}"
PYTHON="${PYTHON:-python3}"
step() { echo "test-python: $1 took $(( SECONDS - $2 )) s"; }

t=$SECONDS
if [ ! -x "$VENV/bin/python" ]; then
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q -r python/requirements-test.txt
# What llama.cpp's convert_hf_to_gguf.py needs besides (sentencepiece, ...): the model-folder
# tests run it (tests/test_model_folders.py).
KWK_PYTHON_VENV="$VENV" bash scripts/setup-convert.sh >/dev/null
step "installing maturin, pytest, torch, transformers and the converter's packages" "$t"

t=$SECONDS
WHEELS="$(mktemp -d)"
trap 'rm -rf "$WHEELS"' EXIT
"$VENV/bin/maturin" build --release -q -m python/Cargo.toml --out "$WHEELS"
"$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$WHEELS"/kwk-*.whl
step "building and installing the kwk wheel" "$t"

t=$SECONDS
KWK_FIXTURES_DIR="$(cargo run -q --release -p kwk-fixtures)"
cargo build -q --release --bin kwk-eval
TARGET_DIR="$(cargo metadata --format-version 1 --no-deps | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
export KWK_FIXTURES_DIR KWK_EVAL_BIN="$TARGET_DIR/release/kwk-eval"
step "building the fixtures and kwk-eval" "$t"

t=$SECONDS
# From the tests folder, so `import kwk` is the installed wheel, not python/kwk's sources.
(cd python/tests && "$VENV/bin/python" -m pytest -q -p no:cacheprovider .)
step "pytest" "$t"
