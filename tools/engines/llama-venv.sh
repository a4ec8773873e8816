#!/bin/sh
# Builds llama-cpp-python[server] from its sdist into a venv outside the clone (compiling llama.cpp
# takes long on few cores, so the venv is cached across clones and runs). The engine tests find it
# at WARMGATE_LLAMA_VENV (default /var/cache/warmgate-llama) and skip, saying why, without it.
set -eu
VENV="${WARMGATE_LLAMA_VENV:-/var/cache/warmgate-llama}"
PYTHON="${PYTHON:-python3}"
test -f "$VENV/.installed" && exit 0
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# CPU only, no native tuning (the cache may move to another machine of the same arch), no tools.
CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF" \
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
  nice "$VENV/bin/pip" install -q --no-binary llama-cpp-python 'llama-cpp-python[server]>=0.3,<0.4'
touch "$VENV/.installed"
