#!/usr/bin/env bash
# Installs perf_analyzer (the C++ binary inside the tritonclient 2.41.0 wheel; later wheels dropped it) into
# tools/, beside the newer tritonclient that nvidia-pytriton needs, with the two libraries it loads
# (copies of both ship in nvidia_pytriton.libs). Usage: scripts/install_perf_analyzer.sh [PYTHON]
set -euo pipefail
py=${1:-.venv/bin/python}
dest=tools/perf_analyzer
[ -x "$dest/perf_analyzer" ] && exit 0
libs=$("$py" -c 'import importlib.util, pathlib; s = importlib.util.find_spec("pytriton"); print(pathlib.Path(next(iter(s.submodule_search_locations))).parent / "nvidia_pytriton.libs")')
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$py" -m pip download -q --no-deps --only-binary=:all: -d "$work" tritonclient==2.41.0
mkdir -p "$dest"
"$py" - "$work"/tritonclient-2.41.0-*.whl "$dest/perf_analyzer" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open("tritonclient-2.41.0.data/data/bin/perf_analyzer") as binary:
    with open(sys.argv[2], "wb") as out:
        shutil.copyfileobj(binary, out)
PY
chmod +x "$dest/perf_analyzer"
cp "$(ls "$libs"/libb64-*.so.0d)" "$dest/libb64.so.0d"
cp "$(ls "$libs"/libcudart-*.so.12*)" "$dest/libcudart.so.12"
LD_LIBRARY_PATH="$dest" "$dest/perf_analyzer" --version >/dev/null 2>&1 || LD_LIBRARY_PATH="$dest" "$dest/perf_analyzer" --help >/dev/null 2>&1 || true
echo "perf_analyzer installed in $dest"
