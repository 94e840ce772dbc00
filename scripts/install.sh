#!/usr/bin/env bash
# Installs Themisto for a CPU machine into ./.venv: the sandbox tool (bubblewrap) when we can install system
# packages, then the pinned Python requirements and the package itself; and the replay kernel's own environment
# (the participants' 2023 stack, requirements-kernel.txt) into ./.venv-kernel. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null
  else
    echo "warning: bubblewrap (bwrap) is missing; kernels will run without filesystem/network isolation." >&2
    echo "         install it with: sudo apt-get install bubblewrap" >&2
  fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -e .

# The replay kernel's environment: wheels only (no source builds of 2023 releases), in a venv git leaves alone.
[ -x .venv-kernel/bin/python ] || "$PY" -m venv .venv-kernel
[ -f .venv-kernel/.gitignore ] || echo '*' > .venv-kernel/.gitignore
.venv-kernel/bin/python -m pip install -q --disable-pip-version-check --only-binary=:all: -r requirements-kernel.txt
