#!/usr/bin/env bash
# Builds llama.cpp's command-line tools (llama-perplexity, llama-bench, llama-quantize,
# llama-tokenize, llama-imatrix, llama-completion) from the llama.cpp tree vendored in the llama-cpp-python source
# distribution on PyPI, at a pinned version. Idempotent: a finished build is reused.
#
#   scripts/setup-llama-cpp.sh            # prints the bin directory on the last line
#   scripts/setup-llama-cpp.sh --isa avx2 # a second build limited to AVX2 (see below)
#
# Result: $KWK_CACHE/llama.cpp-<version>/build/bin (KWK_CACHE defaults to
# ${XDG_CACHE_HOME:-~/.cache}/kwk). Point kwk-eval at it with --llama-cpp-dir or
# KWK_LLAMA_CPP_DIR.
#
# --isa TIER (or KWK_LLAMA_ISA=TIER) builds the same source again into build-TIER, with
# llama.cpp's kernels limited to what a CPU of kwk's tier TIER has, so a run with
# KWK_ISA=TIER compares the two engines on the same instructions, as on a CPU that really
# lacks the others (llama.cpp's default build takes the best this CPU has):
#   native    -march=native (the default; also `vnni` and `amx`)
#   avx512bw  AVX-512 F/CD/VL/DQ/BW + AVX2/FMA/F16C/BMI2, no VNNI, no BF16 (Skylake-SP)
#   avxvnni   AVX2/FMA/F16C/BMI2 + AVX-VNNI (Alder Lake)
#   avx2      AVX2/FMA/F16C/BMI2 (Haswell, Zen 1-3)
#   scalar    no -m flags: the x86-64 baseline (SSE2), as kwk's scalar tier
set -euo pipefail

ISA="${KWK_LLAMA_ISA:-native}"
while [ $# -gt 0 ]; do
  case "$1" in
    --isa) ISA="${2:?--isa takes a tier: native, avx512bw, avxvnni, avx2 or scalar}"; shift 2 ;;
    --isa=*) ISA="${1#--isa=}"; shift ;;
    *) echo "setup-llama-cpp.sh: unknown argument '$1' (use --isa TIER)" >&2; exit 2 ;;
  esac
done
# llama.cpp's CMake switches per tier; with GGML_NATIVE=OFF its x86 defaults are SSE4.2,
# AVX, AVX2, BMI2, FMA and F16C on, AVX-512 and the VNNI extensions off.
case "$ISA" in
  native | vnni | amx) ISA=native; ISA_FLAGS=(-DGGML_NATIVE=ON) ;;
  avx512bw) ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX512=ON) ;;
  avxvnni) ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX_VNNI=ON) ;;
  avx2) ISA_FLAGS=(-DGGML_NATIVE=OFF) ;;
  scalar) ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_SSE42=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF
    -DGGML_BMI2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF) ;;
  *) echo "setup-llama-cpp.sh: unknown tier '$ISA' (native, avx512bw, avxvnni, avx2 or scalar)" >&2
    exit 2 ;;
esac

VERSION="${KWK_LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${KWK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kwk}"
ROOT="$CACHE/llama.cpp-$VERSION"
if [ "$ISA" = native ]; then
  BUILD="$ROOT/build"
  STAMP_FILE="$ROOT/.build-complete"
else
  BUILD="$ROOT/build-$ISA"
  STAMP_FILE="$ROOT/.build-complete-$ISA"
fi
BIN="$BUILD/bin"
TOOLS=(llama-perplexity llama-bench llama-quantize llama-tokenize llama-imatrix llama-completion)

# Bumped when the patches below change, so an older build is rebuilt.
BUILD_STAMP="log-flush-1+amx-tilecfg-1"

have_all() {
  for t in "${TOOLS[@]}"; do [ -x "$BIN/$t" ] || return 1; done
  [ -f "$STAMP_FILE" ] && [ "$(cat "$STAMP_FILE")" = "$BUILD_STAMP" ]
}

if have_all; then
  echo "llama.cpp tools already built ($ISA)" >&2
  echo "$BIN"
  exit 0
fi

mkdir -p "$CACHE"
PY="${PYTHON:-python3}"
# shellcheck source=lib/step.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/step.sh"

# cmake and ninja from PyPI when the machine lacks them.
if ! command -v cmake >/dev/null 2>&1 || ! command -v ninja >/dev/null 2>&1; then
  kwk_step "installing cmake and ninja from PyPI" "$CACHE/logs/pip-cmake-ninja.log" \
    "$PY" -m pip install cmake ninja
  hash -r
fi

SDIST_DIR="$CACHE/sdist"
mkdir -p "$SDIST_DIR"
SDIST="$SDIST_DIR/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  kwk_step "downloading llama-cpp-python $VERSION's source distribution (llama.cpp inside) from PyPI" \
    "$CACHE/logs/pip-llama-cpp-python.log" \
    "$PY" -m pip download --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$VERSION" -d "$SDIST_DIR"
fi

