#!/usr/bin/env bash
# Build llama.cpp's `llama-server` once per environment, from the llama.cpp tree that PyPI's
# llama-cpp-python sdist vendors (a package registry, pinned by version), into $VENV/bin/llama-server.
#
# The built binary is cached under ~/.cache/storybias/llama-server/<key>/, the key being the sdist's
# sha256 and this machine's CPU (GGML_NATIVE=ON tunes the binary to the CPU it is built on), so a rebuilt
# environment reuses it in a second. Prints the build's wall time.
#
#   scripts/build-llama-server.sh [VENV]       (VENV defaults to .venv)
#   LLAMA_CPP_PYTHON_VERSION=0.3.36 JOBS=2 STORYBIAS_CACHE=~/.cache/storybias
set -euo pipefail

VENV=${1:-.venv}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
JOBS=${JOBS:-2}
CACHE_ROOT=${STORYBIAS_CACHE:-$HOME/.cache/storybias}/llama-server
TARGET="$VENV/bin/llama-server"

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "build-llama-server: no Python environment at $VENV (run make venv first)" >&2
    exit 2
fi
for tool in cmake c++ tar sha256sum; do
    command -v "$tool" >/dev/null || { echo "build-llama-server: '$tool' is needed to build llama-server" >&2; exit 2; }
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# pip's own HTTP cache makes a second download of the same sdist free.
"$VENV/bin/python" -m pip download --quiet --no-binary llama-cpp-python --no-deps --dest "$WORK" \
    "llama-cpp-python==$VERSION"
SDIST=$(ls "$WORK"/llama_cpp_python-"$VERSION".tar.gz)
SDIST_SHA=$(sha256sum "$SDIST" | cut -c1-16)
CPU_SHA=$( (uname -m; grep -m1 '^model name' /proc/cpuinfo || true; grep -m1 '^flags' /proc/cpuinfo || true) \
    | sha256sum | cut -c1-8)
CACHED="$CACHE_ROOT/$VERSION-$SDIST_SHA-$CPU_SHA/llama-server"

if [[ ! -x "$CACHED" ]]; then
    START=$(date +%s)
    tar -xzf "$SDIST" -C "$WORK"
    SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
    [[ -f "$SRC/CMakeLists.txt" ]] || { echo "build-llama-server: no vendor/llama.cpp in $SDIST" >&2; exit 2; }
    cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=ON >"$WORK/cmake.log"
    cmake --build "$WORK/build" --target llama-server -j"$JOBS" >"$WORK/build.log" 2>&1 \
        || { tail -40 "$WORK/build.log" >&2; exit 1; }
    mkdir -p "$(dirname "$CACHED")"
    cp "$WORK/build/bin/llama-server" "$CACHED.tmp" && mv "$CACHED.tmp" "$CACHED"
    echo "build-llama-server: built llama-server from llama-cpp-python $VERSION in $(( $(date +%s) - START )) s" \
        "($JOBS jobs) -> $CACHED"
else
    echo "build-llama-server: reusing $CACHED"
fi
install -m 0755 "$CACHED" "$TARGET"
"$TARGET" --version 2>&1 | grep -m1 -i version || true
echo "build-llama-server: installed $TARGET"
