#!/usr/bin/env bash
# Builds Triton's native PyTorch backend (r24.10, the release of the bundled server 2.51) from source,
# offline, against the torch installed in the given Python, into build/triton-backends/pytorch/. The
# server loads it from recserve's backend folder beside the python backend (serving.triton.launcher).
# Sources: $TRITON_NATIVE_SRC/triton-r24.10-src.tar.gz (default ../shared/triton-native). About 30 s on
# 2 cores; Debian's rapidjson-dev and patchelf are installed when missing.
# Usage: scripts/build_triton_backends.sh [PYTHON]   (default .venv/bin/python)
set -euo pipefail
py=${1:-.venv/bin/python}
src=${TRITON_NATIVE_SRC:-../shared/triton-native}
out=${TRITON_BACKENDS_OUT:-build/triton-backends}
if [ -f "$out/pytorch/libtriton_pytorch.so" ]; then exit 0; fi
if [ ! -f "$src/triton-r24.10-src.tar.gz" ]; then
  # not fatal: everything but the native-backend tests runs without it (they say they were skipped)
  echo "warning: no $src/triton-r24.10-src.tar.gz, the native backends are not built;" \
       "set TRITON_NATIVE_SRC to the folder holding Triton's r24.10 sources" >&2
  exit 0
fi
missing=""
for pkg in rapidjson-dev patchelf; do dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"; done
if [ -n "$missing" ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get install -y -q --no-install-recommends $missing >/dev/null \
    || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends $missing >/dev/null; }
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
tar -xzf "$src/triton-r24.10-src.tar.gz" -C "$work"
# common/ fetches googletest for its own tests whatever the options: an empty stand-in
mkdir -p "$work/gtest"
cat > "$work/gtest/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.17)
project(googletest-standin)
foreach(target gtest gtest_main gmock gmock_main)
  add_library(${target} INTERFACE)
  add_library(GTest::${target} ALIAS ${target})
endforeach()
CMAKE
torch=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
abi=$("$py" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
pyinc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
libs=$("$py" -c 'import os, pytriton; print(os.path.join(os.path.dirname(os.path.dirname(pytriton.__file__)), "nvidia_pytriton.libs"))')
cmake -S "$work/pytorch_backend" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DTRITON_ENABLE_GPU=OFF -DTRITON_PYTORCH_ENABLE_TORCHVISION=OFF -DTRITON_PYTORCH_ENABLE_TORCHTRT=OFF \
  -DTRITON_ENABLE_NVTX=OFF \
  "-DTRITON_PYTORCH_INCLUDE_PATHS=$torch/include;$torch/include/torch/csrc/api/include" \
  "-DTRITON_PYTORCH_LIB_PATHS=$torch/lib" -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
  "-DFETCHCONTENT_SOURCE_DIR_REPO-COMMON=$work/common" "-DFETCHCONTENT_SOURCE_DIR_REPO-CORE=$work/core" \
  "-DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND=$work/backend" "-DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=$work/gtest" \
  "-DPython3_INCLUDE_DIR=$pyinc" "-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=$abi" > "$work/configure.log"
make -C "$work/build" -j "$(nproc)" triton-pytorch-backend > "$work/build.log" 2>&1 \
  || { tail -n 40 "$work/build.log" >&2; exit 1; }
lib=$(find "$work/build" -name libtriton_pytorch.so | head -n 1)
server=$(ls "$libs"/libtritonserver-*.so)
patchelf --replace-needed libtritonserver.so "$(basename "$server")" "$lib"
patchelf --set-rpath "\$ORIGIN:$torch/lib:$libs" "$lib"
mkdir -p "$out/pytorch"
cp "$lib" "$out/pytorch/libtriton_pytorch.so"
echo "built $out/pytorch/libtriton_pytorch.so against torch $("$py" -c 'import torch; print(torch.__version__)')"
