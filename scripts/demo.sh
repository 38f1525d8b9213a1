#!/usr/bin/env bash
# The whole path on the shipped ML-100K data: prepare, train, evaluate, export, serve, recommend, benchmark.
set -euo pipefail
out=${1:-runs/demo}
rs=".venv/bin/recserve"
mkdir -p "$out"
$rs data ml-100k --out "$out/data"
