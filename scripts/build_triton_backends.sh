#!/usr/bin/env bash
# Builds Triton's native PyTorch and ONNX Runtime backends (r24.10, the release of the bundled server
# 2.51) from source, offline, against the torch and onnxruntime installed in the given Python, into
# build/triton-backends/{pytorch,onnxruntime}/. The server loads them from recserve's backend folder beside
# the python backend (serving.triton.launcher). Sources: $TRITON_NATIVE_SRC/triton-r24.10-src.tar.gz and
# onnxruntime-1.29-c-api-headers.tar.gz (default ../shared/triton-native). About 45 s on 2 cores; Debian's
# rapidjson-dev and patchelf are installed when missing, or unpacked from the .deb files in
# $TRITON_NATIVE_DEBS on a machine without network (apt-get download rapidjson-dev patchelf).
# TRITON_BACKENDS_GPU=1 builds only the PyTorch backend, with CUDA (for the GPU machine, against its torch).
# Usage: scripts/build_triton_backends.sh [PYTHON]   (default .venv/bin/python)
set -euo pipefail
py=${1:-.venv/bin/python}
src=${TRITON_NATIVE_SRC:-../shared/triton-native}
out=${TRITON_BACKENDS_OUT:-build/triton-backends}
if [ -f "$out/pytorch/libtriton_pytorch.so" ] \
   && { [ -f "$out/onnxruntime/libtriton_onnxruntime.so" ] || [ "${TRITON_BACKENDS_GPU:-0}" = 1 ]; }; then exit 0; fi
if [ ! -f "$src/triton-r24.10-src.tar.gz" ]; then
  # not fatal: everything but the native-backend tests runs without it (they say they were skipped)
  echo "warning: no $src/triton-r24.10-src.tar.gz, the native backends are not built;" \
       "set TRITON_NATIVE_SRC to the folder holding Triton's r24.10 sources" >&2
  exit 0
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
if [ -n "${TRITON_NATIVE_DEBS:-}" ]; then
  # offline: the packages' files unpacked into the work folder, used from there
  for deb in "$TRITON_NATIVE_DEBS"/*.deb; do dpkg -x "$deb" "$work/debs"; done
  export PATH="$work/debs/usr/bin:$PATH"
  extra_flags="-isystem $work/debs/usr/include"
else
  missing=""
  for pkg in rapidjson-dev patchelf; do dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"; done
  if [ -n "$missing" ]; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get install -y -q --no-install-recommends $missing >/dev/null \
      || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends $missing >/dev/null; }
  fi
  extra_flags=""
fi
tar -xzf "$src/triton-r24.10-src.tar.gz" -C "$work"
gpu=OFF
if [ "${TRITON_BACKENDS_GPU:-0}" = 1 ]; then
  gpu=ON
  # nvcc 13 refuses the oldest architectures the backend library lists; Hopper is what the GPU machine has
  sed -i 's/CUDA_ARCHITECTURES "53;[^"]*"/CUDA_ARCHITECTURES "90-real"/' "$work/backend/CMakeLists.txt"
  # newer g++ warns inside rapidjson and in the ONNX Runtime backend (both builds are -Werror)
  extra_flags="$extra_flags -Wno-error=deprecated-declarations -Wno-error=maybe-uninitialized"
fi
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
# the server's libraries (TRITON_SERVER_LIBS where the server is not pip-installed, as on the GPU machine)
libs=${TRITON_SERVER_LIBS:-$("$py" -c 'import os, pytriton; print(os.path.join(os.path.dirname(os.path.dirname(pytriton.__file__)), "nvidia_pytriton.libs"))')}
fetch=(-DFETCHCONTENT_FULLY_DISCONNECTED=ON "-DFETCHCONTENT_SOURCE_DIR_REPO-COMMON=$work/common"
       "-DFETCHCONTENT_SOURCE_DIR_REPO-CORE=$work/core" "-DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND=$work/backend"
       "-DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=$work/gtest" "-DPython3_INCLUDE_DIR=$pyinc"
       "-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=$abi $extra_flags" -DCMAKE_BUILD_TYPE=Release "-DTRITON_ENABLE_GPU=$gpu")
server=$(ls "$libs"/libtritonserver-*.so)

# build NAME TARGET CMAKE-ARGS...: configure and build one backend, patch its library, copy it into $out/NAME
build() {
  local name=$1 target=$2; shift 2
  cmake -S "$work/${name}_backend" -B "$work/build-$name" "${fetch[@]}" "$@" > "$work/configure-$name.log" 2>&1 \
    || { tail -n 40 "$work/configure-$name.log" >&2; exit 1; }
  make -C "$work/build-$name" -j "$(nproc)" "$target" > "$work/build-$name.log" 2>&1 \
    || { tail -n 40 "$work/build-$name.log" >&2; exit 1; }
  local lib
  lib=$(find "$work/build-$name" -name "libtriton_$name.so" | head -n 1)
  patchelf --replace-needed libtritonserver.so "$(basename "$server")" "$lib"
  mkdir -p "$out/$name"
  cp "$lib" "$out/$name/libtriton_$name.so"
}

build pytorch triton-pytorch-backend -DTRITON_PYTORCH_ENABLE_TORCHVISION=OFF -DTRITON_PYTORCH_ENABLE_TORCHTRT=OFF \
  -DTRITON_ENABLE_NVTX=OFF "-DTRITON_PYTORCH_INCLUDE_PATHS=$torch/include;$torch/include/torch/csrc/api/include" \
  "-DTRITON_PYTORCH_LIB_PATHS=$torch/lib"
patchelf --set-rpath "\$ORIGIN:$torch/lib:$libs" "$out/pytorch/libtriton_pytorch.so"
echo "built $out/pytorch against torch $("$py" -c 'import torch; print(torch.__version__)')"
if [ "$gpu" = ON ]; then  # the native layout on GPUs is TorchScript; ONNX Runtime here is CPU-only
  exit 0
fi

ort=$("$py" -c 'import glob, os, onnxruntime; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so.1.*"))[0])' 2>/dev/null || true)
if [ -z "$ort" ] || [ ! -f "$src/onnxruntime-1.29-c-api-headers.tar.gz" ]; then
  echo "warning: no onnxruntime in $py or no ONNX Runtime headers in $src: the onnxruntime backend is not built" >&2
  exit 0
fi
mkdir -p "$work/ort-headers" "$work/ort-lib"
tar -xzf "$src/onnxruntime-1.29-c-api-headers.tar.gz" -C "$work/ort-headers" --strip-components=1
ln -s "$ort" "$work/ort-lib/libonnxruntime.so"
build onnxruntime triton-onnxruntime-backend "-DTRITON_ONNXRUNTIME_INCLUDE_PATHS=$work/ort-headers" \
  "-DTRITON_ONNXRUNTIME_LIB_PATHS=$work/ort-lib" -DTRITON_ENABLE_ONNXRUNTIME_TENSORRT=OFF \
  -DTRITON_ENABLE_ONNXRUNTIME_OPENVINO=OFF
ln -sf "$ort" "$out/onnxruntime/libonnxruntime.so.1"
patchelf --set-rpath "\$ORIGIN:$libs" "$out/onnxruntime/libtriton_onnxruntime.so"
echo "built $out/onnxruntime against onnxruntime $("$py" -c 'import onnxruntime; print(onnxruntime.__version__)')"