if [ ! -f "$ROOT/src/CMakeLists.txt" ]; then
  rm -rf "$ROOT.tmp"
  mkdir -p "$ROOT.tmp"
  tar -xzf "$SDIST" -C "$ROOT.tmp"
  rm -rf "$ROOT"
  mkdir -p "$ROOT"
  mv "$ROOT.tmp/llama_cpp_python-$VERSION/vendor/llama.cpp" "$ROOT/src"
  rm -rf "$ROOT.tmp"
fi

# Patch: llama-perplexity prints its results (`Final estimate`, the KL-divergence
# statistics) through common/log's asynchronous logger, which is leaked at exit (llama.cpp
# PR 22273), so on a busy machine the last lines are often lost while the exit code is 0
# (seen in 20-60% of runs here). common/log.h says to call common_log_flush() before exit;
# llama-perplexity does not, so we add that call before its final `return 0;`. Output and
# numerics are otherwise unchanged. Skipped with a warning if the source does not match.
"${PYTHON:-python3}" - "$ROOT/src/tools/perplexity/perplexity.cpp" <<'PYEOF' >&2
import sys
path = sys.argv[1]
src = open(path).read()
flush = "common_log_flush(common_log_main());"
anchor = "    llama_backend_free();\n\n    return 0;\n}\n"
if flush in src:
    print("llama-perplexity log-flush patch already applied")
elif src.count(anchor) == 1 and src.endswith(anchor):
    src = src[: -len(anchor)] + "    llama_backend_free();\n\n    " + flush + "\n\n    return 0;\n}\n"
    open(path, "w").write(src)
    print("applied the llama-perplexity log-flush patch")
else:
    print("warning: could not apply the llama-perplexity log-flush patch (source differs); "
          "kwk-eval retries runs whose output is cut short")
PYEOF

# Patch: on CPUs with AMX (Sapphire Rapids, Granite Rapids), -march=native builds ggml's AMX
# matmuls for Q4_0/Q4_1/Q8_0/Q4_K/... prompts. Its per-thread tile set-up fills a tile
# configuration on the stack and passes it to _tile_loadconfig; with GCC 12 here the stores
# were dropped, the configuration loaded was not the one written, and the first tile
# instruction faulted: every quantized GGUF crashed llama-perplexity and llama-bench with
# SIGILL or SIGSEGV (seen on a 2-core Intel Xeon with amx_int8, 2026-12-02; llama.cpp PR
# 26954 reports the same and moves the configuration to read-only data). We make the
# configuration a static constant with the same palette, rows and column bytes, so the AMX
# kernels run as llama.cpp intends. Numerics unchanged; no effect on CPUs without AMX.
"${PYTHON:-python3}" - "$ROOT/src/ggml/src/ggml-cpu/amx/mmq.cpp" <<'PYEOF' >&2
import re, sys
path = sys.argv[1]
src = open(path).read()
marker = "alignas(64) static const tile_config_t tc = {"
pattern = re.compile(
    r"    alignas\(64\) tile_config_t tc = \{\};\n"
    r"    tc\.palette_id = 1;\n    tc\.start_row = 0;\n"
    r"((?:    tc\.rows\[\d\] = \d+; +tc\.colsb\[\d\] = \d+;\n){8})"
)
if marker in src:
    print("llama.cpp AMX tile-config patch already applied")
else:
    found = pattern.findall(src)
    if len(found) != 1:
        print("warning: could not apply the llama.cpp AMX tile-config patch (source differs)")
        sys.exit(0)
    pairs = re.findall(r"tc\.rows\[(\d)\] = (\d+); +tc\.colsb\[\d\] = (\d+);", found[0])
    rows = ", ".join(r for _, r, _ in sorted(pairs))
    colsb = ", ".join(c for _, _, c in sorted(pairs))
    new = ("    " + marker + "\n        1, 0, {0},\n        {" + colsb + "},\n        {"
           + rows + "},\n    };\n")
    src = pattern.sub(lambda _m: new, src, count=1)
    open(path, "w").write(src)
    print("applied the llama.cpp AMX tile-config patch")
PYEOF

JOBS="$(nproc 2>/dev/null || echo 2)"
# Compiler output (hundreds of warnings) goes to log files beside the build; the screen gets
# one line per stage, a progress line every 20 s and each stage's time.
kwk_step "configuring llama.cpp ($ISA) in $BUILD" "$BUILD.configure.log" \
  cmake -S "$ROOT/src" -B "$BUILD" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release "${ISA_FLAGS[@]}" -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_TOOLS=ON
kwk_step "building llama.cpp's tools ($ISA, $JOBS jobs; about 4 min on 2 cores)" "$BUILD.build.log" \
  cmake --build "$BUILD" -j "$JOBS" --target "${TOOLS[@]}"
have_bins=1
for t in "${TOOLS[@]}"; do [ -x "$BIN/$t" ] || have_bins=0; done
if [ "$have_bins" != 1 ]; then
  echo "error: the llama.cpp build finished but tools are missing from $BIN" >&2
  exit 1
fi
echo "$BUILD_STAMP" > "$STAMP_FILE"
echo "$BIN"
