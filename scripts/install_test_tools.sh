#!/usr/bin/env bash
# Debian's packages that only the deployment tests use, unless they are there: prometheus (the server and
# promtool) for the monitoring files, redis-tools (redis-cli, in the place of the valkey-cli that the Valkey
# image holds) for the scripts of the store with Sentinels. Only `make test` runs it (it needs root or sudo);
# `make demo` never uses them.
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v redis-cli >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "promtool and prometheus are missing and apt-get is not available: install Prometheus 2.x yourself" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  if ! sudo -n true 2>/dev/null; then
    echo "promtool, prometheus or redis-cli is missing, and installing Debian's packages needs root: run" \
         "'sudo apt-get install prometheus redis-tools' once, or put them on PATH" >&2
    exit 1
  fi
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -q --no-install-recommends prometheus redis-tools >/dev/null \
  || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends prometheus redis-tools >/dev/null; }
promtool --version | head -n 1
redis-cli --version
