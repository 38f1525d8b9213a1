#!/usr/bin/env bash
# Debian's prometheus package (the server and promtool) for the monitoring tests, unless promtool is there.
# Only `make test` runs it (it needs root or sudo); `make demo` never uses Prometheus.
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "promtool and prometheus are missing and apt-get is not available: install Prometheus 2.x yourself" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  if ! sudo -n true 2>/dev/null; then
    echo "promtool and prometheus are missing, and installing Debian's prometheus needs root: run" \
         "'sudo apt-get install prometheus' once, or put Prometheus 2.x's promtool and prometheus on PATH" >&2
    exit 1
  fi
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -q --no-install-recommends prometheus >/dev/null \
  || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends prometheus >/dev/null; }
promtool --version | head -n 1
