#!/usr/bin/env bash
# Checks that the off-grid copies made by scripts/setup-offgrid.sh compute the same function
# as the model they come from: float32 perplexity on wikitext-2 (ctx 512, the first N chunks)
# equal to the original's within 1e-4 relative, measured by kwk-eval's float32 runner and by
# llama.cpp's llama-perplexity (f32 KV cache) on each F32 GGUF. Exit 1 on a mismatch.
#
#   scripts/check-offgrid.sh [CHUNKS]     # default 20 chunks; 12 minutes on 2 busy cores (with the build)
set -euo pipefail
cd "$(dirname "$0")/.."

CHUNKS="${1:-20}"
TOL="1e-4"
NAME="SmolLM2-135M-Instruct"
VARIANTS=(rot rot-outlier wide)
TEXT="datasets/wikitext-2-raw/wiki.test.raw"
PY="${PYTHON:-python3}"

BIN="$(bash scripts/setup-llama-cpp.sh | tail -n 1)"
DIR="$(KWK_LLAMA_CPP_DIR="$BIN" bash scripts/setup-model.sh | tail -n 1)"
cargo build --release --bin kwk-eval
EVAL="${CARGO_TARGET_DIR:-target}/release/kwk-eval"
threads="${KWK_THREADS:-$(nproc)}"
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for v in $(env | grep -o '^LLAMA_ARG_[A-Za-z0-9_]*' || true); do unset "$v"; done

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

kwk_ppl() { # gguf tag
  "$EVAL" --llm "$1" --text "$TEXT" --formats float32 --no-speed --chunks "$CHUNKS" \
    --threads "$threads" --out "$WORK/$2" >"$WORK/$2.log" 2>&1 ||
    { tail -n 20 "$WORK/$2.log" >&2; echo "error: kwk-eval failed on $1" >&2; exit 1; }
  "$PY" -c 'import json,sys; print(repr(json.load(open(sys.argv[1]))["runners"][0]["ppl"]))' \
    "$WORK/$2/results.json"
}

llama_ppl() { # gguf tag
  "$BIN/llama-perplexity" -m "$1" -f "$TEXT" -c 512 --chunks "$CHUNKS" -b 512 \
    -ctk f32 -ctv f32 -t "$threads" >"$WORK/$2.llama.log" 2>&1 ||
    { tail -n 20 "$WORK/$2.llama.log" >&2; echo "error: llama-perplexity failed on $1" >&2; exit 1; }
  local p
  p="$(grep -a 'Final estimate' "$WORK/$2.llama.log" | sed -E 's/.*PPL = ([0-9.]+).*/\1/')"
  [ -n "$p" ] || { echo "error: no 'Final estimate' in llama-perplexity's output on $1" >&2; exit 1; }
  echo "$p"
}

ref="$DIR/$NAME-F32.gguf"
ref_kwk="$(kwk_ppl "$ref" orig)"
ref_llama="$(llama_ppl "$ref" orig)"
echo "original    kwk float32 $ref_kwk   llama.cpp F32 $ref_llama"
status=0
for variant in "${VARIANTS[@]}"; do
  f="$DIR/$NAME-offgrid-$variant-F32.gguf"
  [ -f "$f" ] || { echo "error: $f not found; run scripts/setup-offgrid.sh" >&2; exit 1; }
  k="$(kwk_ppl "$f" "$variant")"
  l="$(llama_ppl "$f" "$variant")"
  if ! "$PY" - "$variant" "$ref_kwk" "$k" "$ref_llama" "$l" "$TOL" <<'EOF'; then status=1; fi
import sys
name, rk, k, rl, l, tol = sys.argv[1], *map(float, sys.argv[2:])
dk, dl = abs(k - rk) / rk, abs(l - rl) / rl
ok = dk <= tol and dl <= tol
print(f"{name:<11} kwk float32 {k!r} (rel diff {dk:.2e})   llama.cpp F32 {l} (rel diff {dl:.2e})"
      f"   {'ok' if ok else f'MISMATCH (> {tol})'}")
sys.exit(0 if ok else 1)
EOF
done
exit "$status"
